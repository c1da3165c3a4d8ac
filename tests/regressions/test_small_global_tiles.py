"""A small Global group runs on few row tiles when its prime row count has no divisor that
fills the wave.

Fuzz graphs 4242:46, :151, :185 (large 0.05): a column softmax over (257, 5) fell back with
"257 rows do not split into about one wave of 32 tiles (at most 1)". Row tiles must divide
the rows, and 257 is prime. On 1285 elements one tile is no loss (and one kernel replaces
TVM's several); on a large tensor the refusal stands (schedule/decisions/tiles.py,
``SMALL_GLOBAL_ELEMENTS``), where there are more rows than columns: a column softmax of no
more rows than columns is strided rows of a transposed view (``MixedReduction``)."""

from __future__ import annotations

from onnx import helper
from regression_models import model

from tvm_stitch import verify
from tvm_stitch.plan import MappingKind, StitchPlan
from tvm_stitch.testing.differential import check_model


def _column_softmax(shape: list[int]):
    return model([helper.make_node("Softmax", ["x"], ["y"], axis=0)], {"x": shape},
                 {"y": shape})


def test_a_small_column_softmax_over_prime_rows_stitches() -> None:
    built = _column_softmax([257, 5])
    plan = StitchPlan.of_module(verify.compile_model(built, "stitch"))
    assert not plan.fallbacks, plan
    (group,) = plan.groups
    assert group.phases, group
    outcome = check_model(built, "stitch")
    assert outcome.kind == "ok" and not outcome.violations, (outcome.error, outcome.violations)


def test_a_large_column_softmax_over_prime_rows_still_falls_back() -> None:
    plan = StitchPlan.of_module(verify.compile_model(_column_softmax([4099, 64]), "stitch"))
    assert any("4099 rows do not split" in f.reason for f in plan.fallbacks), plan


def test_a_large_column_softmax_of_few_prime_rows_is_strided_rows() -> None:
    plan = StitchPlan.of_module(verify.compile_model(_column_softmax([257, 4096]), "stitch"))
    (group,) = plan.groups
    assert not plan.fallbacks and not group.phases, plan
    assert group.mapping.kind is MappingKind.STRIDED_ROWS, group
