"""Resource checks on every kernel: threads, shared memory, registers, spills, waves."""

from __future__ import annotations

import pytest
from fuzz_models import F32, make_model
from onnx import helper
from tvm.ir import IRModule
from tvm.script import tirx as T

from tvm_stitch import verify
from tvm_stitch.analysis import KernelResources
from tvm_stitch.plan import Edge, Group, Scheme, StitchPlan
from tvm_stitch.testing import resources
from tvm_stitch.testing.resources import SMS, blocks_per_sm, check_resources


@T.prim_func(s_tir=True)
def wide_block(a: T.Buffer((4, 2048), "float32"), b: T.Buffer((4, 2048), "float32")):
    """2048 threads per block: more than CUDA allows."""
    T.func_attr({"tirx.is_scheduled": True})
    for i in T.thread_binding(4, thread="blockIdx.x"):
        for j in T.thread_binding(2048, thread="threadIdx.x"):
            with T.sblock("copy"):
                vi, vj = T.axis.remap("SS", [i, j])
                b[vi, vj] = a[vi, vj] * T.float32(2)


@T.prim_func(s_tir=True)
def many_blocks(a: T.Buffer((100000, 32), "float32"), b: T.Buffer((100000, 32), "float32")):
    """100000 blocks of 32 threads: fine, unless the kernel synchronises its whole grid."""
    T.func_attr({"tirx.is_scheduled": True})
    for i in T.thread_binding(100000, thread="blockIdx.x"):
        for j in T.thread_binding(32, thread="threadIdx.x"):
            with T.sblock("copy"):
                vi, vj = T.axis.remap("SS", [i, j])
                b[vi, vj] = a[vi, vj] + T.float32(1)


def test_occupancy_follows_the_cuda_limits() -> None:
    a100, h200 = SMS["sm_80"], SMS["sm_90"]
    assert blocks_per_sm(a100, 256, 32, 0) == 8  # threads
    assert blocks_per_sm(a100, 32, 16, 0) == 32  # blocks per SM
    assert blocks_per_sm(a100, 128, 255, 0) == 2  # registers: 8192 per warp x 4 warps
    assert blocks_per_sm(a100, 128, 32, 48 * 1024) == 3  # shared memory (+1 KB reserved)
    assert blocks_per_sm(h200, 128, 32, 48 * 1024) == 4
    assert blocks_per_sm(a100, 1024, 128, 0) == 0  # 131072 registers: cannot launch
    assert a100.sms == 108 and h200.sms == 132


def test_a_stitched_module_is_within_limits_on_both_architectures(flow: str) -> None:
    model = make_model([helper.make_node("Softmax", ["x"], ["y"], axis=-1)],
                       {"x": ([64, 1000], F32)}, {"y": ([64, 1000], F32)})
    report = check_resources(verify.compile_model(model, flow))
    assert {k.arch for k in report.kernels} == {"sm_80", "sm_90"}
    assert report.violations == [] and report.tvm_violations == []
    assert all(k.registers > 0 and k.spill_bytes == 0 for k in report.kernels)


def test_too_many_threads_are_reported() -> None:
    report = check_resources(IRModule({"wide_block": wide_block}), archs=("sm_90",))
    (problem,) = report.tvm_violations  # not a stitched kernel: TVM's own schedule
    assert "2048 threads per block" in problem and report.violations == []


def test_grid_barrier_kernels_must_fit_in_one_wave() -> None:
    mod = IRModule({"many_blocks": many_blocks})
    assert check_resources(mod, archs=("sm_80",)).tvm_violations == []
    plan = StitchPlan(groups=(Group(0, ("a", "b"), ("x",), ("y",), (),
                                    (Edge("a", "b", Scheme.GLOBAL),), function="many_blocks"),))
    report = check_resources(mod, plan, archs=("sm_80",))
    (kernel,) = report.kernels
    assert kernel.grid_barrier and kernel.wave == 108 * 32
    assert "grid barrier with 100000 blocks, more than one wave (3456)" in report.tvm_violations[0]


def test_spills_and_register_overuse_are_reported(monkeypatch: pytest.MonkeyPatch) -> None:
    def fake(source: str, arch: str) -> dict[str, KernelResources]:
        return {"many_blocks_kernel": KernelResources(255, 50000, 16, 8, 24)}

    monkeypatch.setattr(resources, "ptxas_resources", fake)
    (problems,) = [k.problems for k in check_resources(IRModule({"many_blocks": many_blocks}),
                                                       archs=("sm_90",)).kernels]
    assert any(p.startswith("spills 24 B") for p in problems)
    assert any("50000 B of shared memory" in p for p in problems)
    assert not any("register file" in p for p in problems)  # 255 x 32 threads fit
