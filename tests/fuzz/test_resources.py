"""Resource checks on every kernel: threads, shared memory, registers, spills, waves."""

from __future__ import annotations

import pytest
from fuzz_models import F32, make_model
from onnx import helper
from tvm.ir import IRModule
from tvm.script import tirx as T

from tvm_stitch import verify
from tvm_stitch.analysis import KernelResources
from tvm_stitch.plan import GROUP_ATTR, Edge, Group, Launch, Scheme, StitchPlan
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


@T.prim_func(s_tir=True)
def row_per_thread(a: T.Buffer((128, 64), "float32"), b: T.Buffer((128, 64), "float32")):
    """Each thread keeps a whole 64-element row in a thread-local array, read back reversed."""
    T.func_attr({"tirx.is_scheduled": True, GROUP_ATTR: 0})
    row = T.sblock_alloc_buffer((64,), scope="local")
    for i in T.thread_binding(4, thread="blockIdx.x"):
        for t in T.thread_binding(32, thread="threadIdx.x"):
            for j in range(64):
                with T.sblock("load"):
                    vr = T.axis.spatial(128, i * 32 + t)
                    vj = T.axis.spatial(64, j)
                    row[vj] = a[vr, vj]
            for j in range(64):
                with T.sblock("store"):
                    vr = T.axis.spatial(128, i * 32 + t)
                    vj = T.axis.spatial(64, j)
                    b[vr, vj] = row[63 - vj] * T.float32(2)


def test_thread_local_arrays_over_the_register_budget_are_reported() -> None:
    mod = IRModule({"row_per_thread": row_per_thread})
    launch = Launch("H200", 32, 0, 1, 48, 132, 4)
    plan = StitchPlan(groups=(Group(0, ("a",), ("x",), ("y",), (), (),
                                    function="row_per_thread", launch=launch),))
    (kernel,) = check_resources(mod, plan, archs=("sm_90",)).kernels
    assert kernel.stitched and kernel.local_elements == 64 and kernel.register_budget == 24
    assert any("thread-local array row of 64 elements, more than the plan's register "
               "budget (24)" in p for p in kernel.problems), kernel.problems


def test_stitched_kernels_may_have_no_stack_frame(monkeypatch: pytest.MonkeyPatch) -> None:
    def fake(source: str, arch: str) -> dict[str, KernelResources]:
        return {"many_blocks_kernel": KernelResources(32, 0, 0, 0, 16)}

    monkeypatch.setattr(resources, "ptxas_resources", fake)
    mod = IRModule({"many_blocks": many_blocks.with_attr(GROUP_ATTR, 0)})
    (kernel,) = check_resources(mod, StitchPlan(), archs=("sm_90",)).kernels
    assert kernel.problems == ["16 B of local memory (stack frame) per thread"]
    (tvm_kernel,) = check_resources(IRModule({"many_blocks": many_blocks}),
                                    archs=("sm_90",)).kernels
    assert tvm_kernel.problems == []  # TVM's own kernels may keep small arrays


def test_a_persistent_grid_is_held_to_the_wave_of_the_gpu_it_was_planned_for() -> None:
    # 100000 blocks exceed a wave everywhere; what matters is which GPU's wave is checked
    mod = IRModule({"many_blocks": many_blocks})
    edges = (Edge("a", "b", Scheme.GLOBAL),)

    def plan_for(gpu: str) -> StitchPlan:
        return StitchPlan(groups=(Group(0, ("a", "b"), ("x",), ("y",), (), edges,
                                        function="many_blocks",
                                        launch=Launch(gpu, 32, 0, 32, 64, 132, 100000)),))

    on_a100 = check_resources(mod, plan_for("A100"), archs=("sm_80",))
    assert any("more than one wave" in v for v in on_a100.tvm_violations)
    planned_for_h200 = check_resources(mod, plan_for("H200"), archs=("sm_80",))
    assert not any("more than one wave" in v for v in planned_for_h200.tvm_violations)


@T.prim_func(s_tir=True)
def huge_shared(a: T.Buffer((16384,), "float32"), b: T.Buffer((16384,), "float32")):
    """64 KB of static shared memory in one block: nvcc refuses to build it (dlight's GEMV for
    K=4097 did this, fuzz seed 2027 graph 89)."""
    T.func_attr({"tirx.is_scheduled": True})
    s = T.sblock_alloc_buffer((16384,), scope="shared")
    for _i in T.thread_binding(1, thread="blockIdx.x"):
        for _j in T.thread_binding(1, thread="threadIdx.x"):
            for k in range(16384):
                with T.sblock("load"):
                    vk = T.axis.remap("S", [k])
                    s[vk] = a[vk]
            for k in range(16384):
                with T.sblock("store"):
                    vk = T.axis.remap("S", [k])
                    b[vk] = s[16383 - vk]


def test_a_kernel_nvcc_rejects_is_a_problem_of_that_kernel() -> None:
    """Not a crash of the checker: TVM's kernel is reported as TVM's, a stitched one as ours."""
    tvm_report = check_resources(IRModule({"huge_shared": huge_shared}), archs=("sm_80",))
    (line,) = tvm_report.tvm_violations
    assert "does not build for sm_80" in line and "too much shared data" in line, line
    assert not tvm_report.violations
    stitched = huge_shared.with_attr(GROUP_ATTR, 0)
    (line,) = check_resources(IRModule({"huge_shared": stitched}), archs=("sm_80",)).violations
    assert "does not build for sm_80" in line


def test_a_modules_kernels_build_as_one_unit_and_alone_where_it_fails(monkeypatch) -> None:
    """Every PrimFunc of a module is compiled in one nvcc run per architecture, with the
    resources each gets alone; where that unit does not build, each is compiled alone, so the
    kernel nvcc rejects is named and the others are checked."""
    built: list[str] = []
    compile_ = resources.ptxas._compile

    def counting(nvcc: str, source: str, arch: str) -> dict[str, KernelResources]:
        built.append(source)
        return compile_(nvcc, source, arch)

    monkeypatch.setattr(resources.ptxas, "_compile", counting)
    resources.ptxas._cache.clear()
    mod = IRModule({"many_blocks": many_blocks, "wide_block": wide_block})
    together = {k.kernel: _resources(k) for k in check_resources(mod, archs=("sm_90",)).kernels}
    assert len(built) == 1 and "wide_block_kernel" in built[0] \
        and "many_blocks_kernel" in built[0]
    alone = {k.kernel: _resources(k) for name in ("many_blocks", "wide_block")
             for k in check_resources(IRModule({name: mod[name]}), archs=("sm_90",)).kernels}
    assert together == alone and len(together) == 2 and all(r[0] for r in together.values())

    built.clear()
    report = check_resources(IRModule({"many_blocks": many_blocks, "huge_shared": huge_shared}),
                             archs=("sm_80",))
    assert len(built) == 3  # the unit, then each alone
    (line,) = report.tvm_violations
    assert "huge_shared/" in line and "does not build for sm_80" in line, line
    (fine,) = [k for k in report.kernels if k.func == "many_blocks"]
    assert fine.registers > 0 and not fine.problems


def _resources(check: resources.KernelCheck) -> tuple[int, int, int, int]:
    return check.registers, check.shared_bytes, check.spill_bytes, check.stack_bytes
