#!/usr/bin/env python3
"""Build a GPU measurement pack on any machine; no GPU needed.

Half one of measuring on a GPU the way TVM users deploy: compile here, run there. For every
workload and compile flow this builds a Relax VM library for ``cuda:sm_90`` whose CUDA module
is a cubin compiled by nvcc, and saves seeded inputs with onnxruntime's outputs, PyTorch
programs for the micro workloads, TVM's runtime without the compiler, and the Python 3.12
wheel of tvm-ffi. ``gpu_check.sh PACK OUTDIR`` (half two, copied into the pack) runs it on
the GPU machine with the runtime alone.

Layout of a pack::

    manifest.json               what was built, with which tools, and for which device
    libs/<workload>.<flow>.so   exported libraries (tvm.runtime.load_module)
    data/<workload>.npz         small arrays: inputs, onnxruntime's outputs, weights, constants
    onnx/<workload>.onnx        for outputs too large to ship: the model, to rerun onnxruntime
    torch_refs/programs.py      generated PyTorch programs (see gpu_torch_refs.py)
    torch_refs/<workload>.pt2   torch.export of a model workload's module, when the zoo has one
    runtime/tvm/                the tvm package without libtvm_compiler.so (TVM_USE_RUNTIME_LIB=1)
    runtime/wheels/             apache-tvm-ffi for CPython 3.12, typing_extensions
    gpu_check.sh, gpu_check.py, gpu_torch_refs.py
    tuning/<workload>/          with --tune-trials N: tuning candidates (tvm_stitch.tuning.pack),
                                the rules' kernel and the best of --tune-model

How the cubin gets in: TVM 0.27's CUDA codegen hands its source to ``ffi.Module.create.cuda``
when the CUDA runtime library is loaded, which compiles it through the
``tvm_callback_cuda_compile`` global (overridden here to call nvcc for a cubin of the target
arch); otherwise it keeps the source for compiling at load time. The runtime library needs
``libcuda.so.1``; on a machine without a driver a stub with the same symbols, each returning
CUDA_ERROR_NO_DEVICE, satisfies the loader. Nothing calls it while compiling, and nothing of it
ends up in the pack.

Real sizes do not fit 60 MB as data (inputs up to 256 MB, model weights near 1 GB), so any
array over ``--inline-kb`` is replaced, before anything is computed from it, by one regenerated
from a seeded recipe with the same shape, dtype, mean and spread (uniform values; for integers
the same range) that gpu_check rebuilds bit for bit (checked by fingerprint). Weights over
``--embed-mb`` become VM inputs instead of library constants (``"weights": "vm inputs"``), and
outputs over ``--outputs-mb`` are recomputed there with onnxruntime on the CPU.

``--dims NAME=SIZE,...`` (repeatable) packs the model workloads exported with dynamic batch and
sequence axes instead: each is compiled once per flow, and each size is a workload of its own
(``gpt2_block@batch=8,seq=1``) on those libraries, with weights regenerated alike.

``--device cpu`` builds a CPU variant (TVM's default ``llvm`` pipeline, flow
``tvm_default_llvm``) that ``gpu_check.sh`` runs on ``tvm.cpu()``: a self-test of the whole
check without a GPU, not a measurement of our flows.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import datetime
import importlib.metadata
import json
import os
import re
import shutil
import struct
import subprocess
import sys
import tarfile
import tempfile
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import onnx

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
for _path in (HERE, REPO):
    if str(_path) not in sys.path:
        sys.path.insert(0, str(_path))

import gpu_check as check  # noqa: E402
import gpu_torch_refs as refs  # noqa: E402
import tvm  # noqa: E402
import tvm_ffi  # noqa: E402
from tvm.target import Target  # noqa: E402

from tvm_stitch import pipeline  # noqa: E402
from tvm_stitch import workloads as zoo  # noqa: E402
from tvm_stitch.target import DEFAULT_TARGET, parse_target  # noqa: E402

PACK_FORMAT = 1
TVM_FFI_VERSION = "0.1.14.post1"
WHEEL_PYTHON = "3.12"
WHEEL_PLATFORMS = (
    "manylinux_2_28_x86_64",
    "manylinux_2_27_x86_64",
    "manylinux_2_17_x86_64",
    "manylinux2014_x86_64",
)
DEFAULT_WHEEL_DIR = Path(os.environ.get("XDG_CACHE_HOME", "~/.cache")).expanduser() / (
    "tvm-stitch/gpu-pack-wheels"
)
DEFAULT_MAX_MB = 60.0
CPU_FLOW = "tvm_default_llvm"
ARCHIVE_ROOT = "gpu-pack"
# Not "torch": gpu_check.py's folder is on sys.path, where that name would shadow PyTorch.
TORCH_DIR = "torch_refs"
CHECK_FILES = ("gpu_check.sh", "gpu_check.py", "gpu_torch_refs.py")
# Not needed to load a library or run the VM: C++ sources and headers (CUTLASS's included) for
# compiling, the web runtime, bytecode of this interpreter, and the compiler library itself.
RUNTIME_DROP_TOP = frozenset({"3rdparty", "src", "include", "web"})
RUNTIME_DROP_ANY = frozenset({"__pycache__", "libtvm_compiler.so"})
SQRT3 = 3.0**0.5
EM_CUDA = 190
CUDA_ERROR_NO_DEVICE = 100


# ---------------------------------------------------------------------------------------------
# Workloads


@dataclass
class Item:
    """One workload at one size, ready to build."""

    name: str
    kind: str
    size: str
    model: onnx.ModelProto
    inputs: dict[str, np.ndarray]
    torch_module: Any = None  # a torch.nn.Module, when the workload zoo provides one
    # Items of one model exported with dynamic axes share its libraries (one compile serves
    # every size) and its regenerated weights: both are keyed by ``library``.
    library: str = ""
    dims: dict[str, int] | None = None  # the sizes of the symbolic dims these inputs have

    def __post_init__(self) -> None:
        self.library = self.library or safe_name(self.name)


def iter_items(args: argparse.Namespace) -> Iterator[Item]:
    """The workloads to pack, one at a time (real-size models are large): ``--onnx`` files, or
    the zoo's workloads filtered by ``--workloads``. Inputs come from the zoo's generator."""
    if args.onnx:
        if args.dims:
            raise SystemExit("--dims packs the zoo's dynamic models, not --onnx files")
        for path in args.onnx:
            model = onnx.load(path)
            name = Path(path).name.removesuffix(".onnx")
            yield Item(name, args.onnx_kind, "file", model, zoo.inputs(model, seed=0))
        return
    everything = {w.name: w for w in zoo.all_workloads()}
    names = args.workloads.split(",") if args.workloads else list(everything)
    unknown = [n for n in names if n not in everything]
    if unknown:
        raise SystemExit(f"unknown workloads {unknown}; known: {', '.join(everything)}")
    if args.dims:
        yield from dynamic_items(names, args.size, args.dims)
        return
    for name in names:
        workload = everything[name]
        model = workload.model(args.size)
        module = zoo_torch_module(name, args.size) if workload.kind == "model" else None
        yield Item(name, workload.kind, args.size, model, zoo.inputs(model, seed=0), module)


def dynamic_items(names: Sequence[str], size: str, sizes: Sequence[dict[str, int]]
                  ) -> Iterator[Item]:
    """Model workloads ``names`` exported with dynamic batch and sequence axes, one item per
    entry of ``sizes`` (its inputs at those dims), all items of a model on one library."""
    from tvm_stitch.verify import with_dims
    from tvm_stitch.workloads import models

    for name in names:
        model = models.load_model(name, size, dynamic=True)
        for dims in sizes:
            label = ",".join(f"{k}={v}" for k, v in dims.items())
            yield Item(f"{name}@{label}", "model", size, model,
                       zoo.inputs(with_dims(model, dims), seed=0),
                       library=safe_name(f"{name}-dynamic"), dims=dims)


def zoo_torch_module(name: str, size: str) -> Any:
    """The seeded torch module that model workload ``name`` was exported from, rebuilt the way
    the zoo exports it; None without torch/transformers. (The pack checks it against
    onnxruntime before using it.)"""
    try:
        import torch

        from tvm_stitch.workloads import models, torch_modules

        spec = models.spec(name, size)
        torch.manual_seed(models.SEED)
        return torch_modules.build(spec.arch, spec.config).eval()
    except (ImportError, KeyError):
        return None


def reference_outputs(model: onnx.ModelProto, inputs: dict[str, np.ndarray]) -> list[np.ndarray]:
    """onnxruntime's outputs on the CPU, in graph output order."""
    import onnxruntime as ort

    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return [np.asarray(o) for o in session.run(None, inputs)]


