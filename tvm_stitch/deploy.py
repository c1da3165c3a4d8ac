"""Compile an ONNX model into a library to deploy, and run such a library on a GPU.

``compile_onnx(path, target)`` imports the model, compiles it with a flow (``stitch`` unless
told otherwise) into a Relax VM executable whose weights are constants inside it, and
describes it in a ``Sidecar``; ``CompiledModel.export("model.so")`` writes the library and
``model.json`` beside it. ``tvm-stitch compile`` is that, and ``tvm-stitch run`` is
``run_library``: on a machine with an NVIDIA GPU it loads the library with
``tvm.runtime.load_module`` and ``relax.VirtualMachine`` on ``tvm.cuda(0)`` and feeds it arrays
by input name. A model with symbolic input dimensions (ONNX dim_params) compiles symbolic: the
library runs at any size; ``dims`` only records the size each is expected at, as a hint.

The library keeps TVM's CUDA source (TVM compiles it when the library is loaded, for the GPU
it loads on), so a machine without a GPU builds and exports it but cannot load it: loading
needs TVM's CUDA runtime, which needs the driver (``libcuda.so.1``), and NVRTC (the
``cuda-bindings`` package) or nvcc (``TVM_CUDA_COMPILE_MODE=nvcc``, which ``run_library`` sets
when the package is missing, unless the variable is set already).
"""

from __future__ import annotations

import argparse
import importlib.metadata
import os
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
import tvm
import tvm_ffi
from tvm import relax
from tvm.ir import IRModule

from . import __version__, pipeline
from .frontend.onnx import ModelError, check_dims, dim_params, graph_inputs, import_model, load
from .plan import StitchPlan
from .sidecar import Sidecar, SidecarError, TensorSpec, sidecar_path
from .symbolic import declared_bounds
from .target import DEFAULT_TARGET, TargetSpec, describe, parse_target, target_argument
from .tuning.database import DatabaseError, add_database_argument, database_or_none
from .verify import add_dim_max_argument, dim_argument

DEFAULT_FLOW = "stitch"


class DeviceError(RuntimeError):
    """No GPU to run a library on, or not one of the architecture it was compiled for."""


class RunError(ValueError):
    """A library or an input file that ``run`` cannot use."""


@dataclass(frozen=True)
class CompiledModel:
    """A model compiled for deployment: the executable, the scheduled module it was built
    from (``tvm_stitch.analysis`` counts it), and its sidecar."""

    executable: tvm.runtime.Executable
    scheduled: IRModule
    sidecar: Sidecar

    @property
    def plan(self) -> StitchPlan | None:
        """The stitch plan, None for the baseline flow."""
        return StitchPlan.of_module(self.scheduled)

    def export(self, library: str | os.PathLike) -> Path:
        """Write the library to ``library`` (a ``.so``; TVM links it with the host's C
        compiler) and the sidecar beside it, making the folder if need be; returns the
        sidecar's path."""
        sidecar = sidecar_path(library)
        sidecar.parent.mkdir(parents=True, exist_ok=True)
        self.executable.export_library(os.fspath(library))
        self.sidecar.save(sidecar)
        return sidecar


def compile_onnx(model: str | os.PathLike | onnx.ModelProto,
                 target: TargetSpec = DEFAULT_TARGET, *,
                 dims: Mapping[str, int] | None = None, flow: str = DEFAULT_FLOW,
                 database: str | os.PathLike | None = None,
                 cost_model: str | os.PathLike | None = None,
                 dim_max: Mapping[str, int] | None = None) -> CompiledModel:
    """Compile an ONNX model (a path or a ModelProto) for ``target`` with ``flow``; raises
    ModelError for a model that cannot be compiled.

    ``target`` is ``"cuda:sm_90"``, TVM's JSON form (``{"kind": "cuda", "arch": "sm_90"}``)
    or a Target; TVM's old string form raises ValueError showing these. ``dims`` gives size
    hints of symbolic dimensions, recorded in the sidecar (the library stays symbolic);
    naming a dimension the inputs do not have raises ModelError. ``database`` is a tuning
    database (``tvm-stitch tune``) whose records the stitch flow applies, ``cost_model`` a
    cost model that picks the kernels of the other groups (a shipped model's name or a saved
    model's directory: ``tuning.database.database_or_none``). ``dim_max``
    declares upper bounds of symbolic dimensions (``frontend.import_model``)."""
    target = parse_target(target)
    proto = load(model)
    hints = dict(dims or {})
    check_dims(proto, hints)
    mod = import_model(proto, dim_max=dim_max)
    with database_or_none(database, cost_model):
        scheduled = pipeline.lower(mod, target, flow)
    executable = pipeline.build(scheduled, target)
    plan = StitchPlan.of_module(scheduled)
    main = mod["main"]
    name = proto.graph.name if isinstance(model, onnx.ModelProto) else Path(model).name
    sidecar = Sidecar(
        model=name,
        flow=flow,
        target=describe(target),
        inputs=_specs([v.name for v in graph_inputs(proto)], [p.ty for p in main.params],
                      "inputs"),
        outputs=_specs([v.name for v in proto.graph.output], _fields(main.ret_ty), "outputs"),
        dims={d: hints.get(d) for d in dim_params(proto)},
        plan=None if plan is None else plan.to_dict(),
        database=None if database is None else os.fspath(database),
        versions=versions(),
        dim_max=declared_bounds(main.attrs),
        cost_model=None if cost_model is None else os.fspath(cost_model),
    )
    return CompiledModel(executable, scheduled, sidecar)


