"""A row group that computes several transcendental functions on float16 values takes four
halves per access, not eight (``vectors.HALF_MATH_CALLS``): CUDA computes each lane
of ``hexp`` or ``hlog`` through float32 in several instructions, and the eight lanes of a
vector, interleaved, spilled. Owner: schedule/decisions/rows.py."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper
from regression_models import model, needs_stitch

from tvm_stitch.frontend.onnx import import_model
from tvm_stitch.plan import Choices, StitchPlan
from tvm_stitch.schedule.decisions import decide
from tvm_stitch.schedule.rows import Unstitchable
from tvm_stitch.testing.differential import check_model
from tvm_stitch.tuning.tasks import extract_tasks
from tvm_stitch.verify import compile_model

pytestmark = needs_stitch

SHAPE = [257, 16]


def _layer_norm_beside_half_math(extra: list, outputs: list[str]) -> object:
    # fuzz graph 5150:1007: a LayerNorm over both axes of |x| (one row of 4112 halves, 1024
    # threads at 64 registers) beside max(x, m) and sigmoid(float(|x|)) as outputs, and the
    # outputs ``extra`` computes from |x| + 0.5
    nodes = [helper.make_node("Abs", ["x"], ["a"]),
             helper.make_node("Add", ["a", "half"], ["b"]),
             helper.make_node("LayerNormalization", ["a", "scale"], ["n"], axis=0),
             helper.make_node("Max", ["x", "m"], ["top"]),
             helper.make_node("Cast", ["a"], ["wide"], to=TensorProto.FLOAT),
             helper.make_node("Sigmoid", ["wide"], ["wide_sigmoid"]),
             helper.make_node("Cast", ["wide_sigmoid"], ["narrow"], to=TensorProto.FLOAT16),
             *extra]
    return model(nodes, {"x": SHAPE, "m": []},
                 {name: SHAPE for name in ["n", *outputs, "top", "narrow"]},
                 {"half": np.full((), 0.5, np.float16), "quarter": np.full((), 0.25, np.float16),
                  "scale": np.linspace(0.5, 1.5, 4112).astype(np.float16).reshape(SHAPE)},
                 elem_type=TensorProto.FLOAT16)


def _vector(built: object) -> int:
    plan = StitchPlan.of_module(compile_model(built, "stitch"))
    (group,) = plan.groups
    return group.mapping.vector


def test_two_half_transcendentals_take_four_lanes_and_do_not_spill() -> None:
    built = _layer_norm_beside_half_math([
        helper.make_node("Sigmoid", ["b"], ["s"]),
        helper.make_node("Log", ["b"], ["l"]),
        helper.make_node("Add", ["l", "quarter"], ["y"])], ["y", "s"])
    assert _vector(built) == 4
    outcome = check_model(built, "stitch", resources=True)
    assert outcome.kind == "ok" and not outcome.violations, (outcome.error, outcome.violations)


def test_one_half_transcendental_keeps_eight_lanes() -> None:
    built = _layer_norm_beside_half_math([helper.make_node("Log", ["b"], ["l"]),
                                          helper.make_node("Add", ["l", "quarter"], ["y"])],
                                         ["y"])
    assert _vector(built) == 8


def test_chosen_vectors_of_eight_are_refused() -> None:
    built = _layer_norm_beside_half_math([
        helper.make_node("Sigmoid", ["b"], ["s"]),
        helper.make_node("Log", ["b"], ["l"]),
        helper.make_node("Add", ["l", "quarter"], ["y"])], ["y", "s"])
    (task,) = extract_tasks(import_model(built), "cuda:sm_80")
    assert decide(task.func, task.group, task.rows, None, Choices(vector=4)).group \
        .mapping.vector == 4
    with pytest.raises(Unstitchable, match="at most 4 elements per access"):
        decide(task.func, task.group, task.rows, None, Choices(vector=8))


def test_a_row_beside_half_math_holds_no_input_in_registers() -> None:
    # fuzz graph 8111:1241 (shrunk), as one block (its split row taken apart): softmaxes of
    # tanh(x) and of exp(tanh(x)) over one row of 30000 halves. x was held in registers, 30
    # per thread, and nvcc left the walks over the copy rolled beside the half math: a 112 B
    # stack frame on sm_80 and sm_90. x is read from global memory instead.
    from pathlib import Path

    import onnx

    from tvm_stitch.analysis.ptxas import ptxas_resources
    from tvm_stitch.plan import StorageLevel

    built = onnx.load(Path(__file__).parent / "cases" / "stitch-s8111-g1241.onnx")
    (task,) = [t for t in extract_tasks(import_model(built), "cuda:sm_90")
               if t.rows is not None]
    done = decide(task.func, task.group, task.rows, task.target, Choices(split_parts=1))
    assert done.group.row_split == 1
    levels = {b.name: b.level for b in done.group.buffers}
    assert levels["in0"] is StorageLevel.GLOBAL
    for arch in ("sm_80", "sm_90"):
        (used,) = ptxas_resources(done.lowered.source(), arch).values()
        assert used.stack_bytes == used.spill_store_bytes == 0, (arch, used)
