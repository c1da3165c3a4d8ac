"""Targets: the GPU we compile for, and the OpenCL target the CPU SIMT runner builds with."""

from __future__ import annotations

import argparse
import json
from collections.abc import Mapping

from tvm.target import Target

DEFAULT_TARGET = "cuda:sm_90"

# Per-block limits we schedule against. 48 KB is CUDA's static shared-memory limit per block
# on every architecture we target; larger needs dynamic shared memory and an opt-in.
MAX_THREADS_PER_BLOCK = 1024
MAX_SHARED_MEMORY_PER_BLOCK = 49152
WARP_SIZE = 32

SIMT_CONCURRENT_BLOCKS = 8
"""Work-groups the CPU SIMT runner executes at once: it starts PoCL with this many host threads
(``POCL_MAX_PTHREAD_COUNT``) unless the environment sets another count. A kernel with a grid
barrier runs with its real barrier only when its grid fits; schedules for the OpenCL target
size persistent grids to it."""

SIMT_MAX_WORK_ITEMS = 4096
"""Most work-items of one work-group on the SIMT runner (PoCL's CPU device). A thread-block
cluster runs there as one work-group, so clusters of more threads than this are not built:
every kernel the stitcher emits must run on the SIMT runner."""


def cuda_target(arch: str = "sm_90") -> Target:
    """A CUDA target for ``arch`` with the limits MetaSchedule and our schedules read."""
    return Target(
        {
            "kind": "cuda",
            "arch": arch,
            "max_threads_per_block": MAX_THREADS_PER_BLOCK,
            "max_num_threads": MAX_THREADS_PER_BLOCK,
            "max_shared_memory_per_block": MAX_SHARED_MEMORY_PER_BLOCK,
            "thread_warp_size": WARP_SIZE,
        }
    )


def opencl_target() -> Target:
    """The OpenCL target used to run GPU-scheduled TIR on PoCL.

    The limits match CUDA's so that a kernel scheduled for CUDA passes TVM's checks here too.
    The warp size stays 1: PoCL's CPU device has no sub-group shuffles, so TVM lowers
    cross-thread reductions through shared memory and barriers, which PoCL executes faithfully.
    """
    return Target(
        {
            "kind": "opencl",
            "max_threads_per_block": MAX_THREADS_PER_BLOCK,
            "max_num_threads": MAX_THREADS_PER_BLOCK,
            "max_shared_memory_per_block": MAX_SHARED_MEMORY_PER_BLOCK,
            "thread_warp_size": 1,
        }
    )


TargetSpec = str | Mapping[str, object] | Target
"""What ``parse_target`` accepts: our shorthand, TVM's JSON form (a dict or its JSON text), or
a Target."""

_KINDS = ("cuda", "opencl")


def parse_target(spec: TargetSpec) -> Target:
    """Turn ``cuda``, ``cuda:sm_80``, ``opencl``, TVM 0.27's JSON form (``{"kind": "cuda",
    "arch": "sm_90"}``, as a dict or as JSON text) or a Target into a Target.

    A CUDA target in JSON form gets the per-block limits of ``cuda_target`` wherever it does not
    set them, so ``{"kind": "cuda", "arch": "sm_90"}`` and ``cuda:sm_90`` are the same target.
    Raises ValueError on anything else, naming the accepted forms; TVM's old string form
    (``"cuda -arch=sm_90"``), which TVM 0.27 no longer parses, gets the forms to write instead.
    """
    if isinstance(spec, Target):
        return spec
    if isinstance(spec, Mapping):
        return _json_target(spec)
    text = spec.strip()
    if text.startswith("{"):
        try:
            data = json.loads(text)
        except json.JSONDecodeError as err:
            raise ValueError(f"target {spec!r} is not valid JSON: {err}") from None
        if not isinstance(data, dict):
            raise ValueError(f"target {spec!r}: a JSON target is an object with a \"kind\"")
        return _json_target(data)
    if len(text.split()) > 1:
        raise ValueError(_old_form_message(text))
    kind, _, arch = text.partition(":")
    if kind == "cuda":
        return cuda_target(arch or "sm_90")
    if kind == "opencl" and not arch:
        return opencl_target()
    raise ValueError(f"unknown target {spec!r}: use 'cuda', 'cuda:sm_XX', 'opencl' or TVM's "
                     'JSON form, e.g. {"kind": "cuda", "arch": "sm_90"}')


def _json_target(data: Mapping[str, object]) -> Target:
    """A Target of TVM's JSON form; CUDA gets our per-block limits where it sets none."""
    kind = data.get("kind")
    if kind not in _KINDS:
        raise ValueError(f"target {dict(data)!r}: kind {kind!r} is not supported; use "
                         f"{' or '.join(map(repr, _KINDS))}")
    if kind == "cuda":
        defaults = json.loads(str(cuda_target(str(data.get("arch", "sm_90")))))
        return Target({**defaults, **data})
    return Target(dict(data))


def _old_form_message(text: str) -> str:
    """The error for TVM's old string form: the same target in JSON form, and in our
    shorthand when it has one."""
    kind, *options = text.split()
    data: dict[str, object] = {"kind": kind}
    for option in options:
        key, sep, value = option.lstrip("-").partition("=")
        data[key] = (int(value) if value.isdigit() else value) if sep else True
    forms = [f"{json.dumps(data)} (TVM's JSON form: a dict in Python, that JSON text on the "
             "command line)"]
    if kind == "cuda" and set(data) <= {"kind", "arch"}:
        shorthand = f"cuda:{data['arch']}" if "arch" in data else "cuda"
        forms.append(f"{shorthand!r} (tvm-stitch's shorthand)")
    return (f"target {text!r} is in TVM's old string form, which TVM 0.27 no longer parses; "
            f"write {' or '.join(forms)}")


def target_argument(text: str) -> Target:
    """``parse_target`` for argparse's ``type=``: an invalid target is a usage error whose
    message says what to write instead."""
    try:
        return parse_target(text)
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from None


def describe(target: Target) -> dict[str, object]:
    """``target`` in TVM's JSON form, as plain data."""
    return json.loads(str(target))


def is_gpu(target: Target) -> bool:
    """True for targets whose kernels run as SIMT grids (CUDA, OpenCL)."""
    return target.kind.name in ("cuda", "opencl")


__all__ = ["DEFAULT_TARGET", "SIMT_CONCURRENT_BLOCKS", "SIMT_MAX_WORK_ITEMS", "TargetSpec",
           "cuda_target", "describe", "opencl_target", "parse_target", "is_gpu", "target_argument"]
