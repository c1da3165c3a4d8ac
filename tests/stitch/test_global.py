"""Global stitching: column reductions and what reads them back, on a persistent grid with
grid barriers; the barrier itself on the SIMT runner (real, split into phases, or refused)."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import onnx.numpy_helper
import pytest
import tvm
import tvm_ffi
from stitch_helpers import (
    assert_matches,
    import_onnx,
    kernel_count,
    lower_stitch,
    module_cuda_source,
    reference,
    run_simt,
    stitched_functions,
)
from tvm import relax, tirx
from tvm.script import tirx as T

from tvm_stitch.analysis import analyze
from tvm_stitch.plan import PhaseKind, Scheme, StitchPlan
from tvm_stitch.schedule import Unstitchable, kernel
from tvm_stitch.schedule.grid_barrier import (
    CUDA_DEFINITION,
    GRID_SYNC,
    count_grid_barriers,
    is_grid_sync,
)
from tvm_stitch.simt import SimtFunction, SimtModule
from tvm_stitch.simt.grid import GridTooLarge, split_phases
from tvm_stitch.simt.kernel import concurrent_work_groups
from tvm_stitch.target import SIMT_CONCURRENT_BLOCKS, cuda_target, opencl_target
from tvm_stitch.transform.stitch_fuse import stitch
from tvm_stitch.workloads import inputs as make_inputs
from tvm_stitch.workloads import micro


def _check(model, target="cuda"):
    scheduled, plan = lower_stitch(model, target)
    feeds = make_inputs(model, 0)
    assert_matches(run_simt(model, scheduled, feeds), reference(model, feeds))
    return scheduled, plan


def test_layer_norm_backward_is_one_persistent_kernel_with_one_barrier() -> None:
    model = micro.layernorm_backward((1024, 768))
    scheduled, plan = _check(model)  # more tiles than PoCL's work-groups: run as two phases
    (group,) = plan.groups
    assert not plan.fallbacks and len(group.ops) == 15
    assert [p.kind for p in group.phases] == ["rows", "columns"]
    assert group.phases[1].tasks == 2  # 768 columns, 512 threads: two column tasks
    assert group.grid_barriers == 1 and group.launch.grid <= group.launch.wave
    assert sum(e.scheme is Scheme.GLOBAL for e in group.edges) == 0  # outputs: no read-back
    ((name, func),) = stitched_functions(scheduled).items()
    assert kernel_count(func, name) == 1 and count_grid_barriers(func) == 1


def test_layer_norm_backward_real_size_traffic() -> None:
    scheduled, plan = lower_stitch(micro.layernorm_backward((8192, 768)))
    report = analyze(scheduled)
    assert len(report.kernels) == 1
    assert report.traffic_ratio <= 1.3


def test_batch_norm_training_runs_with_real_barriers_on_the_simt_device() -> None:
    model = micro.batchnorm_train((64, 48))
    scheduled, plan = _check(model, opencl_target())
    (group,) = plan.groups
    # the mean and the squares about it in one pass (an online variance), one column phase
    assert [p.kind for p in group.phases] == ["rows", "columns", "rows"]
    assert group.online_variance == ("x_red",), str(plan)
    assert group.launch.grid <= SIMT_CONCURRENT_BLOCKS <= concurrent_work_groups()
    ((name, func),) = stitched_functions(scheduled).items()
    simt = SimtFunction.from_primfunc(func, name)
    launch = simt.lowered.launches[0]
    # the grid fits the work-groups PoCL runs at once: the kernel runs whole, barriers real
    assert simt.grid_barriers.launches(launch.kernel, group.launch.grid,
                                       concurrent_work_groups()) == [launch.kernel]
    assert GRID_SYNC in simt.source


@pytest.mark.usefixtures("global_at_any_cost")  # (96, 40): TVM's one kernel is faster
def test_column_sum_feeding_element_wise_ops_and_a_loss() -> None:
    _, plan = _check(micro.column_sum((96, 40)))
    assert [p.kind for p in plan.groups[0].phases] == ["rows", "columns"]
    _, plan = _check(micro.logsoftmax_nll((24, 100)))
    (group,) = plan.groups
    # the mean over the (24, 1) losses reduces the rows and reshapes away the unit axis
    assert [op.partition(":")[2] for op in group.ops[-3:]] == ["mean", "reshape",
                                                                "tir_negative"], group.ops


def test_column_sum_tiles_columns_to_write_fewer_partial_sums() -> None:
    # a task is a warp-wide tile of a row tile's columns, whose 128 rows the block's 8 warps
    # split into lanes of 16 and whose lane sums it adds up: 16 row tiles (not 256 of 8) x 32
    # column tiles fill the 512 blocks
    scheduled, plan = _check(micro.column_sum((2048, 1024)))
    (group,) = plan.groups
    assert [(p.kind, p.tasks, p.column_tiles) for p in group.phases] == [
        ("rows", 512, 32), ("columns", 4, 1)]
    (kernel,) = analyze(scheduled).kernels
    partials = kernel.traffic.buffers["x_red_intermediate.rf"]
    assert (partials.read_bytes, partials.write_bytes) == (16 * 1024 * 4, 16 * 1024 * 4)
    assert kernel.traffic.buffers["x"].read_bytes == 2048 * 1024 * 4


def test_two_column_sums_tile_a_column_per_thread() -> None:
    # two column reductions in one row phase: no lanes, a column per thread (256 of 1024)
    x = onnx.helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [2048, 1024])
    nodes = [onnx.helper.make_node("ReduceSum", ["x", "axes"], ["s"], keepdims=0),
             onnx.helper.make_node("ReduceSumSquare", ["x", "axes"], ["q"], keepdims=0)]
    outputs = [onnx.helper.make_tensor_value_info(n, onnx.TensorProto.FLOAT, [1024])
               for n in ("s", "q")]
    graph = onnx.helper.make_graph(nodes, "two_sums", [x], outputs,
                                   [onnx.numpy_helper.from_array(np.array([0]), "axes")])
    model = onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", 18)])
    _, plan = _check(model)
    (group,) = plan.groups
    assert [(p.kind, p.tasks, p.column_tiles) for p in group.phases] == [
        ("rows", 512, 4), ("columns", 4, 1)]


def _stacked_reduction(op: str, rows: int, shape: tuple[int, int], after: str = ""):
    """A reduction over the leading axis of a (rows, *shape) input, the op ``after`` applied
    to its result: a column reduction of ``rows`` rows (what TVM's importer makes of a
    variadic Max, Min or Sum, which the stitch flow now folds element-wise instead)."""
    nodes = [onnx.helper.make_node(op, ["s", "axes"], ["r" if after else "y"], keepdims=0)]
    if after:
        nodes.append(onnx.helper.make_node(after, ["r"], ["y"]))
    graph = onnx.helper.make_graph(
        nodes, "stacked",
        [onnx.helper.make_tensor_value_info("s", onnx.TensorProto.FLOAT, [rows, *shape])],
        [onnx.helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, list(shape))],
        [onnx.numpy_helper.from_array(np.array([0], np.int64), "axes")])
    return onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", 18)])


@pytest.mark.usefixtures("columns_as_global")
@pytest.mark.parametrize("shape", [(16, 160), (257, 2)])
def test_column_space_blocks_stay_in_their_columns(shape: tuple[int, int]) -> None:
    # max(x, 1.5) as a max over a stacked axis: a column reduction of 2 rows whose columns
    # are combined by several blocks (16 x 160) or by one block with threads past the last
    # column (257 x 2), and a 2-D relu of them in the same phase
    scheduled, plan = lower_stitch(_stacked_reduction("ReduceMax", 2, shape, "Relu"))
    assert any(g.phases for g in plan.groups)
    simt = SimtModule(scheduled)
    x = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
    stacked = np.stack([x, np.full(shape, 1.5, np.float32)])
    for _ in range(3):
        np.testing.assert_allclose(simt(stacked)[0], np.maximum(x, 1.5))


@pytest.mark.usefixtures("global_at_any_cost", "columns_as_global")
@pytest.mark.parametrize(("op", "inputs", "shape", "tiles"), [
    ("Max", 2, (4, 768), 3), ("Min", 3, (8, 384), 3), ("Sum", 2, (4, 768), 3),
    ("Max", 3, (2, 1024), 2), ("Sum", 5, (2, 1024), 2)])
def test_column_tiles_of_one_row_tile_combine_the_right_columns(
        op: str, inputs: int, shape: tuple[int, int], tiles: int) -> None:
    # a reduction over a stacked axis of `inputs` rows: one row tile whose columns (a
    # block's width each) are split over tasks; with 768 or 384 columns in a line, a tile of
    # 1024 is not a box of the (4, 768) partial sums, and its write-out once wrote the whole
    # box, other tasks' columns included (fuzz case g370, a variadic op)
    scheduled, plan = lower_stitch(_stacked_reduction(f"Reduce{op}", inputs, shape))
    (group,) = [g for g in plan.groups if g.phases]
    assert [(p.kind, p.tasks, p.column_tiles) for p in group.phases] == [
        ("rows", tiles, tiles), ("columns", tiles, 1)]
    stacked = np.random.default_rng(0).standard_normal((inputs, *shape)).astype(np.float32)
    expected = {"Max": np.max, "Min": np.min, "Sum": np.sum}[op](stacked, axis=0)
    np.testing.assert_allclose(SimtModule(scheduled)(stacked)[0], expected, rtol=1e-6,
                               atol=1e-6)


def _colsum_kernel(target):
    model = micro.column_sum((256, 64))
    scheduled, _ = lower_stitch(model, target)
    ((name, func),) = stitched_functions(scheduled).items()
    x = make_inputs(model, 0)["x"]
    return name, func, x


def _without_barriers(func: tirx.PrimFunc) -> tirx.PrimFunc:
    def drop(stmt: tirx.Evaluate) -> tirx.Stmt:
        return tirx.Evaluate(tirx.IntImm("int32", 0)) if is_grid_sync(stmt) else stmt

    return tvm_ffi.structural_map(func, [(tirx.Evaluate, drop)])


def _run(func: tirx.PrimFunc, name: str, x: np.ndarray) -> tuple[np.ndarray, SimtFunction]:
    simt = SimtFunction.from_primfunc(func, name)
    args = [x]
    for p in simt.lowered.params[1:]:
        dtype = str(p.dtype)
        args.append(np.zeros([int(d) for d in p.shape], dtype))
    simt(*args)
    return args[2], simt


def _sums_without_barriers(target: str) -> np.ndarray:
    """The column sums of the kernel for ``target`` with its grid barrier removed."""
    name, func, x = _colsum_kernel(target)
    wrong, simt = _run(_without_barriers(func), name, x)
    assert not simt.grid_barriers.phases  # nothing to split at: one launch, no barrier
    return wrong


def _sums_without_barriers_one_block_at_a_time(target: str, tmp_path: Path) -> np.ndarray:
    """``_sums_without_barriers`` in a process whose PoCL runs one work-group at a time
    (``POCL_MAX_PTHREAD_COUNT`` is read once, when PoCL starts)."""
    out = tmp_path / "sums.npy"
    script = ("import numpy as np, test_global as t\n"
              "from tvm_stitch.simt.kernel import concurrent_work_groups\n"
              "from tvm_stitch.transform import yardstick\n"
              "yardstick.TIME_MARGIN = float('inf')  # global_at_any_cost\n"
              "yardstick.ONE_KERNEL_MARGIN = float('inf')\n"
              "assert concurrent_work_groups() == 1\n"
              f"np.save({str(out)!r}, t._sums_without_barriers({target!r}))\n")
    subprocess.run([sys.executable, "-c", script], cwd=Path(__file__).parent, check=True,
                   env={**os.environ, "POCL_MAX_PTHREAD_COUNT": "1"})
    return np.load(out)


@pytest.mark.usefixtures("global_at_any_cost")
@pytest.mark.parametrize("target", ["cuda", "opencl"])
def test_a_missing_grid_barrier_gives_wrong_sums(target: str, tmp_path: Path) -> None:
    name, func, x = _colsum_kernel(target)
    assert count_grid_barriers(func) == 1
    right, _ = _run(func, name, x)
    np.testing.assert_allclose(right, x.sum(0), rtol=1e-5, atol=1e-5)
    if target == "cuda":  # more blocks than PoCL runs at once: some run after others read
        wrong = _sums_without_barriers(target)
    else:
        # the grid fits the work-groups PoCL runs at once (the barrier is real), so without it
        # the sums would depend on how the blocks race. One work-group at a time (PoCL's one
        # thread takes them in index order): block 0, whose column task adds up the partial
        # sums, reads them before the other blocks have written theirs
        wrong = _sums_without_barriers_one_block_at_a_time(target, tmp_path)
    assert not np.allclose(wrong, x.sum(0), rtol=1e-5, atol=1e-5)


@pytest.mark.usefixtures("global_at_any_cost")
def test_barrier_state_stays_valid_across_launches() -> None:
    name, func, x = _colsum_kernel(opencl_target())
    simt = SimtFunction.from_primfunc(func, name)
    state_index = [p.name for p in simt.lowered.params].index("grid_barrier_state")
    args = [np.zeros([int(d) for d in p.shape], str(p.dtype)) for p in simt.lowered.params]
    args[0] = x
    for launch in range(1, 4):  # the same state, never reset by the host
        simt(*args)
        np.testing.assert_allclose(args[2], x.sum(0), rtol=1e-5, atol=1e-5)
        assert args[state_index].tolist() == [0, launch]  # count back to 0, generation +1


def test_a_persistent_grid_over_one_wave_is_refused() -> None:
    model = micro.column_sum((256, 64))
    mod = import_onnx(model)
    target = cuda_target()
    with target:
        legal = tvm.transform.Sequential([relax.transform.LegalizeOps(),
                                          relax.transform.AnnotateTIROpPattern(),
                                          relax.transform.FoldConstant()])(mod)
    fused, plan = stitch(legal, target)
    (group,) = plan.groups
    func = fused[group.function]
    kernel(func, group)  # as planned: fine
    over = dataclasses.replace(group, launch=dataclasses.replace(
        group.launch, grid=group.launch.wave + 1))
    with pytest.raises(Unstitchable, match="must fit one wave"):
        kernel(func, over)


@T.prim_func(s_tir=True)
def _barrier_in_a_loop(a: T.Buffer((16, 32), "float32"), state: T.Buffer((2,), "uint32"),
                       b: T.Buffer((16, 32), "float32")):
    T.func_attr({"tirx.is_scheduled": True})
    for i in T.thread_binding(16, thread="blockIdx.x"):
        for _k in range(2):
            for j in T.thread_binding(32, thread="threadIdx.x"):
                with T.sblock("copy"):
                    vi, vj = T.axis.remap("SS", [i, j])
                    b[vi, vj] = a[vi, vj] + T.float32(1)
            T.evaluate(T.call_extern("void", "tvm_stitch_grid_sync", state.data))


def test_a_grid_too_large_to_run_or_split_is_refused() -> None:
    simt = SimtFunction.from_primfunc(_barrier_in_a_loop, "looped")
    assert simt.grid_barriers.phases == {"looped_kernel": []}
    a = np.ones((16, 32), "float32")
    with pytest.raises(GridTooLarge, match="cannot be split at its barriers"):
        simt(a, np.zeros(2, "uint32"), np.zeros_like(a))


def _value_bound_in_phase_0(used_after_the_barrier: bool) -> tirx.PrimFunc:
    """A lowered grid-barrier kernel that binds a loaded value before its barrier, read
    after it or not."""

    @T.prim_func(s_tir=True)
    def kernel(a_ptr: T.handle("float32", "global"), b_ptr: T.handle("float32", "global"),
               state_ptr: T.handle("uint32", "global")):
        a = T.decl_buffer((64,), data=a_ptr)
        b = T.decl_buffer((64,), data=b_ptr)
        state = T.decl_buffer((2,), "uint32", data=state_ptr)
        with T.launch_thread("blockIdx.x", 2) as bx:
            with T.launch_thread("threadIdx.x", 32) as tx:
                v: T.let[T.float32] = a[bx * 32 + tx]
                b[bx * 32 + tx] = v
                T.call_extern("void", "tvm_stitch_grid_sync", state.data)
                b[bx * 32 + tx] = b[63 - bx * 32 - tx] + (v if used_after_the_barrier
                                                          else T.float32(1))
    return kernel


def test_a_value_loaded_in_one_phase_splits_only_when_no_later_phase_reads_it() -> None:
    # the online softmax's per-element update binds loaded values at the top level of a
    # lowered kernel whose one-iteration loops are gone (a split row of 512 on 512 threads)
    bodies, why, _ = split_phases(_value_bound_in_phase_0(False))
    assert len(bodies) == 2 and not why
    bodies, why, _ = split_phases(_value_bound_in_phase_0(True))
    assert not bodies and why == "the value of v is loaded before a grid barrier"


@pytest.mark.usefixtures("global_at_any_cost")
def test_cuda_source_defines_the_barrier_once() -> None:
    scheduled, _ = lower_stitch(micro.column_sum((64, 32)))
    source = module_cuda_source(scheduled, "sm_90")
    assert source.count(CUDA_DEFINITION.strip()) == 1
    assert source.index("tvm_stitch_grid_sync(unsigned int* state)") < source.index(
        "__global__")


def test_plan_of_a_global_group_round_trips() -> None:
    _, plan = lower_stitch(micro.batchnorm_train((32, 16)))
    assert StitchPlan.from_json(plan.to_json()) == plan
    text = str(plan)
    assert "phase 0 (rows" in text and "; grid barrier" in text and "launch " in text


@pytest.mark.parametrize("target", ["cuda", "opencl"])
@pytest.mark.parametrize(("build", "shape", "barriers"), [(micro.softmax, (4, 3000), 1),
                                                          (micro.layer_norm, (4, 4096), 1),
                                                          (micro.rms_norm, (4, 4096), 1)])
def test_few_long_rows_are_split_over_several_blocks(build, shape, barriers: int,
                                                     target: str) -> None:
    scheduled, plan = _check(build(shape), target)
    (group,) = plan.groups
    assert group.row_split > 1
    assert group.mapping.rows == shape[0] * group.row_split  # the sub-rows are mapped
    # every block combines its own row's partials after their barrier, where row blocks
    # alone read the combination (softmax's online (sum, maximum) pairs, layer norm's online
    # (squares, mean, count) triples, RMS norm's mean square) or a value computed from
    # combinations alone, so no column phase and barrier of its own makes it
    assert group.phases[0].kind is PhaseKind.ROWS and group.grid_barriers == barriers
    assert group.launch.grid <= group.launch.wave
    ((name, func),) = stitched_functions(scheduled).items()
    assert kernel_count(func, name) == 1


def test_task_splitting_fills_the_gpu_on_64_rows_of_30000() -> None:
    _, plan = lower_stitch(micro.softmax((64, 30000)))
    (group,) = plan.groups
    assert group.row_split == 4 and group.launch.grid == 256  # a block per SM or two
    # one barrier after the partial (sum, maximum) pairs of an online softmax, where the two
    # passes need one after the partial maxima and one after the partial sums
    assert group.online == ("T_softmax_maxelem",) and group.grid_barriers == 1


@pytest.mark.parametrize("target", ["cuda", "opencl"])
def test_a_whole_tensor_norm_is_split_and_its_scalars_combined_once(target: str) -> None:
    # LayerNormalization over axis 0 of (3, 4096): one row of 12288 elements, reduced to 0-d
    # mean and variance: every part sums its share, one thread combines each scalar
    gamma = onnx.numpy_helper.from_array(np.full((3, 4096), 1.5, np.float32), "g")
    graph = onnx.helper.make_graph(
        [onnx.helper.make_node("LayerNormalization", ["x", "g"], ["y"], axis=0)], "ln",
        [onnx.helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [3, 4096])],
        [onnx.helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [3, 4096])], [gamma])
    model = onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", 18)])
    _, plan = _check(model, target)
    assert plan.groups[0].row_split > 1 and plan.groups[0].mapping.rows > 1


@pytest.mark.parametrize("op", ["ReduceSum", "ReduceMax"])
def test_column_tiles_are_refused_with_an_input_staged_per_block(op: str) -> None:
    """A per-column input (``x - c``) staged once per block covers whole rows, so the row
    phase keeps whole rows rather than tiles of columns (fuzz seed 2026, graph 717)."""
    c = np.linspace(-1.0, 1.0, 64).astype(np.float32)
    f32 = onnx.TensorProto.FLOAT
    graph = onnx.helper.make_graph(
        [onnx.helper.make_node("Sub", ["x", "c"], ["s"]),
         onnx.helper.make_node(op, ["s", "axes"], ["y"], keepdims=0)], "staged_column_input",
        [onnx.helper.make_tensor_value_info("x", f32, [16, 64])],
        [onnx.helper.make_tensor_value_info("y", f32, [64])],
        [onnx.numpy_helper.from_array(c, "c"),
         onnx.numpy_helper.from_array(np.array([0], np.int64), "axes")])
    built = onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", 18)])
    scheduled, plan = lower_stitch(built)
    (group,) = plan.groups
    assert group.phases and all(p.column_tiles == 1 for p in group.phases)
    x = np.random.default_rng(0).standard_normal((16, 64)).astype(np.float32)
    reduce = {"ReduceSum": np.sum, "ReduceMax": np.max}[op]
    (y,) = run_simt(built, scheduled, {"x": x})
    np.testing.assert_allclose(y, reduce(x - c, axis=0), rtol=1e-5, atol=1e-5)


def test_a_split_row_takes_the_blocks_per_sm_its_grid_needs_and_their_registers() -> None:
    # fuzz graph 7321:1679: a LayerNorm over one row of (1, 16, 512, 512) split over 512
    # blocks of 256 threads, beside tanh and where outputs, spilled 20 B on sm_90 under a
    # launch bound of 5 blocks per SM (48 registers) that its shared memory allowed; 512
    # blocks put at most 4 on each of 132 SMs, which keep 64 registers
    _, plan = lower_stitch(micro.layer_norm((1, 1 << 22)))
    (group,) = plan.groups
    launch = group.launch
    assert group.row_split == launch.grid == 512
    assert (launch.blocks_per_sm, launch.max_registers) == (4, 64)
    assert launch.wave >= launch.grid  # every sub-row's block resident at the grid barriers
