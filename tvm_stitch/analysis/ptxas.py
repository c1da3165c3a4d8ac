"""Registers, shared memory and spills per kernel, as ``ptxas -v`` reports them.

The CUDA source TVM generates is compiled to a cubin with the machine's ``nvcc`` and the
options TVM's own nvcc path uses (``tvm.support.nvcc``: -O3, fast math, half/bfloat16
operators), plus ``-Xptxas -v``. Compiling takes about half a second per module, so results
are cached in memory by a hash of the source, the architecture and the nvcc binary.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
import tempfile
from collections import Counter
from dataclasses import dataclass

from ..lowering import LoweredFunc

_NVCC_OPTIONS = (
    "-O3",
    "--use_fast_math",
    "-U__CUDA_NO_HALF_OPERATORS__",
    "-U__CUDA_NO_HALF_CONVERSIONS__",
    "-U__CUDA_NO_BFLOAT16_OPERATORS__",
    "-U__CUDA_NO_BFLOAT16_CONVERSIONS__",
    "-U__CUDA_NO_BFLOAT162_OPERATORS__",
    "-U__CUDA_NO_BFLOAT162_CONVERSIONS__",
    "--expt-relaxed-constexpr",
    "--expt-extended-lambda",
)

_ENTRY = re.compile(r"Compiling entry function '([^']+)' for '(sm_\w+)'")
_PROPERTIES = re.compile(r"Function properties for (\S+)")
_FRAME = re.compile(
    r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")
_USED = re.compile(r"Used (\d+) registers")
_SMEM = re.compile(r"(\d+) bytes smem")
_ARCH = re.compile(r"sm_\d+a?")

_cache: dict[str, dict[str, KernelResources]] = {}


class PtxasError(RuntimeError):
    """nvcc is missing, failed, or printed something we could not read."""


class BuildError(PtxasError):
    """nvcc rejected the source (a compile error, or a kernel over a hardware limit)."""


@dataclass(frozen=True)
class KernelResources:
    """Per-thread registers and per-block static shared memory of one compiled kernel."""

    registers: int
    shared_bytes: int
    spill_store_bytes: int
    spill_load_bytes: int
    stack_bytes: int


def find_nvcc() -> str:
    """Path of nvcc: ``$TVM_STITCH_NVCC``, then ``PATH``, then ``/usr/local/cuda/bin``."""
    candidates = [os.environ.get("TVM_STITCH_NVCC"), shutil.which("nvcc"),
                  "/usr/local/cuda/bin/nvcc"]
    for path in candidates:
        if path and os.path.isfile(path):
            return path
    raise PtxasError("nvcc not found: install the CUDA toolkit or set TVM_STITCH_NVCC")


def parse_ptxas(output: str) -> dict[str, KernelResources]:
    """Read ``ptxas -v`` output into resources per entry function (kernel)."""
    frames: dict[str, tuple[int, int, int]] = {}
    used: dict[str, tuple[int, int]] = {}
    entry: str | None = None
    properties: str | None = None
    for line in output.splitlines():
        if m := _ENTRY.search(line):
            entry = m.group(1)
        elif m := _PROPERTIES.search(line):
            properties = m.group(1)
        elif (m := _FRAME.search(line)) and properties is not None:
            frames[properties] = (int(m.group(1)), int(m.group(2)), int(m.group(3)))
        elif (m := _USED.search(line)) and entry is not None:
            smem = _SMEM.search(line)
            used[entry] = (int(m.group(1)), int(smem.group(1)) if smem else 0)
            entry = None
    resources = {}
    for name, (registers, smem) in used.items():
        stack, stores, loads = frames.get(name, (0, 0, 0))
        resources[name] = KernelResources(registers, smem, stores, loads, stack)
    return resources


def ptxas_resources(source: str, arch: str = "sm_90") -> dict[str, KernelResources]:
    """Compile CUDA ``source`` for ``arch`` (``sm_80``, ``sm_90``, ...) and return the
    resources of every kernel in it, keyed by kernel name. Cached by source hash."""
    if not _ARCH.fullmatch(arch):
        raise ValueError(f"architecture {arch!r} is not of the form sm_XX")
    nvcc = find_nvcc()
    key = hashlib.sha256("\0".join((nvcc, arch, source)).encode()).hexdigest()
    if key not in _cache:
        _cache[key] = _compile(nvcc, source, arch)
    return dict(_cache[key])


def _compile(nvcc: str, source: str, arch: str) -> dict[str, KernelResources]:
    with tempfile.TemporaryDirectory(prefix="tvm_stitch_ptxas_") as tmp:
        src = os.path.join(tmp, "kernels.cu")
        with open(src, "w") as f:
            f.write(source)
        cmd = [nvcc, "-cubin", f"-arch={arch}", *_NVCC_OPTIONS, "-Xptxas", "-v",
               "-o", os.path.join(tmp, "kernels.cubin"), src]
        proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    output = proc.stdout + proc.stderr
    if proc.returncode != 0:
        raise BuildError(f"nvcc failed ({' '.join(cmd)}):\n{output}")
    resources = parse_ptxas(output)
    if not resources:
        raise PtxasError(f"no kernel found in the ptxas output:\n{output}")
    return resources


_GLOBAL_ACCESS = re.compile(r"\b((?:ld|st)\.global[.\w]*)")
_PTX_ENTRY = re.compile(r"\.entry\s+(\w+)")

_WIDTH_BYTES = {"b8": 1, "u8": 1, "s8": 1, "b16": 2, "u16": 2, "s16": 2, "f16": 2,
                "b32": 4, "u32": 4, "s32": 4, "f32": 4, "b64": 8, "u64": 8, "s64": 8,
                "f64": 8}


def global_accesses(source: str, arch: str = "sm_90") -> dict[str, Counter[str]]:
    """The global load and store instructions (``ld.global.nc.v4.u32``, ...) of each kernel
    of CUDA ``source``, counted in the PTX nvcc makes of it for ``arch`` with the options
    TVM's nvcc path uses: the width a thread moves per access (``access_bytes``)."""
    if not _ARCH.fullmatch(arch):
        raise ValueError(f"architecture {arch!r} is not of the form sm_XX")
    nvcc = find_nvcc()
    with tempfile.TemporaryDirectory(prefix="tvm_stitch_ptx_") as tmp:
        src, ptx = os.path.join(tmp, "kernels.cu"), os.path.join(tmp, "kernels.ptx")
        with open(src, "w") as f:
            f.write(source)
        cmd = [nvcc, "-ptx", f"-arch={arch}", *_NVCC_OPTIONS, "-o", ptx, src]
        proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
        if proc.returncode != 0:
            raise BuildError(f"nvcc failed ({' '.join(cmd)}):\n{proc.stdout + proc.stderr}")
        with open(ptx) as f:
            text = f.read()
    found: dict[str, Counter[str]] = {}
    starts = [(m.start(), m.group(1)) for m in _PTX_ENTRY.finditer(text)]
    for (start, name), (end, _) in zip(starts, [*starts[1:], (len(text), "")], strict=True):
        found[name] = Counter(_GLOBAL_ACCESS.findall(text, start, end))
    return found


def access_bytes(instruction: str) -> int:
    """Bytes one thread moves with a global load or store instruction of PTX
    (``ld.global.nc.v4.u32``: 16)."""
    parts = instruction.split(".")
    lanes = next((int(p[1:]) for p in parts if p in ("v2", "v4", "v8")), 1)
    return lanes * _WIDTH_BYTES[parts[-1]]


def lowered_resources(lowered: LoweredFunc, arch: str | None = None
                      ) -> dict[str, KernelResources]:
    """Resources of each kernel of a PrimFunc lowered for CUDA; ``arch`` defaults to the
    architecture it was lowered for."""
    if lowered.target.kind.name != "cuda":
        raise ValueError(f"{lowered.name}: lowered for {lowered.target.kind.name}, not cuda")
    arch = arch or str(lowered.target.arch)
    return ptxas_resources(lowered.source(), arch)