def safe_name(name: str) -> str:
    """``name`` usable as a file name."""
    return re.sub(r"[^A-Za-z0-9_.-]", "_", name)


# ---------------------------------------------------------------------------------------------
# CUDA modules as cubins


def _undefined_cuda_symbols(library: Path) -> list[str]:
    out = subprocess.run(
        ["nm", "-D", "--undefined-only", str(library)], capture_output=True, text=True, check=True
    ).stdout
    return sorted({m.group(1) for m in re.finditer(r"\bU (cu[A-Z]\w*)", out)})


def make_libcuda_stub(runtime_cuda: Path, workdir: Path) -> Path:
    """A ``libcuda.so.1`` defining every driver symbol ``runtime_cuda`` imports, each returning
    CUDA_ERROR_NO_DEVICE; built with the C compiler that nvcc needs anyway."""
    symbols = _undefined_cuda_symbols(runtime_cuda)
    source = workdir / "libcuda_stub.c"
    source.write_text(
        "".join(f"int {s}(void) {{ return {CUDA_ERROR_NO_DEVICE}; }}\n" for s in symbols)
    )
    stub = workdir / "libcuda.so.1"
    cc = os.environ.get("CC", "cc")
    cmd = [cc, "-shared", "-fPIC", "-Wl,-soname,libcuda.so.1", "-o", str(stub), str(source)]
    subprocess.run(cmd, check=True)
    return stub


