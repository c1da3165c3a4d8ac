"""The cap on re-read input elements a thread keeps in registers (``cached_elements_cap``):
nvcc unrolls a thread's loops over its row elements and holds an input that a later loop
reads again in registers, so past the cap a Global group walks fewer rows per tile and a row
group falls back with the reason, rather than spilling."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper
from stitch_helpers import assert_matches, lower_stitch, reference, run_simt

from tvm_stitch.analysis import gpu_of_arch
from tvm_stitch.plan import DemotionKind
from tvm_stitch.schedule.occupancy import (
    REGISTERS_PER_CACHED_ELEMENT,
    RESERVED_REGISTERS,
    cached_elements_cap,
    launch_config,
    launch_for_cached,
)
from tvm_stitch.testing.differential import check_model
from tvm_stitch.workloads import inputs as make_inputs


def _model(nodes: list, shape: list[int], outputs: list[str],
           initializers: tuple = ()) -> onnx.ModelProto:
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
        [helper.make_tensor_value_info(o, TensorProto.FLOAT, shape) for o in outputs],
        initializer=list(initializers))
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_cap_is_a_share_of_the_launch_bound_registers() -> None:
    h200 = gpu_of_arch("sm_90")
    full = launch_config(h200, 1024, 0)
    assert full.max_registers == 64
    assert cached_elements_cap(full) == 64 // REGISTERS_PER_CACHED_ELEMENT == 32
    small = launch_config(h200, 64, 512)
    assert cached_elements_cap(small) == small.max_registers // REGISTERS_PER_CACHED_ELEMENT


def test_launch_bound_is_relaxed_for_the_cached_elements() -> None:
    h200 = gpu_of_arch("sm_90")
    planned = launch_config(h200, 256, 33024)
    assert (planned.blocks_per_sm, planned.max_registers) == (5, 48)
    relaxed = launch_for_cached(h200, planned, 16)
    assert (relaxed.blocks_per_sm, relaxed.max_registers) == (4, 64)
    assert relaxed.max_registers >= RESERVED_REGISTERS + 16 * REGISTERS_PER_CACHED_ELEMENT
    assert launch_for_cached(h200, planned, 12) == planned  # 24 + 2 x 12 = 48: room enough
    full = launch_config(h200, 1024, 0)  # no fewer blocks to take: the cap bounds the rest
    assert launch_for_cached(h200, full, 32) == full


def test_held_input_beside_an_output_read_inside_does_not_spill() -> None:
    # fuzz case 1229:4: x - 2 (an output), its layer norm, and x - 2 - x over rows of 4096 on
    # 256 threads: x is held, 16 elements per thread, and the scale read from global memory
    # in the normalising phase. At 5 blocks per SM (48 registers) ptxas spilled 72 B on sm_90;
    # the launch bound now takes 4 blocks per SM and 64 registers
    rows, length = 2048, 4096
    scale = numpy_helper.from_array(np.linspace(0.5, 1.5, length, dtype=np.float32), "scale")
    bias = numpy_helper.from_array(np.linspace(-1, 1, length, dtype=np.float32), "bias")
    two = numpy_helper.from_array(np.array(2.0, np.float32), "two")
    model = _model([helper.make_node("Sub", ["x", "two"], ["s"]),
                    helper.make_node("LayerNormalization", ["s", "scale", "bias"], ["n"],
                                     axis=-1),
                    helper.make_node("Sub", ["s", "x"], ["d"])],
                   [rows, length], ["s", "n", "d"], (scale, bias, two))
    _, plan = lower_stitch(model)
    (group,) = plan.groups
    assert any(b.name == "x" and b.level.value == "register" for b in group.buffers)
    assert (group.mapping.threads_per_row, group.launch.blocks_per_sm,
            group.launch.max_registers) == (256, 4, 64), group.launch
    outcome = check_model(model, "stitch", triage=False)
    assert outcome.kind == "ok" and not outcome.violations, (outcome.error, outcome.violations)


def test_input_re_read_from_global_memory_guards_only_its_last_step() -> None:
    # fuzz case 818987:14: a layer norm over both axes of x expanded to (2, 257, 127), rows
    # of 32639 on 1024 threads: x (shared by both rows, over the shared budget) is re-read
    # from global memory, 32 elements kept per thread. With the row's guard on every
    # unrolled step of the normalising walk ptxas spilled 8 B at 64 registers on sm_80; the
    # walk is split into 31 whole steps and a guarded last one, as for a held input
    scale = numpy_helper.from_array(np.linspace(0.5, 1.5, 257 * 127, dtype=np.float32)
                                    .reshape(257, 127), "scale")
    shape = numpy_helper.from_array(np.array([2, 257, 127], np.int64), "shape")
    graph = helper.make_graph(
        [helper.make_node("Expand", ["x", "shape"], ["e"]),
         helper.make_node("LayerNormalization", ["e", "scale"], ["n"], axis=-2)],
        "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [257, 127])],
        [helper.make_tensor_value_info("n", TensorProto.FLOAT, [2, 257, 127])],
        initializer=[scale, shape])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    _, plan = lower_stitch(model)
    (group,) = plan.groups
    assert (group.mapping.threads_per_row, group.mapping.row_length) == (1024, 32639)
    assert any(b.name == "x" and b.level.value == "global" for b in group.buffers)
    outcome = check_model(model, "stitch", triage=False)
    assert outcome.kind == "ok" and not outcome.violations, (outcome.error, outcome.violations)


@pytest.mark.usefixtures("global_at_any_cost")
def test_column_softmax_takes_more_row_tiles_than_the_cap_allows_rows() -> None:
    # fuzz case g125: a softmax down the 31 rows of each column re-reads the column in three
    # phases; one tile of 31 rows would keep 31 elements per thread, over 48 / 2 registers
    # (alone, a column softmax of no more rows than columns is strided rows now: added to
    # exp(x), which would be recomputed from a transposed view, it keeps column space)
    model = _model([helper.make_node("LogSoftmax", ["x"], ["y"], axis=0),
                    helper.make_node("Exp", ["x"], ["e"]),
                    helper.make_node("Add", ["y", "e"], ["z"])], [31, 64], ["z"])
    scheduled, plan = lower_stitch(model)
    (group,) = plan.groups
    # tiled at the wave's cap of 48 registers (24 elements); the grid of 31 blocks it took
    # then puts one block on an SM, whose threads may have all 255
    assert group.mapping.row_steps <= 24 < 31 < cached_elements_cap(group.launch)
    assert any((d.kind, d.before, d.after) == (DemotionKind.FEWER_ROW_TILES, 1, 31)
               for d in group.demotions), group.demotions
    feeds = make_inputs(model, 0)
    assert_matches(run_simt(model, scheduled, feeds), reference(model, feeds))


def test_persistent_grid_takes_fewer_longer_tiles_for_its_registers() -> None:
    # fuzz case 2612:1168: log-softmaxes down the columns of Sign(x) and Min(-Sign(x), x),
    # (4096, 768), hold x across the grid barriers. 512 tiles of 8 rows (24 elements per
    # thread of 256) at 5 blocks per SM and 48 registers spilled 40 B on sm_90, and still at
    # 4 blocks and 64; a wave of 2 blocks per SM takes 256 tiles of 16 rows at 128 registers
    # (24 + 2 x 48 = 120 wanted), and the launch bound keeps them after the kernel is built
    sign = helper.make_node("Sign", ["x"], ["s"])
    model = _model([sign, helper.make_node("Neg", ["s"], ["n"]),
                    helper.make_node("Min", ["n", "x"], ["m"]),
                    helper.make_node("LogSoftmax", ["s"], ["a"], axis=0),
                    helper.make_node("LogSoftmax", ["m"], ["b"], axis=0)],
                   [4096, 768], ["a", "b"])
    _, plan = lower_stitch(model)
    (group,) = plan.groups
    assert (group.mapping.row_steps, group.launch.grid, group.launch.blocks_per_sm,
            group.launch.max_registers) == (16, 256, 2, 128), str(plan)
    assert group.launch.max_registers >= RESERVED_REGISTERS + 48 * REGISTERS_PER_CACHED_ELEMENT
    outcome = check_model(model, "stitch", triage=False)
    assert outcome.kind == "ok" and not outcome.violations, (outcome.error, outcome.violations)


def test_row_group_over_the_cap_falls_back_with_the_reason() -> None:
    # fuzz case g173's shape: layer norm over rows of 32768 written out and read again (Abs),
    # so the input, scale and bias are each read by two loops: 3 x 32 elements per thread of
    # a 1024-thread block, over its cap of 32. Rolled loops that read them again would keep
    # none in registers, but their re-reads count more bytes than TVM's two kernels move: it
    # falls back, the yardstick's counts in the reason.
    rows, length = 132, 32768
    scale = numpy_helper.from_array(np.ones(length, np.float32), "scale")
    bias = numpy_helper.from_array(np.zeros(length, np.float32), "bias")
    model = _model([helper.make_node("LayerNormalization", ["x", "scale", "bias"], ["n"],
                                     axis=-1),
                    helper.make_node("Abs", ["n"], ["a"])],
                   [rows, length], ["n", "a"], (scale, bias))
    _, plan = lower_stitch(model)
    reasons = [f.reason for f in plan.fallbacks]
    assert any(r.startswith("the stitched kernel moves") and "TVM's fusion of the same ops" in r
               for r in reasons), reasons


def test_input_re_read_through_a_transpose_is_read_in_place() -> None:
    # fuzz case g1337: layer norm over one row of 32768 elements read through a transpose,
    # which two more ops read too. Holding the transpose in registers spilled on sm_80 (each
    # out-of-order element keeps its own address); the transpose is now inlined into its
    # readers (a layout move, schedule.row_permutation, or by the decisions: its row of
    # 32768 is over the shared budget), which read x where it lies, and the kernel keeps
    # within its registers
    shape = [2048, 16]
    scale = numpy_helper.from_array(np.ones([16, 2048], np.float32), "scale")
    bias = numpy_helper.from_array(np.zeros([16, 2048], np.float32), "bias")
    graph = helper.make_graph(
        [helper.make_node("Transpose", ["x"], ["t"], perm=[1, 0]),
         helper.make_node("LayerNormalization", ["t", "scale", "bias"], ["n"], axis=-2),
         helper.make_node("Abs", ["t"], ["a"])],
        "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
        [helper.make_tensor_value_info(o, TensorProto.FLOAT, [16, 2048]) for o in "na"],
        initializer=[scale, bias])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    _, plan = lower_stitch(model)
    (group,) = plan.groups
    assert "T_transpose" in group.permuted_copies + group.inlined and not plan.fallbacks
    outcome = check_model(model, "stitch")
    assert outcome.kind == "ok" and not outcome.violations, (outcome.error, outcome.violations)


def test_rows_longer_than_nvcc_unrolls_hold_nothing_and_stitch() -> None:
    # rows of a prime length (40949: no split into equal parts) on 1024 threads are 40 steps
    # of one element: nvcc keeps such a loop rolled and loads again, so an input read by two
    # loops holds no registers (occupancy.FULL_UNROLL_STEPS). Counted as 40 per thread
    # against the cap of 32, the group fell back to TVM's kernel (a softmax: 2.0x the
    # compulsory bytes, against 1.5x stitched online); no spills on sm_80 or sm_90.
    # A LayerNorm of such rows stitched in two passes read each row four times (the
    # corrected LayerNorm's deviations and squares in loops of their own), TVM's kernel of
    # topi's three, and fell back to TVM's kernel (transform.corrected_layer_norm); in one
    # pass (an online variance) it reads each row twice and stitches
    from tvm_stitch.workloads import micro

    model = micro.softmax((8, 40949))
    _, plan = lower_stitch(model)
    assert not plan.fallbacks, str(plan)
    (group,) = plan.groups
    assert (group.mapping.threads_per_row, group.mapping.row_length) == (1024, 40949)
    outcome = check_model(model, "stitch", triage=False)
    assert outcome.kind == "ok" and not outcome.violations, (outcome.error, outcome.violations)
    model = micro.layer_norm((8, 40949))
    _, plan = lower_stitch(model)
    (group,) = plan.groups
    assert not plan.fallbacks and group.online_variance == ("x_sum",), str(plan)
    outcome = check_model(model, "stitch", triage=False)
    assert outcome.kind == "ok" and not outcome.violations, (outcome.error, outcome.violations)
