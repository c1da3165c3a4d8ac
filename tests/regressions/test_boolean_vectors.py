"""A float16 kernel moves eight halves per access, but TVM's CUDA code generator has no type
for eight booleans: a comparison in such a vector failed to build ("Cannot convert type
T.boolx8 to CUDA type", fuzz seed 2026 graph 386: a Where over a Global group's column
softmax). Blocks with a boolean value keep at most four lanes (``vectors.MAX_BOOLEAN_LANES``);
checked in each mapping that vectorises: flat, rows, and a persistent grid's row phases. A
flat group's plan names the blocks whose lanes stay scalar (``Group.scalar_blocks``), and
takes at most four lanes where one would (``decisions.flat.HELD_LANES``).
Owner: schedule/vectors.py."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper
from regression_models import model, needs_stitch

from tvm_stitch import verify
from tvm_stitch.plan import MappingKind, StitchPlan
from tvm_stitch.testing.differential import check_model

pytestmark = needs_stitch


def _where_after_softmax(shape: list[int], axis: int) -> list:
    return [helper.make_node("Softmax", ["x"], ["s"], axis=axis),
            helper.make_node("GreaterOrEqual", ["x", "zero"], ["m"]),
            helper.make_node("Where", ["m", "s", "two"], ["y"])]


@pytest.mark.usefixtures("global_at_any_cost")
@pytest.mark.parametrize(("shape", "nodes"), [
    ([528, 1024], [helper.make_node("GreaterOrEqual", ["x", "zero"], ["m"]),
                   helper.make_node("Where", ["m", "x", "two"], ["y"])]),  # flat, 8 lanes
    ([64, 256], _where_after_softmax([64, 256], -1)),  # rows
    ([16, 768], _where_after_softmax([16, 768], 0)),  # Global: a column softmax (g386)
], ids=["flat", "rows", "global"])
def test_float16_comparisons_build_and_match(shape: list[int], nodes: list) -> None:
    built = model(nodes, {"x": shape}, {"y": shape},
                  {"zero": np.zeros((), np.float16), "two": np.full((), 2, np.float16)},
                  elem_type=TensorProto.FLOAT16)
    outcome = check_model(built, "stitch", resources=True).to_dict()
    assert outcome["kind"] == "ok" and not outcome["violations"], outcome
    assert not outcome["fallbacks"], outcome["fallbacks"]


def test_a_flat_group_whose_eight_lanes_would_be_scalar_takes_four() -> None:
    # eight lanes of a Where are computed one by one, each with its own indices and
    # conditional load: a float16 Where of a broadcast mask spilled 8 B on sm_90 at 48
    # registers (fuzz graph 2612:1566); the group takes vectors of four, whose booleans the
    # code generator has a type for
    nodes = [helper.make_node("GreaterOrEqual", ["x", "zero"], ["m"]),
             helper.make_node("Where", ["m", "x", "two"], ["y"]),
             helper.make_node("Add", ["x", "two"], ["z"])]
    built = model(nodes, {"x": [528, 1024]}, {"y": [528, 1024], "z": [528, 1024]},
                  {"zero": np.zeros((), np.float16), "two": np.full((), 2, np.float16)},
                  elem_type=TensorProto.FLOAT16)
    (group,) = StitchPlan.of_module(verify.compile_model(built, "stitch")).groups
    assert group.mapping.kind is MappingKind.FLAT and group.mapping.vector == 4, group
    assert not group.scalar_blocks, group


def test_a_where_of_a_broadcast_mask_does_not_spill() -> None:
    shape = [2, 96, 56, 56]
    graph = helper.make_graph(
        [helper.make_node("Abs", ["x"], ["a"]),
         helper.make_node("Where", ["mask", "a", "c"], ["y"])], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT16, shape),
         helper.make_tensor_value_info("mask", TensorProto.BOOL, [56])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT16, shape)],
        initializer=[numpy_helper.from_array(np.linspace(-2, 2, 56).astype(np.float16), "c")])
    built = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    outcome = check_model(built, "stitch", resources=True).to_dict()
    assert outcome["kind"] == "ok" and not outcome["violations"], outcome


def test_a_comparison_of_the_row_maximum_builds_for_cuda() -> None:
    # fuzz seed 2027, graph 85: Where(max(x) >= 0.5, x, |x|) on rows of 4096 floats took float4
    # lanes with the row's comparison broadcast over them, which TVM's CUDA code declared as
    # "float4 v = make_ushort4(...)": nvcc rejected the kernel (its numbers were right on the
    # SIMT runner). Such a block stays scalar.
    nodes = [helper.make_node("ReduceMax", ["x", "axes"], ["m"], keepdims=1),
             helper.make_node("GreaterOrEqual", ["m", "half"], ["c"]),
             helper.make_node("Abs", ["x"], ["a"]),
             helper.make_node("Where", ["c", "x", "a"], ["y"]),
             helper.make_node("ReduceMean", ["a", "axes"], ["mean"], keepdims=1)]
    built = model(nodes, {"x": [256, 4096]}, {"y": [256, 4096], "mean": [256, 1]},
                  {"axes": np.array([1], np.int64), "half": np.full((), 0.5, np.float32)})
    outcome = check_model(built, "stitch", resources=True).to_dict()
    assert outcome["kind"] == "ok" and not outcome["violations"], outcome