def load_cuda_runtime(workdir: Path) -> str:
    """Load TVM's CUDA runtime library so codegen builds real CUDA modules; returns what
    provided ``libcuda.so.1``: "driver", "stub", or "loaded" when it already was."""
    if tvm_ffi.get_global_func("ffi.Module.create.cuda", allow_missing=True) is not None:
        return "loaded"
    runtime_cuda = Path(tvm.libinfo.find_libtvm_runtime()).with_name("libtvm_runtime_cuda.so")
    try:
        ctypes.CDLL("libcuda.so.1", mode=ctypes.RTLD_GLOBAL)
        provider = "driver"
    except OSError:
        ctypes.CDLL(str(make_libcuda_stub(runtime_cuda, workdir)), mode=ctypes.RTLD_GLOBAL)
        provider = "stub"
    from tvm_ffi.libinfo import load_lib_ctypes

    load_lib_ctypes("tvm", "tvm_runtime_cuda", "RTLD_LOCAL", [runtime_cuda.parent])
    if tvm_ffi.get_global_func("ffi.Module.create.cuda", allow_missing=True) is None:
        raise RuntimeError(f"{runtime_cuda} loaded but registered no ffi.Module.create.cuda")
    return provider


def loaded_library(prefix: str) -> Path | None:
    """Path of a shared library loaded in this process whose file name starts with ``prefix``."""
    with open("/proc/self/maps") as maps:
        for line in maps:
            path = line.split()[-1]
            if Path(path).name.startswith(prefix):
                return Path(path)
    return None


@contextlib.contextmanager
def nvcc_cubin(target: Target) -> Iterator[None]:
    """While active, TVM's CUDA codegen compiles with nvcc to a cubin for ``target``'s arch
    (TVM's own nvcc flags: see nvcc_flags)."""
    from tvm.support import nvcc

    arch = str(target.attrs["arch"])
    previous = tvm_ffi.get_global_func("tvm_callback_cuda_compile", allow_missing=True)

    def compile_cubin(code: str, *_: Any) -> bytearray:
        with target:
            return nvcc.compile_cuda(code, target_format="cubin", arch=arch, compiler="nvcc")

    tvm_ffi.register_global_func("tvm_callback_cuda_compile", compile_cubin, override=True)
    try:
        yield
    finally:
        if previous is not None:
            tvm_ffi.register_global_func("tvm_callback_cuda_compile", previous, override=True)


def nvcc_flags() -> str:
    """TVM's nvcc flags that tell results apart: ``--use_fast_math`` unless
    ``TVM_CUDA_NVCC_NO_FAST_MATH`` is set (TVM's own switch, read when it compiles)."""
    return "-O3" if os.environ.get("TVM_CUDA_NVCC_NO_FAST_MATH") else "-O3 --use_fast_math"


def cubin_archs(path: Path) -> list[str]:
    """Architectures (``sm_XX``) of the CUDA ELF images embedded in the file at ``path``."""
    data = path.read_bytes()
    archs = []
    start = data.find(b"\x7fELF\x02\x01", 1)
    while start >= 0:
        if struct.unpack_from("<H", data, start + 18)[0] == EM_CUDA:
            flags = struct.unpack_from("<I", data, start + 48)[0]
            abi = data[start + 8]
            archs.append(f"sm_{(flags >> 8) & 0xFF if abi >= 8 else flags & 0xFF}")
        start = data.find(b"\x7fELF\x02\x01", start + 1)
    return archs