def versions() -> dict[str, str]:
    """The versions of tvm-stitch, TVM and tvm-ffi in this environment."""
    return {"tvm_stitch": __version__, "tvm": tvm.__version__,
            "tvm_ffi": importlib.metadata.version("apache-tvm-ffi")}


def _fields(ty: relax.Type) -> list[relax.Type]:
    """The types of ``main``'s results: the fields of a tuple, or the one type."""
    return list(ty.fields) if isinstance(ty, relax.TupleType) else [ty]


def _specs(names: Sequence[str], types: Sequence[relax.Type], what: str
           ) -> tuple[TensorSpec, ...]:
    """Tensor specs of ``main``'s parameters or results, named after the ONNX graph's."""
    if len(names) != len(types):
        raise ModelError(f"the ONNX graph has {len(names)} {what}, the imported model "
                         f"{len(types)}")
    specs = []
    for name, ty in zip(names, types, strict=True):
        if not isinstance(ty, relax.TensorType) or not isinstance(ty.shape, relax.ShapeExpr):
            raise ModelError(f"{name}: {ty} is not a tensor of known rank")
        shape = tuple(int(d) if isinstance(d, tvm.tirx.IntImm) else str(d)
                      for d in ty.shape.values)
        specs.append(TensorSpec(name, shape, str(ty.dtype)))
    return tuple(specs)


def cuda_device() -> tvm.runtime.Device:
    """``tvm.cuda(0)``; DeviceError saying why when there is none."""
    device = tvm.cuda(0)
    if not device.exist:
        loaded = tvm_ffi.get_global_func("ffi.Module.load_from_bytes.cuda",
                                         allow_missing=True) is not None
        why = ("TVM sees no CUDA GPU" if loaded else
               "TVM's CUDA runtime is not loaded: no CUDA driver (libcuda.so.1)")
        raise DeviceError(f"{why}; a library compiled for CUDA runs on a machine with an "
                          "NVIDIA GPU and its driver")
    return device


def run_library(library: str | os.PathLike, arrays: Mapping[str, np.ndarray]
                ) -> dict[str, np.ndarray]:
    """Run ``main`` of the library ``tvm-stitch compile`` wrote, on ``tvm.cuda(0)``, with
    ``arrays`` by input name; returns the outputs by name.

    The sidecar and the arrays are checked first (SidecarError), then the GPU: DeviceError
    when there is none, or when its architecture is not the one compiled for (a persistent
    grid is sized to that GPU). RunError when the library is missing."""
    path = Path(library)
    sidecar = Sidecar.load(sidecar_path(path))
    if not path.is_file():
        raise RunError(f"no library {path}")
    args = sidecar.arguments(arrays)
    device = cuda_device()
    arch = "sm_" + str(device.compute_version).replace(".", "")
    if sidecar.arch is not None and sidecar.arch != arch:
        raise DeviceError(f"{path} was compiled for {sidecar.arch}, GPU 0 is {arch}: compile "
                          f"it with --target cuda:{arch}")
    _choose_cuda_compiler()
    vm = relax.VirtualMachine(tvm.runtime.load_module(os.fspath(path)), device)
    result = vm["main"](*[tvm.runtime.tensor(a, device) for a in args])
    values = _numpy(result)
    return {spec.name: v for spec, v in zip(sidecar.outputs, values, strict=True)}


