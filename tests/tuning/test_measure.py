"""The measurement layer of the tuner: stitched kernels timed on the SIMT runner, directly and
through TVM's RPC tracker and a server, and built for CUDA by MetaSchedule's LocalBuilder."""

from __future__ import annotations

import functools
import shutil
import tarfile
import time
from pathlib import Path

import numpy as np
import pytest
import tvm
from tvm import tirx
from tvm.s_tir import meta_schedule as ms
from tvm.script import tirx as T

from tvm_stitch import pipeline
from tvm_stitch.frontend.onnx import import_model
from tvm_stitch.plan import GROUP_ATTR
from tvm_stitch.schedule.grid_barrier import CUDA_DEFINITION
from tvm_stitch.target import cuda_target
from tvm_stitch.tuning import measure
from tvm_stitch.tuning.measure import (
    LocalRunner,
    MeasureInput,
    RPCRunner,
    RunnerKind,
    SimtRunner,
    arguments,
    deserialize,
    runner_of,
    serialize,
    zeroed_params,
)
from tvm_stitch.workloads import micro

STATE = "grid_barrier_state"


@functools.cache
def _kernel(kind: str) -> tirx.PrimFunc:
    """The one stitched kernel of a small model: a row group (layer norm, softmax, add) or a
    Global-stitched layer-norm backward (column sums after a grid barrier)."""
    model = {"rows": micro.layernorm_softmax_add((64, 256)),
             "global": micro.layernorm_backward((256, 128))}[kind]
    scheduled = pipeline.lower(import_model(model), "cuda", flow="stitch")
    (func,) = [f for _, f in scheduled.functions_items()
               if isinstance(f, tirx.PrimFunc) and f.attrs is not None and GROUP_ATTR in f.attrs]
    return func


@T.prim_func(s_tir=True)
def _unscheduled(x: T.Buffer((64,), "float32"), y: T.Buffer((64,), "float32")):
    for i in range(64):
        with T.sblock("add"):
            vi = T.axis.spatial(64, i)
            y[vi] = x[vi] + T.float32(1)


def _inputs() -> list[MeasureInput]:
    target = cuda_target()
    return [MeasureInput("rows", _kernel("rows"), target),
            MeasureInput("global", _kernel("global"), target),
            MeasureInput("broken", _unscheduled, target)]


def _assert_timed_but_broken(results: list[measure.MeasureResult]) -> None:
    assert [r.key for r in results] == ["rows", "global", "broken"]
    for r in results[:2]:
        assert r.error == "" and r.seconds is not None and r.seconds > 0, r
    assert results[2].seconds is None and results[2].error


def test_zeroed_params_are_the_grid_barrier_state() -> None:
    assert zeroed_params(_kernel("rows")) == ()
    assert zeroed_params(_kernel("global")) == (STATE,)


def test_arguments_are_random_except_the_state() -> None:
    func = _kernel("global")
    arrays = arguments(func)
    assert [a.shape for a in arrays] == [tuple(int(d) for d in p.shape) for p in func.params]
    assert [str(a.dtype) for a in arrays] == [str(p.dtype) for p in func.params]
    state = [p.name for p in func.params].index(STATE)
    for i, a in enumerate(arrays):
        if i == state:
            assert not a.any()
        else:
            assert a.std() > 0.1 and np.abs(a).max() <= 1
    # MetaSchedule's allocation hook: the same values, on the device
    args_info = [a.as_json() for a in ms.arg_info.ArgInfo.from_prim_func(func)]
    hook = measure._Arguments((state,), measure.SEED)
    (on_device,) = hook.local(tvm.cpu(), args_info, 1)
    for t, a in zip(on_device, arrays, strict=True):
        np.testing.assert_array_equal(t.numpy(), a)


def test_serialized_kernels_read_back_the_same() -> None:
    for kind in ("rows", "global"):
        func = _kernel(kind)
        tvm.ir.assert_structural_equal(deserialize(serialize(func)), func)


def test_runner_of_makes_a_runner_of_the_kind() -> None:
    with runner_of(RunnerKind.SIMT, runs=2) as runner:
        assert isinstance(runner, SimtRunner) and runner.kind is RunnerKind.SIMT
        assert runner.runs == 2


def test_simt_runner_times_stitched_kernels_and_reports_a_broken_one() -> None:
    with SimtRunner(runs=2, timeout_sec=120) as runner:
        results = runner.measure(_inputs())
    _assert_timed_but_broken(results)
    assert "launcher cannot run" in results[2].error  # not GPU-scheduled


def test_rpc_runner_times_on_a_simt_server(simt_server: tuple[int, str]) -> None:
    tracker_port, key = simt_server
    start = time.monotonic()
    with RPCRunner("127.0.0.1", tracker_port, key, simt=True, number=2, max_workers=1,
                   session_timeout_sec=60, queue_timeout_sec=30) as runner:
        assert runner.kind is RunnerKind.RPC
        results = runner.measure(_inputs())
    _assert_timed_but_broken(results)
    assert "LocalBuilder" in results[2].error and "not a GPU-scheduled kernel" in results[2].error
    assert time.monotonic() - start < 120


def _device_code(artifact: str) -> bytes:
    """The serialised device module of a built artifact (CUDA source: TVM 0.27 compiles it
    when the module is loaded on a GPU)."""
    with tarfile.open(artifact) as tar:
        member = tar.extractfile("devc.o")
        assert member is not None
        return member.read()


def test_local_builder_builds_cuda_artifacts_without_a_gpu() -> None:
    with LocalRunner(max_workers=1, build_timeout_sec=60) as runner:
        built = runner.build(_inputs())
    try:
        assert [b.key for b in built] == ["rows", "global", "broken"]
        rows, glob, broken = built
        assert rows.artifact and glob.artifact and not rows.error and not glob.error
        # the builder's worker ran our CUDA post-processing: the barrier is defined where called
        assert CUDA_DEFINITION.strip().encode() in _device_code(glob.artifact)
        assert b"tvm_stitch_grid_sync" not in _device_code(rows.artifact)
        assert broken.artifact is None and "not a GPU-scheduled kernel" in broken.error
    finally:
        for b in built:
            if b.artifact:
                shutil.rmtree(Path(b.artifact).parent)


@pytest.mark.skipif(not tvm.cuda(0).exist, reason="needs a CUDA GPU (tvm.cuda(0).exist)")
def test_local_runner_times_stitched_kernels_on_the_gpu(monkeypatch: pytest.MonkeyPatch
                                                         ) -> None:
    # TVM compiles the CUDA source when the module is loaded, with NVRTC unless told
    # otherwise; NVRTC needs the cuda-bindings package (the runner's worker inherits this)
    try:
        import cuda.bindings  # noqa: F401
    except ImportError:
        monkeypatch.setenv("TVM_CUDA_COMPILE_MODE", "nvcc")
    with LocalRunner(max_workers=1, run_timeout_sec=60) as runner:
        results = runner.measure(_inputs())
    _assert_timed_but_broken(results)