# ---------------------------------------------------------------------------------------------
# Building


def build_library(mod: tvm.IRModule, flow: str, target: Target, path: Path) -> None:
    """Compile ``mod`` with ``flow`` for ``target`` and export it to ``path``."""
    if target.kind.name == "cuda":
        executable = pipeline.build(pipeline.lower(mod, target, flow), target)
    else:
        executable = tvm.compile(mod, target)
    executable.export_library(str(path))


def _error(exc: BaseException) -> str:
    text = f"{type(exc).__name__}: {exc}".strip()
    return text if len(text) < 2000 else text[:2000] + " ..."


def torch_program(
    item: Item,
    index: int,
    model: onnx.ModelProto,
    feeds: dict[str, np.ndarray],
    outputs: list[np.ndarray],
    pack: Path,
    regenerated: Sequence[str],
) -> tuple[dict[str, Any], refs.Program | None]:
    """The PyTorch side of ``item``: a program generated from ``model`` (micro) or a
    ``torch.export`` of the zoo's module (model), checked on the CPU against onnxruntime's
    ``outputs`` when torch is installed here. Returns its manifest entry and the program."""
    try:
        import torch
    except ImportError:
        torch = None
    try:
        if item.kind != "micro":
            return _export_module(item, feeds, outputs, pack, regenerated), None
        program = refs.generate_program(model, f"workload_{index}")
    except Exception as exc:  # noqa: BLE001 (recorded: PyTorch timing not available)
        return {"reason": _error(exc)}, None
    entry: dict[str, Any] = {"program": "onnx_replay", "function": program.function}
    if torch is None:
        entry["cpu_check"] = "not run: torch is not installed on the pack machine"
        return entry, program
    namespace = {"OPS": refs.OPS}
    exec(compile(program.source, f"<{item.name}>", "exec"), namespace)  # noqa: S102
    run = namespace[program.function]
    with torch.no_grad():
        got = run(refs.to_device(program.consts, "cpu"), *refs.to_device(feeds.values(), "cpu"))
    ok, err = check.compare(refs.to_numpy(got), outputs)
    if not ok:
        return {"reason": f"generated program differs from onnxruntime on the CPU ({err})"}, None
    entry["cpu_max_abs_err"] = err
    return entry, program


def _export_module(
    item: Item,
    feeds: dict[str, np.ndarray],
    outputs: list[np.ndarray],
    pack: Path,
    regenerated: Sequence[str],
) -> dict[str, Any]:
    if item.torch_module is None:
        raise RuntimeError(
            "the workload zoo has no PyTorch module for this model "
            "(model workloads are not replayed from ONNX)"
        )
    if regenerated:
        raise RuntimeError(
            f"{len(regenerated)} weights were too large to ship and are "
            "regenerated from seeds for TVM; the PyTorch module keeps its own"
        )
    import torch

    args = tuple(torch.from_numpy(np.array(v)) for v in feeds.values())
    with torch.no_grad():
        exported = torch.export.export(item.torch_module.eval(), args)
        ok, err = check.compare(refs.to_numpy(exported.module()(*args)), outputs)
    if not ok:
        raise RuntimeError(f"torch.export program differs from onnxruntime on the CPU ({err})")
    path = Path(TORCH_DIR) / f"{safe_name(item.name)}.pt2"
    torch.export.save(exported, str(pack / path))
    return {
        "program": "torch.export",
        "path": str(path),
        "cpu_max_abs_err": err,
        "torch_version": torch.__version__,
    }


