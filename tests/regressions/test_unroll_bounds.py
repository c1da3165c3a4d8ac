"""A block that streams several inputs as long as its row unrolls its element loop in runs
that keep their loads within the thread's registers (``Group.unrolled``): nvcc issues every
load of the steps it unrolls before the first use. Fuzz graph 9005:41, a LayerNorm over all
of (1, 16, 512, 512) with a scale and a shift as large, split over 512 blocks of 256 threads
at a cap of 64 registers: its last phase, 8 steps of 4 elements of each, fully unrolled,
spilled 16 B on sm_90. A Global tile's walk over its rows is bounded alike
(``Group.walk_unrolled``, fuzz graph 12016:477). Owner: schedule/decisions/unrolling.py."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import onnx
from onnx import helper
from regression_models import model, needs_stitch
from tvm.target import Target

from tvm_stitch.analysis import ptxas_resources
from tvm_stitch.frontend.onnx import import_model
from tvm_stitch.lowering import lower
from tvm_stitch.plan import Choices, StitchPlan, Unrolled
from tvm_stitch.schedule.decisions import decide
from tvm_stitch.simt.kernel import SimtFunction
from tvm_stitch.testing.differential import check_model
from tvm_stitch.tuning.tasks import extract_tasks
from tvm_stitch.verify import compile_model

pytestmark = needs_stitch

SHAPE = [1, 16, 512, 512]
CASES = Path(__file__).parent / "cases"


def _layer_norm_of_everything() -> object:
    rng = np.random.default_rng(0)
    nodes = [helper.make_node("Floor", ["x"], ["f"]),
             helper.make_node("Reshape", ["f", "rows"], ["r"]),
             helper.make_node("LayerNormalization", ["f", "scale", "shift"], ["n"], axis=0)]
    return model(nodes, {"x": SHAPE}, {"r": [1, 8192, 512], "n": SHAPE},
                 {"rows": np.array([1, 8192, 512], np.int64),
                  "scale": rng.uniform(0.5, 1.5, SHAPE).astype(np.float32),
                  "shift": rng.uniform(-1, 1, SHAPE).astype(np.float32)})


def test_streamed_scale_and_shift_unroll_in_runs_of_four() -> None:
    built = _layer_norm_of_everything()
    plan = StitchPlan.of_module(compile_model(built, "stitch"))
    (group,) = plan.groups
    assert group.row_split == 512 and group.launch.max_registers == 64, plan
    assert group.unrolled == (Unrolled("T_layer_norm", 4, 4, 8),), plan
    assert "runs of 4 step(s) of 4 unrolled" in str(plan)
    assert StitchPlan.from_json(plan.to_json()) == plan


def test_runs_are_emitted_rolled_and_nothing_spills() -> None:
    built = _layer_norm_of_everything()
    scheduled = compile_model(built, "stitch")
    (group,) = StitchPlan.of_module(scheduled).groups
    source = lower(scheduled[group.function], group.function,
                   Target({"kind": "cuda", "arch": "sm_90"})).source()
    # the last phase's loop: two runs of four steps, not unrolled as a whole
    assert source.count("#pragma unroll 1") == 1
    loop = source[source.index("#pragma unroll 1"):]
    assert loop.split("\n")[1].strip().endswith("< 2; ++ax1_0_0) {"), loop[:200]
    # nvcc/ptxas for sm_80 and sm_90: no spill, no stack frame; and the SIMT run
    outcome = check_model(built, "stitch")
    assert outcome.kind == "ok" and not outcome.violations, (outcome.error, outcome.violations)


def test_a_row_of_31000_streaming_two_inputs_keeps_within_the_registers() -> None:
    # fuzz graph 6007:588: a LayerNorm over (4, 250, 31) float16 of an Expand to
    # (2, 4, 250, 31), its scale and shift as large, beside Relu. A block per row of 31000 on
    # 1024 threads (the plan of split_parts=1, the rules' own before) streamed the scale and
    # the shift 8 lanes a step in a fully unrolled loop and spilled 16 B on sm_80; the plan
    # now unrolls one step at a time (the block is scalar: runs of 8 elements).
    built = onnx.load(CASES / "stitch-s6007-g588.onnx")
    task = next(t for t in extract_tasks(import_model(built), "cuda:sm_90")
                if "lv1:layer_norm" in t.group.ops)
    decided = decide(task.func, task.group, task.rows, task.target, Choices(split_parts=1))
    assert decided.group.unrolled == (Unrolled("T_layer_norm", 1, 8, 16),)
    source = decided.lowered.source()
    for arch in ("sm_80", "sm_90"):
        (resources,) = ptxas_resources(source, arch).values()
        assert resources.spill_store_bytes == resources.stack_bytes == 0, (arch, resources)


def test_a_block_computed_lane_by_lane_unrolls_in_runs_after_its_register_copies() -> None:
    # fuzz graph 6007:459's shape, smaller: a LayerNorm over all of (1, 4, 128, 128) with a
    # scale as large, and |n|, erf(n) and min(n, c) - 0.5 as outputs, in one block (the
    # plan of split_parts=1). erf(n) is computed lane by lane from register copies of its
    # vector; splitting its step loop before those copies were made left TVM a copy of a
    # region it could not bound ("scheduling failed"). Its runs are now split after them.
    c, h = 4, 128
    scale = np.linspace(0.5, 1.5, c * h * h, dtype=np.float32).reshape(c, h, h)
    low = np.linspace(-1, 1, h, dtype=np.float32)
    nodes = [helper.make_node("LayerNormalization", ["x", "scale"], ["n"], axis=-3),
             helper.make_node("Min", ["n", "low"], ["m"]),
             helper.make_node("Abs", ["n"], ["a"]),
             helper.make_node("Erf", ["n"], ["e"]),
             helper.make_node("Add", ["m", "shift"], ["y"])]
    shape = [1, c, h, h]
    built = model(nodes, {"x": shape}, {"a": shape, "e": shape, "y": shape},
                  {"scale": scale, "low": low, "shift": np.array(-0.5, np.float32)})
    (task,) = extract_tasks(import_model(built), "cuda:sm_90")
    decided = decide(task.func, task.group, task.rows, task.target, Choices(split_parts=1))
    (lanes,) = decided.group.lane_blocks
    assert lanes in {u.block for u in decided.group.unrolled}
    for arch in ("sm_80", "sm_90"):
        (resources,) = ptxas_resources(decided.lowered.source(), arch).values()
        assert resources.spill_store_bytes == resources.stack_bytes == 0, (arch, resources)
    x = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
    norm = (x - x.mean()) / np.sqrt(x.var() + 1e-5) * scale
    outputs = [np.zeros_like(x) for _ in range(3)]
    SimtFunction.from_primfunc(decided.scheduled, "lanes")(
        x, scale, np.zeros_like(scale), low, *outputs)
    expected = [np.abs(norm), np.vectorize(math.erf)(norm.astype(np.float64)),
                np.minimum(norm, low) - 0.5]
    for out, want in zip(outputs, expected, strict=True):  # |n|, erf(n), min(n, c) - 0.5
        np.testing.assert_allclose(out, want, atol=1e-5)


def test_a_loop_of_one_step_is_not_bounded() -> None:
    # fuzz graph 9006:31: a ReduceMean over a row of 1024 float16 values feeding two
    # LayerNorms of one element. A block walking its row in one step was bounded to runs
    # of one step, and emission found no loop to split: the group fell back ("scheduling
    # failed").
    built = onnx.load(CASES / "stitch-s9006-g31.onnx")
    plan = StitchPlan.of_module(compile_model(built, "stitch"))
    assert not [f.reason for f in plan.fallbacks if "scheduling failed" in f.reason], plan
    assert all(u.steps * u.lanes < 1024 for g in plan.groups for u in g.unrolled)
    outcome = check_model(built, "stitch")
    assert outcome.kind == "ok" and not outcome.violations, (outcome.error, outcome.violations)


def _column_mean_beside_an_add(rows: int) -> onnx.ModelProto:
    # fuzz graph 12016:477, shrunk: a column mean of (rows, 4096) and x + 1.5 as outputs
    nodes = [helper.make_node("ReduceMean", ["x", "axes"], ["m"], keepdims=0),
             helper.make_node("Add", ["x", "c"], ["y"])]
    return model(nodes, {"x": [rows, 4096]}, {"m": [4096], "y": [rows, 4096]},
                 {"axes": np.array([0], np.int64), "c": np.array(1.5, np.float32)})


def test_a_tile_walks_its_rows_in_runs_whose_loads_fit_the_registers() -> None:
    # One Global kernel, 128 tiles of 16 rows on 1024 threads (a cap of 64 registers), each
    # thread a float4 of the staged row per row and 4 partial sums in registers: the whole
    # walk, unrolled by ptxas, took 84 registers and spilled 8 B on sm_80 and sm_90. It now
    # walks runs of 4 rows (16 elements in flight, within the 28 its cap leaves).
    built = _column_mean_beside_an_add(2048)
    scheduled = compile_model(built, "stitch")
    (group,) = StitchPlan.of_module(scheduled).groups
    assert (group.mapping.row_steps, group.launch.max_registers) == (16, 64), group
    assert group.walk_unrolled == 4
    assert "row walk unrolled in runs of 4 row(s)" in str(StitchPlan.of_module(scheduled))
    source = lower(scheduled[group.function], group.function,
                   Target({"kind": "cuda", "arch": "sm_90"})).source()
    walk = source[source.index("#pragma unroll 1"):]
    assert walk.split("\n")[1].strip().endswith("< 4; ++ax0_1_m_0) {"), walk[:200]
    outcome = check_model(built, "stitch")
    assert outcome.kind == "ok" and not outcome.violations, (outcome.error, outcome.violations)


def test_a_walk_within_the_registers_is_not_bounded() -> None:
    # over 512 rows the row phase takes column tiles, a column per thread: tiles of 16 rows,
    # one element of each in flight, 16 in all, unrolled whole without a spill
    scheduled = compile_model(_column_mean_beside_an_add(512), "stitch")
    (group,) = StitchPlan.of_module(scheduled).groups
    assert group.mapping.row_steps == 16 and group.phases[0].column_tiles > 1, group
    assert group.walk_unrolled == 0
    source = lower(scheduled[group.function], group.function,
                   Target({"kind": "cuda", "arch": "sm_90"})).source()
    assert "#pragma unroll 1" not in source
    for arch in ("sm_80", "sm_90"):
        (resources,) = ptxas_resources(source, arch).values()
        assert resources.spill_store_bytes == resources.stack_bytes == 0, (arch, resources)
