"""The plan records which blocks of a stitched kernel access memory in vectors: the blocks it
keeps scalar (``Group.scalar_blocks``, decided on the blocks as the mapping sees them,
``emit.rewritten``) are never under a vectorised loop of the kernel, and a block read
through a transpose is one of them. Owner: schedule/vectors.py, schedule/emit.py."""

from __future__ import annotations

import numpy as np
import pytest
import tvm
import tvm_ffi
from onnx import TensorProto, helper, numpy_helper
from tvm import s_tir, tirx

from tvm_stitch import verify
from tvm_stitch.plan import GROUP_ATTR, StitchPlan
from tvm_stitch.testing.differential import check_model
from tvm_stitch.workloads import registry


def _vectorised(func: tirx.PrimFunc) -> set[str]:
    """Names of the blocks under a vectorised loop of ``func``."""
    found: set[str] = set()

    def on_loop(loop: tirx.For) -> None:
        if loop.kind == tirx.ForKind.VECTORIZED:
            tvm_ffi.structural_walk(loop.body, [(s_tir.SBlock,
                                                 lambda b: found.add(b.name_hint))])

    tvm_ffi.structural_walk(func.body, [(tirx.For, on_loop)])
    return found


def _stitched(mod: tvm.IRModule) -> dict[int, tirx.PrimFunc]:
    return {int(f.attrs[GROUP_ATTR]): f for _, f in mod.functions.items()
            if isinstance(f, tirx.PrimFunc) and f.attrs is not None and GROUP_ATTR in f.attrs}


def _planned_and_emitted(built) -> list[tuple]:
    mod = verify.compile_model(built, "stitch")
    plan = StitchPlan.of_module(mod)
    funcs = _stitched(mod)
    return [(g, _vectorised(funcs[g.id])) for g in plan.groups]


def test_a_layer_norm_read_through_a_transpose_stays_scalar() -> None:
    nodes = [helper.make_node("Transpose", ["x"], ["t"], perm=[0, 2, 3, 1]),
             helper.make_node("LayerNormalization", ["t", "g", "b"], ["y"], axis=-1)]
    graph = helper.make_graph(
        nodes, "transposed_layer_norm",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 64, 16, 16])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 16, 16, 64])],
        initializer=[numpy_helper.from_array(np.linspace(0.5, 1.5, 64, dtype=np.float32), "g"),
                     numpy_helper.from_array(np.linspace(-1, 1, 64, dtype=np.float32), "b")])
    built = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    ((group, vectorised),) = _planned_and_emitted(built)
    assert group.mapping.vector == 4 and "T_layer_norm" in group.scalar_blocks, group
    assert "T_layer_norm" not in vectorised
    assert "scalar accesses: T_layer_norm" in str(StitchPlan(groups=(group,)))
    outcome = check_model(built, "stitch")
    assert outcome.kind == "ok" and not outcome.violations, (outcome.error, outcome.violations)


@pytest.mark.parametrize("name", ["softmax", "add_layer_norm", "bias_gelu", "layernorm_backward",
                                  "softmax_64x30000"])
def test_no_block_the_plan_keeps_scalar_is_vectorised(name: str) -> None:
    pairs = _planned_and_emitted(registry.get(name).model("ci"))
    assert pairs
    for group, vectorised in pairs:
        assert not set(group.scalar_blocks) & vectorised, (group.scalar_blocks, vectorised)
        if group.mapping.vector > 1 and not group.scalar_blocks:
            assert vectorised, group  # the plan's vectors are in the kernel
