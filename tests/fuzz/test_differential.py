"""Differential testing of the flow under test against onnxruntime on random graphs, and the
classification of what goes wrong (mismatch, crash, TVM's crash)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from fuzz_models import F32, make_model
from hypothesis import HealthCheck, given, note, settings
from onnx import helper

from tvm_stitch import verify
from tvm_stitch.testing import differential
from tvm_stitch.testing.differential import check_model, compare, default_flow
from tvm_stitch.testing.fuzz import regression_case
from tvm_stitch.testing.graphs import GraphConfig, describe, graphs
from tvm_stitch.transform import stitch_fuse

REGRESSIONS = Path(__file__).parents[1] / "regressions" / "cases"
_SETTINGS = {"deadline": None, "database": None,
             "suppress_health_check": [HealthCheck.too_slow, HealthCheck.data_too_large]}


def _check_random_graph(model: onnx.ModelProto, name: str) -> None:
    """Check one graph; a failure is saved as a regression case under ``name`` (each failure
    overwrites the last, so what stays is the example Hypothesis shrank to) and fails."""
    flow = default_flow()
    note(describe(model))
    # Resources of random graphs are checked by the fuzz sample (test_fuzz_script.py); here
    # they would double the time of every example.
    outcome = check_model(model, flow, resources=False)
    if outcome.failed:
        path = regression_case(REGRESSIONS, f"{name}-{flow}", model, outcome.to_dict(),
                               f"tests/fuzz/test_differential.py::{name}")
        pytest.fail(f"{outcome.kind} {outcome.stage} {outcome.error} {outcome.violations} "
                    f"(baseline: {outcome.baseline}); saved as {path}")


@settings(max_examples=12, derandomize=True, **_SETTINGS)
@given(model=graphs(GraphConfig(max_nodes=6, max_elements=16384)))
def test_random_graphs_match_onnxruntime(model: onnx.ModelProto) -> None:
    _check_random_graph(model, "hypothesis-sample")


@pytest.mark.slow
@settings(max_examples=300, **_SETTINGS)
@given(model=graphs())
def test_many_random_graphs_match_onnxruntime(model: onnx.ModelProto) -> None:
    _check_random_graph(model, "hypothesis-many")


def _softmax_model() -> onnx.ModelProto:
    return make_model([helper.make_node("Softmax", ["x"], ["y"], axis=-1)],
                      {"x": ([4, 33], F32)}, {"y": ([4, 33], F32)})


def _failing_compile(flows: set[str]):
    real = verify.compile_model

    def compile_model(model, flow, target):
        if flow in flows:
            raise RuntimeError(f"boom in {flow}")
        return real(model, flow, target)

    return compile_model


def test_a_crash_only_the_flow_has_is_ours(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(verify, "compile_model", _failing_compile({"stitch"}))
    outcome = check_model(_softmax_model(), "stitch", resources=False)
    assert (outcome.kind, outcome.stage, outcome.baseline) == ("crash", "compile", "ok")
    assert outcome.error == "RuntimeError: boom in stitch" and "boom" in outcome.trace


def test_stitching_that_gives_up_is_a_crash_of_ours(monkeypatch: pytest.MonkeyPatch) -> None:
    # the stitch pass catches its own unexpected errors and leaves the module to TVM's fusion
    # (right numbers for the user), which a test must still see (fuzz seed 2026 graph 732)
    def broken(*_args):
        raise ValueError("max() arg is an empty sequence")

    monkeypatch.setattr(stitch_fuse, "_stitch_rounds", broken)
    outcome = check_model(_softmax_model(), "stitch", resources=False)
    assert (outcome.kind, outcome.stage, outcome.baseline) == ("crash", "plan", "ok")
    assert outcome.error.startswith("StitchGaveUp: stitching gave up (ValueError")


def test_a_crash_the_baseline_shares_is_tvms(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(verify, "compile_model", _failing_compile({"stitch", "baseline"}))
    outcome = check_model(_softmax_model(), "stitch", resources=False)
    assert (outcome.kind, outcome.baseline) == ("tvm_crash", "crash at compile")
    assert check_model(_softmax_model(), "baseline", resources=False).kind == "tvm_crash"


def test_wrong_numbers_are_a_mismatch(monkeypatch: pytest.MonkeyPatch, flow: str) -> None:
    real = differential.reference_outputs
    monkeypatch.setattr(differential, "reference_outputs",
                        lambda model, feeds: [o + 1e-3 for o in real(model, feeds)])
    outcome = check_model(_softmax_model(), flow, resources=False)
    assert outcome.kind == "mismatch" and outcome.error.startswith("output 0: max abs error")
    assert outcome.failed


def test_compare_treats_non_finite_values_exactly() -> None:
    inf, nan = np.inf, np.nan
    same = np.array([1.0, inf, -inf, nan], np.float32)
    assert compare([same], [same.copy()]).ok
    for wrong in ([1.0, -inf, -inf, nan], [1.0, 5.0, -inf, nan], [1.0, inf, -inf, 0.0]):
        assert not compare([np.array(wrong, np.float32)], [same]).ok


def test_compare_handles_scalars_dtypes_and_counts() -> None:
    assert compare([np.array(2.0, np.float32)], [np.array(2.0, np.float32)]).ok
    assert not compare([np.array(2.5, np.float32)], [np.array(2.0, np.float32)]).ok
    assert not compare([np.array([1], np.int32)], [np.array([1], np.int64)]).ok
    assert not compare([np.zeros(2, np.float32)], []).ok
    assert compare([np.zeros(2, np.float16)], [np.full(2, 5e-3, np.float16)]).ok


def test_long_float32_reductions_are_checked_against_float64() -> None:
    # onnxruntime's float32 sum over 300,000 rows was off by 3e-3 (fuzz seed 2026, large
    # mode, graph 1): both flows "mismatched" it
    model = make_model([helper.make_node("ReduceMean", ["x", "axes"], ["y"], keepdims=0)],
                       {"x": ([200000, 4], F32)}, {"y": ([4], F32)},
                       {"axes": np.array([0], np.int64)})
    x = (np.random.default_rng(0).random((200000, 4)) + 1000).astype(np.float32)
    (got,) = differential.reference_outputs(model, {"x": x})
    assert got.dtype == np.float32
    np.testing.assert_array_equal(got, x.astype(np.float64).mean(0).astype(np.float32))