class ArrayStore:
    """The arrays of one workload: small ones saved in its npz, large ones replaced up front by
    arrays regenerated from a seeded recipe (see gpu_check.regenerate), which the pack ships
    instead of the data."""

    def __init__(self, seed_base: int, limit_bytes: int) -> None:
        self.seed = seed_base
        self.limit = limit_bytes
        self.arrays: dict[str, np.ndarray] = {}
        self.recipes: dict[str, dict[str, Any]] = {}  # digest -> recipe

    def shrink(self, array: np.ndarray) -> np.ndarray:
        """``array``, or a regenerated stand-in with its shape, dtype, mean and spread (its
        range, for integers) when it is larger than the limit."""
        if array.nbytes <= self.limit or array.dtype.kind not in "biuf":
            return array
        if array.dtype.kind == "f":
            mean, spread = float(np.mean(array, dtype=np.float64)), float(np.std(array))
            recipe = {"kind": "float", "low": mean - SQRT3 * spread, "high": mean + SQRT3 * spread}
        else:
            recipe = {"kind": "int", "low": int(array.min()), "high": int(array.max()) + 1}
        self.seed += 1
        recipe.update(seed=self.seed, shape=list(array.shape), dtype=array.dtype.str)
        regenerated = check.regenerate(recipe)
        recipe["sha256"] = check.digest(regenerated)
        self.recipes[recipe["sha256"]] = recipe
        return regenerated

    def source(self, key: str, array: np.ndarray) -> dict[str, Any]:
        """Where gpu_check finds ``array``: its recipe if it is a regenerated one, else the
        npz entry ``key``."""
        if array.nbytes > self.limit:
            recipe = self.recipes.get(check.digest(array))
            if recipe is not None:
                return {"recipe": recipe}
        self.arrays[key] = array
        return {"array": key}


def shrink_initializers(
    model: onnx.ModelProto, store: ArrayStore
) -> tuple[onnx.ModelProto, list[str]]:
    """A copy of ``model`` with its large initializers regenerated; also their names."""
    model = onnx.ModelProto.FromString(model.SerializeToString())
    names = []
    for init in model.graph.initializer:
        value = onnx.numpy_helper.to_array(init)
        new = store.shrink(value)
        if new is not value:
            init.CopyFrom(onnx.numpy_helper.from_array(new, init.name))
            names.append(init.name)
    return model, names


def weights_as_inputs(model: onnx.ModelProto, names: Sequence[str]) -> onnx.ModelProto:
    """A copy of ``model`` whose initializers ``names`` are graph inputs after the others, in
    initializer order: for onnxruntime fed with regenerated weights, and for a library that
    takes its weights as VM inputs (``main(*inputs, *weights)``)."""
    model = onnx.ModelProto.FromString(model.SerializeToString())
    moved = [i for i in model.graph.initializer if i.name in names]
    kept_inits = [i for i in model.graph.initializer if i.name not in names]
    kept_inputs = [i for i in model.graph.input if i.name not in names]
    del model.graph.initializer[:], model.graph.input[:]
    model.graph.initializer.extend(kept_inits)
    model.graph.input.extend(kept_inputs)
    for init in moved:
        model.graph.input.append(
            onnx.helper.make_tensor_value_info(init.name, init.data_type, list(init.dims))
        )
    return model


def pack_item(
    item: Item,
    index: int,
    flows: Sequence[str],
    target: Target,
    pack: Path,
    limits: argparse.Namespace,
    built: dict[tuple[str, str], str | BaseException],
) -> tuple[dict[str, Any], refs.Program | None]:
    """Build, export and save one workload; returns its manifest entry (and torch program).
    ``built`` holds the libraries built so far by (library, flow): their paths or errors."""
    from tvm_stitch.frontend.onnx import import_model

    stem = safe_name(item.name)
    # Weights first, from a seed of the library's: items sharing a library regenerate the
    # same weights whatever their inputs' sizes.
    store = ArrayStore(seed_base=1000 * index, limit_bytes=int(limits.inline_kb * 1024))
    model, regenerated = shrink_initializers(item.model, store)
    feeds = {name: store.shrink(value) for name, value in item.inputs.items()}
    outputs = reference_outputs(model, feeds)
    inits = {i.name: onnx.numpy_helper.to_array(i) for i in model.graph.initializer}
    as_inputs = sum(v.nbytes for v in inits.values()) > limits.embed_mb * 2**20
    params = {n: inits[n] for n in regenerated} if as_inputs else {}
    mod = import_model(weights_as_inputs(model, list(params)))
    entry: dict[str, Any] = {
        "name": item.name,
        "kind": item.kind,
        "size": item.size,
        "dims": item.dims,
        "data": f"data/{stem}.npz",
        "inputs": [
            {**_describe(name, value), "source": store.source(f"input_{i}", value)}
            for i, (name, value) in enumerate(feeds.items())
        ],
        "weights": "vm inputs" if params else "embedded",
        "params": [store.source(f"param_{i}", p) for i, p in enumerate(params.values())],
        "regenerated_initializers": len(regenerated),
        "outputs": [_describe(o.name, v) for o, v in zip(model.graph.output, outputs, strict=True)],
        "libs": {},
        "build_errors": {},
    }
    if sum(o.nbytes for o in outputs) <= limits.outputs_mb * 2**20:
        entry["reference"] = "pack"
        store.arrays.update({f"output_{i}": v for i, v in enumerate(outputs)})
    else:
        onnx_path = Path("onnx") / f"{stem}.onnx"
        (pack / onnx_path).parent.mkdir(exist_ok=True)
        onnx.save(weights_as_inputs(model, regenerated), pack / onnx_path)
        sources = [*feeds.items(), *((n, inits[n]) for n in regenerated)]
        entry["reference"] = {
            "onnx": str(onnx_path),
            "feeds": [{"name": n, "source": store.source(f"feed_{n}", v)} for n, v in sources],
        }
    for flow in flows:
        if (item.library, flow) not in built:
            built[item.library, flow] = build_flow(mod, flow, target, pack, item.library)
        lib = built[item.library, flow]
        if isinstance(lib, BaseException):
            entry["build_errors"][flow] = _error(lib)
            print(f"  {item.name} / {flow}: build failed: {_error(lib)[:300]}", file=sys.stderr)
        else:
            entry["libs"][flow] = lib
    entry["torch"], program = torch_program(item, index, model, feeds, outputs, pack, regenerated)
    if program is not None:
        entry["torch"]["consts"] = [
            store.source(f"const_{i}", c) for i, c in enumerate(program.consts)
        ]
    np.savez_compressed(pack / entry["data"], **store.arrays)
    return entry, program


