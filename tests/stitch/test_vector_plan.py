"""The plan records which blocks of a stitched kernel access memory in vectors: the blocks it
keeps scalar (``Group.scalar_blocks``, decided on the blocks as the mapping sees them,
``emit.rewritten``) are never under a vectorised loop of the kernel, and a block that reads
an input through a transpose is one of them. Owner: schedule/vectors.py, schedule/emit.py."""

from __future__ import annotations

import numpy as np
import pytest
import tvm_ffi
from stitch_helpers import stitched_functions
from tvm import s_tir, tirx

from tvm_stitch import verify
from tvm_stitch.plan import GROUP_ATTR, StitchPlan
from tvm_stitch.testing.differential import check_model
from tvm_stitch.workloads import registry
from tvm_stitch.workloads.graph import GraphBuilder
from tvm_stitch.workloads.inputs import integers


def _vectorised(func: tirx.PrimFunc) -> set[str]:
    """Names of the blocks under a vectorised loop of ``func``."""
    found: set[str] = set()

    def on_loop(loop: tirx.For) -> None:
        if loop.kind == tirx.ForKind.VECTORIZED:
            tvm_ffi.structural_walk(loop.body, [(s_tir.SBlock,
                                                 lambda b: found.add(b.name_hint))])

    tvm_ffi.structural_walk(func.body, [(tirx.For, on_loop)])
    return found


def _planned_and_emitted(built) -> list[tuple]:
    mod = verify.compile_model(built, "stitch")
    plan = StitchPlan.of_module(mod)
    funcs = {int(f.attrs[GROUP_ATTR]): f for f in stitched_functions(mod).values()}
    return [(g, _vectorised(funcs[g.id])) for g in plan.groups]


def test_a_transpose_of_the_input_stays_scalar_and_its_readers_move_vectors() -> None:
    """A LayerNorm over channels of an NCHW input: the transposing copy reads the input one
    element per channel apart, once, into the row on chip (``row_permutation``), and is kept
    scalar; the LayerNorm reads that row in vectors."""
    g = GraphBuilder("transposed_layer_norm")
    moved = g.op("Transpose", g.input("x", (2, 64, 16, 16)), perm=[0, 2, 3, 1])
    built = g.model([g.op("LayerNormalization", moved, g.weight("g", (64,), 1.0, 0.2),
                          g.weight("b", (64,)), axis=-1)])
    ((group, vectorised),) = _planned_and_emitted(built)
    assert group.mapping.vector == 4 and group.scalar_blocks == ("T_transpose",), group
    assert group.transposed_copies == ("T_transpose",)
    assert "T_transpose" not in vectorised and "T_layer_norm" in vectorised
    assert "scalar accesses: T_transpose" in str(StitchPlan(groups=(group,)))
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


def test_an_embedding_row_gathered_by_token_id_moves_in_vectors() -> None:
    """GPT-2's embedding as torch exports it: the token id made non-negative (Less, Add,
    Where), the row gathered, the position added, then LayerNorm. The id's selection is the
    same for every lane (a scalar per row, not a boolean lane) and the int64 ids are read
    once per row, so the gathered row moves four floats per access (it was read a float at a
    time)."""
    vocab, width = 1000, 256
    g = GraphBuilder("embedding")
    ids = g.input("ids", (4, 64), np.int64, dist=integers(-vocab, vocab))
    wrapped = g.op("Where", g.op("Less", ids, g.constant(0, dtype=np.int64)),
                   g.op("Add", ids, g.constant(vocab, dtype=np.int64)), ids)
    rows = g.op("Add", g.op("Gather", g.weight("table", (vocab, width)), wrapped),
                g.weight("position", (64, width)))
    built = g.model([rows, g.op("LayerNormalization", rows, g.weight("g", (width,), 1.0, 0.2),
                                g.weight("b", (width,)), axis=-1)])
    ((group, vectorised),) = _planned_and_emitted(built)
    assert group.mapping.vector == 4 and "T_take" not in group.scalar_blocks, group
    outcome = check_model(built, "stitch")
    assert outcome.kind == "ok" and not outcome.violations, (outcome.error, outcome.violations)
