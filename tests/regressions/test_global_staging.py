"""The LayerNorm backward of torch's MLP backward is one Global kernel whose shared memory is
what the plan counts. At ci (2 x 32 rows of 64) the bias gradient, a sum over (B, S) with
B x S = H, passed for 64 row sums (``phases.column_reductions``); the kernel built from that
plan declared 52,480 B of shared memory where the plan counted 4,032 B, more than a block may
have, so the group fell back (and once it fitted, its numbers were wrong: see
test_global_row_alignment.py). Owner: schedule/phases.py."""

from __future__ import annotations

from tvm_stitch import pipeline
from tvm_stitch.frontend.onnx import import_model
from tvm_stitch.plan import StitchPlan
from tvm_stitch.workloads import registry


def test_rows_staged_by_a_persistent_grid_take_the_planned_shared_memory() -> None:
    model = registry.get("mlp_backward").model("ci")
    plan = StitchPlan.of_module(pipeline.lower(import_model(model), "cuda:sm_90", "stitch"))
    assert not any("cannot launch" in f.reason for f in plan.fallbacks), plan.fallbacks
    persistent = [g for g in plan.groups if g.phases]
    assert persistent  # the LayerNorm backward with its weight gradients
    for group in persistent:
        assert group.launch.shared_bytes <= group.shared_bytes < 8192