def build_flow(mod: tvm.IRModule, flow: str, target: Target, pack: Path, library: str
               ) -> str | BaseException:
    """Build ``mod`` with ``flow`` into ``pack/libs``: the library's path in the pack, or
    what stopped it."""
    lib = Path("libs") / f"{library}.{flow}.so"
    try:
        build_library(mod, flow, target, pack / lib)
    except Exception as exc:  # noqa: BLE001 (recorded in the manifest, measured as failed)
        return exc
    if target.kind.name == "cuda":
        archs = cubin_archs(pack / lib)
        if str(target.attrs["arch"]) not in archs:
            raise RuntimeError(f"{lib}: no cubin for {target.attrs['arch']} (found {archs})")
    return str(lib)


def pack_tuning(item: Item, target: Target, pack: Path, trials: int, model: str
                ) -> dict[str, Any]:
    """The tuning pack of one workload under ``pack/tuning`` (built while ``nvcc_cubin`` is
    active, so its libraries hold cubins too): ``trials`` candidates per stitched group, the
    rules' kernel first, then the best of cost ``model`` (``analytic``, ``xgboost``, a shipped
    model's name or a saved model's directory); its entry in the manifest."""
    from tvm_stitch.frontend.onnx import import_model
    from tvm_stitch.tuning.cost import load_model, model_of
    from tvm_stitch.tuning.kinds import ModelKind, RunnerKind
    from tvm_stitch.tuning.pack import export_pack

    where = f"tuning/{safe_name(item.name)}"
    ranker = model_of(ModelKind(model)) if model in set(ModelKind) else load_model(model)
    try:
        export_pack(import_model(item.model), target, pack / where, trials=trials,
                    model=ranker, runner_kind=RunnerKind.LOCAL)
    except Exception as exc:  # noqa: BLE001 (recorded; the workload's own libraries stand)
        print(f"  {item.name}: no tuning pack: {_error(exc)[:300]}")
        return {"error": _error(exc)}
    return {"pack": where, "model": model}


def failed_entry(item: Item, flows: Sequence[str], exc: BaseException) -> dict[str, Any]:
    """The manifest entry of a workload that could not be packed at all (import, reference)."""
    reason = f"not packed: {_error(exc)}"
    return {
        "name": item.name,
        "kind": item.kind,
        "size": item.size,
        "data": None,
        "inputs": [],
        "params": [],
        "outputs": [],
        "reference": "pack",
        "libs": {},
        "build_errors": dict.fromkeys(flows, reason),
        "torch": {"reason": reason},
    }


def _describe(name: str, value: np.ndarray) -> dict[str, Any]:
    return {"name": name, "shape": list(value.shape), "dtype": str(value.dtype)}


# ---------------------------------------------------------------------------------------------
# Runtime and wheels