def _choose_cuda_compiler() -> None:
    """Have TVM compile the library's CUDA source, when it is loaded, with nvcc where NVRTC's
    Python bindings (``cuda-bindings``) are missing, unless ``TVM_CUDA_COMPILE_MODE`` says."""
    if "TVM_CUDA_COMPILE_MODE" in os.environ:
        return
    try:
        import cuda.bindings  # noqa: F401
    except ImportError:
        os.environ["TVM_CUDA_COMPILE_MODE"] = "nvcc"


def _numpy(value: object) -> list[np.ndarray]:
    """A VM result (a tensor or nested tuples of tensors) as numpy arrays, in order."""
    if isinstance(value, tvm.runtime.Tensor):
        return [value.numpy()]
    return [a for v in value for a in _numpy(v)]


def read_arrays(path: str | os.PathLike) -> dict[str, np.ndarray]:
    """The arrays of an ``.npz`` file by name; RunError when it is not one."""
    try:
        data = np.load(path, allow_pickle=False)
    except FileNotFoundError:
        raise RunError(f"no input file {path}") from None
    except (OSError, ValueError):
        raise RunError(f"{path} is not an .npz file of arrays (numpy.savez writes one)"
                       ) from None
    if not isinstance(data, np.lib.npyio.NpzFile):
        raise RunError(f"{path} holds one array, not an .npz file of arrays by input name")
    with data:
        return {name: data[name] for name in data.files}


def add_compile_arguments(parser: argparse.ArgumentParser) -> None:
    """The arguments of ``tvm-stitch compile``."""
    parser.add_argument("model", help="path of an ONNX model")
    parser.add_argument("-o", "--output", required=True, metavar="LIB.so",
                        help="the library to write; the sidecar goes beside it (LIB.json)")
    parser.add_argument("--target", type=target_argument, default=DEFAULT_TARGET,
                        help='cuda:sm_90 (default), cuda:sm_80, or TVM\'s JSON form '
                             '\'{"kind": "cuda", "arch": "sm_90"}\'')
    parser.add_argument("--pipeline", default=DEFAULT_FLOW, choices=pipeline.available_flows(),
                        help="compile flow (default stitch)")
    parser.add_argument("--dim", type=dim_argument, action="append", default=[],
                        metavar="NAME=SIZE",
                        help="expected size of a symbolic input dimension, recorded in the "
                             "sidecar as a hint; the library stays symbolic")
    add_dim_max_argument(parser)
    add_database_argument(parser)


def compile_command(args: argparse.Namespace) -> int:
    """Execute ``tvm-stitch compile``; returns the exit code (2 for a refused model)."""
    try:
        sidecar = sidecar_path(args.output)
    except SidecarError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    try:
        compiled = compile_onnx(args.model, args.target, dims=dict(args.dim),
                                flow=args.pipeline, database=args.db,
                                cost_model=args.cost_model, dim_max=dict(args.dim_max))
    except (ModelError, DatabaseError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    compiled.export(args.output)
    plan = compiled.plan
    what = ("the baseline flow" if plan is None else
            f"{len(plan.groups)} stitched group(s), {len(plan.fallbacks)} fallback(s)")
    dims = ", ".join(f"{d}" + ("" if s is None else f" (hint {s})")
                     for d, s in compiled.sidecar.dims.items())
    print(f"wrote {args.output} and {sidecar}: {what}, target "
          f"{compiled.sidecar.arch or compiled.sidecar.target['kind']}"
          + (f", symbolic {dims}" if dims else ""))
    return 0


def add_run_arguments(parser: argparse.ArgumentParser) -> None:
    """The arguments of ``tvm-stitch run``."""
    parser.add_argument("library", help="a library written by tvm-stitch compile (LIB.so)")
    parser.add_argument("--inputs", required=True, metavar="X.npz",
                        help="the inputs, one array per input name (numpy.savez)")
    parser.add_argument("--outputs", metavar="Y.npz",
                        help="write the outputs here, one array per output name")


def run_command(args: argparse.Namespace) -> int:
    """Execute ``tvm-stitch run``; returns the exit code (2 when it cannot run)."""
    try:
        outputs = run_library(args.library, read_arrays(args.inputs))
    except (SidecarError, RunError, DeviceError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    if args.outputs:
        np.savez(args.outputs, **outputs)
    for name, value in outputs.items():
        print(f"{name}: {value.dtype} {tuple(value.shape)}")
    return 0


__all__ = ["CompiledModel", "DeviceError", "RunError", "SidecarError", "compile_onnx",
           "cuda_device", "read_arrays", "run_library", "versions"]
