"""A float16 flat kernel of eight lanes whose broadcast operand moves with its outer axes
computes its lanes one by one.

Fuzz graph 12039:120: ``sigmoid(max(x, s))`` over (2, 96, 56, 56) float16 with ``s`` of
(1, 56, 1), one value per row of 56. The flat mapping fuses the axes into one index and
takes eight halves per thread; the lanes of a vector share their row, but TVM's
VectorizeLoop cannot see that from ``(8 v + lane) // 56`` and gathers ``s`` lane by lane,
and its CUDA code generator printed the eight int32 indices and the eight halves gathered
as ``make_longlong4`` and ``make_uint4`` of eight arguments: nvcc rejected the kernel for
sm_80 and sm_90. Owner: schedule/vectors.py (``gathered_broadcasts``, ``lane_blocks``)."""

from __future__ import annotations

import numpy as np
from regression_models import needs_stitch

from tvm_stitch import verify
from tvm_stitch.plan import MappingKind, StitchPlan
from tvm_stitch.testing.differential import check_model
from tvm_stitch.workloads.graph import GraphBuilder

pytestmark = needs_stitch


def test_a_row_broadcast_in_a_flat_float16_kernel_builds_for_nvcc() -> None:
    g = GraphBuilder("max_sigmoid")
    x = g.input("x", (2, 96, 56, 56), dtype=np.float16)
    s = g.input("s", (1, 56, 1), dtype=np.float16)
    built = g.model([g.op("Sigmoid", g.op("Max", x, s))])
    (group,) = StitchPlan.of_module(verify.compile_model(built, "stitch")).groups
    assert group.mapping.kind is MappingKind.FLAT and group.mapping.vector == 8, group.mapping
    assert group.lane_blocks, group
    outcome = check_model(built, "stitch", triage=False)
    assert outcome.kind == "ok" and not outcome.violations, (outcome.error, outcome.violations)