def pack_runtime(dest: Path, cudart: Path | None) -> dict[str, Any]:
    """Copy the tvm package to ``dest`` without what only compiling needs; add ``cudart``
    (which libtvm_runtime_cuda.so links) next to the runtime libraries."""
    source = Path(tvm.__file__).resolve().parent

    def ignore(directory: str, names: list[str]) -> set[str]:
        top = Path(directory).resolve() == source
        return {n for n in names if n in RUNTIME_DROP_ANY or (top and n in RUNTIME_DROP_TOP)}

    shutil.copytree(source, dest, ignore=ignore)
    if cudart is not None:
        shutil.copy2(cudart, dest / "lib" / cudart.name)
    return {
        "tvm": "runtime/tvm",
        "tvm_version": tvm.__version__,
        "dropped": sorted(RUNTIME_DROP_TOP | RUNTIME_DROP_ANY),
        "cudart": cudart.name if cudart is not None else None,
    }


def ensure_wheels(wheel_dir: Path) -> list[Path]:
    """The CPython 3.12 wheel of apache-tvm-ffi and the typing_extensions wheel (a tvm-ffi
    dependency), downloaded into ``wheel_dir`` unless already there."""
    wanted = {
        "apache-tvm-ffi": TVM_FFI_VERSION,
        "typing_extensions": importlib.metadata.version("typing_extensions"),
    }
    wheel_dir.mkdir(parents=True, exist_ok=True)
    found = []
    for name, version in wanted.items():
        pattern = f"{name.replace('-', '_')}-{version}-*.whl"
        wheels = sorted(wheel_dir.glob(pattern))
        if not wheels:
            platforms = [f"--platform={p}" for p in WHEEL_PLATFORMS]
            subprocess.run(
                [
                    sys.executable,
                    "-m",
                    "pip",
                    "download",
                    "--quiet",
                    "--no-deps",
                    "--only-binary=:all:",
                    f"--python-version={WHEEL_PYTHON}",
                    "--implementation=cp",
                    *platforms,
                    "-d",
                    str(wheel_dir),
                    f"{name}=={version}",
                ],
                check=True,
            )
            wheels = sorted(wheel_dir.glob(pattern))
        if not wheels:
            raise RuntimeError(f"no wheel {pattern} in {wheel_dir}")
        found.append(wheels[-1])
    return found


# ---------------------------------------------------------------------------------------------
# The pack


def tree_bytes(path: Path) -> int:
    """Bytes of the files under ``path``."""
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def write_archive(pack: Path, archive: Path) -> None:
    """``pack`` as a gzip'd tar with one top directory, ``gpu-pack``."""
    with tarfile.open(archive, "w:gz", compresslevel=9) as tar:
        tar.add(pack, arcname=ARCHIVE_ROOT)


def parse_dims(text: str) -> dict[str, int]:
    """``batch=8,seq=1`` as {"batch": 8, "seq": 1}."""
    try:
        return {k.strip(): int(v) for k, v in (part.split("=") for part in text.split(","))}
    except ValueError as err:
        raise argparse.ArgumentTypeError(f"{text!r}: expected NAME=SIZE,... ({err})") from err


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    """Command line of gpu_pack.py."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True, type=Path, help="pack directory to create")
    parser.add_argument("--workloads", help="comma-separated zoo names (default: all)")
    parser.add_argument("--size", choices=("ci", "real"), default="real")
    parser.add_argument("--flows", help="comma-separated compile flows (default: all available)")
    parser.add_argument(
        "--onnx", action="append", help="pack this ONNX file instead of zoo workloads (repeatable)"
    )
    parser.add_argument("--onnx-kind", default="micro", choices=("micro", "model"))
    parser.add_argument(
        "--dims",
        action="append",
        type=parse_dims,
        help="pack the model workloads exported with dynamic batch and sequence axes, compiled "
        "once per flow, run at these sizes of their symbolic dims (NAME=SIZE,...; repeatable)",
    )
    parser.add_argument(
        "--device",
        choices=("cuda", "cpu"),
        default="cuda",
        help="cpu: a self-test pack built for llvm, run by gpu_check on tvm.cpu()",
    )
    parser.add_argument("--target", default=DEFAULT_TARGET, help="CUDA target (cuda:sm_XX)")
    parser.add_argument("--wheel-dir", type=Path, default=DEFAULT_WHEEL_DIR)
    parser.add_argument("--archive", action="store_true", help="also write OUT.tar.gz")
    parser.add_argument("--max-mb", type=float, default=DEFAULT_MAX_MB)
    parser.add_argument(
        "--inline-kb",
        type=float,
        default=256.0,
        help="arrays larger than this ship as seeded recipes",
    )
    parser.add_argument(
        "--outputs-mb",
        type=float,
        default=2.0,
        help="outputs larger than this are recomputed with onnxruntime on the GPU machine",
    )
    parser.add_argument(
        "--embed-mb",
        type=float,
        default=8.0,
        help="weights larger than this become VM inputs instead of library constants",
    )
    parser.add_argument(
        "--tune-trials",
        type=int,
        default=0,
        help="also pack this many tuning candidates per stitched group of each workload "
        "(tuning/WORKLOAD, tvm_stitch.tuning.pack; cuda only): gpu_check.sh times them after "
        "its checks, and `tvm-stitch tune --import` records the results",
    )
    parser.add_argument(
        "--tune-model",
        default="analytic",
        help="the cost model that picks the tuning candidates after the rules' kernel: "
        "analytic (default), or a shipped model's name (h200) or a saved model's directory",
    )
    parser.add_argument("--force", action="store_true", help="replace an existing OUT")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    """Build the pack; 0 when every library built and the pack fits ``--max-mb``."""
    args = parse_args(argv)
    pack: Path = args.out
    if pack.exists():
        if not args.force:
            raise SystemExit(f"{pack} exists (use --force to replace it)")
        shutil.rmtree(pack)
    for sub in ("libs", "data", TORCH_DIR, "runtime"):
        (pack / sub).mkdir(parents=True)
    if args.device == "cuda":
        target = parse_target(args.target)
        flows = args.flows.split(",") if args.flows else pipeline.available_flows()
    else:
        target, flows = Target("llvm"), [CPU_FLOW]
    wheels = ensure_wheels(args.wheel_dir)

    with tempfile.TemporaryDirectory() as tmp:
        libcuda = load_cuda_runtime(Path(tmp)) if args.device == "cuda" else None
        build = nvcc_cubin(target) if args.device == "cuda" else contextlib.nullcontext()
        entries, programs = [], []
        built: dict[tuple[str, str], str | BaseException] = {}
        first_index: dict[str, int] = {}
        with build:
            for index, item in enumerate(iter_items(args)):
                print(f"[{index + 1}] {item.name} ({item.kind}, {item.size})", flush=True)
                seed_index = first_index.setdefault(item.library, index)
                try:
                    entry, program = pack_item(item, seed_index, flows, target, pack, args, built)
                except Exception as exc:  # noqa: BLE001 (import or reference failed: recorded)
                    entry, program = failed_entry(item, flows, exc), None
                    print(f"  {item.name}: not packed: {entry['torch']['reason'][:300]}")
                if args.tune_trials and args.device == "cuda" and item.dims is None:
                    entry["tuning"] = pack_tuning(item, target, pack, args.tune_trials,
                                                  args.tune_model)
                entries.append(entry)
                if program is not None:
                    programs.append(program)
    refs.write_programs(pack / TORCH_DIR / "programs.py", programs)
    cudart = loaded_library("libcudart.so") if args.device == "cuda" else None
    runtime = pack_runtime(pack / "runtime" / "tvm", cudart)
    (pack / "runtime" / "wheels").mkdir()
    for wheel in wheels:
        shutil.copy2(wheel, pack / "runtime" / "wheels" / wheel.name)
    runtime["wheels"] = [f"runtime/wheels/{w.name}" for w in wheels]
    for name in CHECK_FILES:
        shutil.copy2(HERE / name, pack / name)

    manifest = {
        "format": PACK_FORMAT,
        "created": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "device": args.device,
        "target": str(target.kind.name if args.device == "cpu" else args.target),
        "arch": str(target.attrs["arch"]) if args.device == "cuda" else None,
        "cuda_compile": f"nvcc --cubin (TVM's flags: {nvcc_flags()})" if libcuda else None,
        "libcuda_at_build": libcuda,
        "flows": flows,
        "size": args.size if not args.onnx else "file",
        "runtime": runtime,
        "workloads": entries,
    }
    (pack / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")

    shipped = pack
    if args.archive:
        shipped = pack.with_name(pack.name + ".tar.gz")
        write_archive(pack, shipped)
    size_mb = (shipped.stat().st_size if shipped.is_file() else tree_bytes(shipped)) / 2**20
    failed = [(e["name"], f) for e in entries for f in e["build_errors"]]
    print(
        f"pack: {shipped} ({size_mb:.1f} MB), {len(entries)} workloads x {len(flows)} flows, "
        f"{len(failed)} builds failed, {len(programs)} PyTorch programs"
    )
    if size_mb > args.max_mb:
        print(f"error: the pack is {size_mb:.1f} MB, over --max-mb {args.max_mb}", file=sys.stderr)
        return 1
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
