"""Bad input end to end through ``verify``: a clear error that names the node or value, or a
fallback region listed in the plan with right numbers; never a crash, never silent wrong
numbers. (The front end's own refusals are unit-tested in tests/frontend; gaps found here are
strict xfails in tests/regressions.)"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from fuzz_models import F32, make_model
from onnx import TensorProto, helper

from tvm_stitch import verify
from tvm_stitch.plan import StitchPlan
from tvm_stitch.simt import SimtModule
from tvm_stitch.testing.differential import check_model


def _neg(elem_type: int) -> onnx.ModelProto:
    return make_model([helper.make_node("Neg", ["x"], ["y"], name="negate")],
                      {"x": ([4, 8], elem_type)}, {"y": ([4, 8], elem_type)})


def _unknown_op() -> onnx.ModelProto:
    return make_model([helper.make_node("Frobnicate", ["x"], ["y"], name="mystery")],
                      {"x": ([4, 8], F32)}, {"y": ([4, 8], F32)}, check=False)


def _custom_domain() -> onnx.ModelProto:
    model = make_model([helper.make_node("Relu", ["x"], ["y"], name="vendor_relu",
                                         domain="com.vendor")],
                       {"x": ([4, 8], F32)}, {"y": ([4, 8], F32)}, check=False)
    model.opset_import.append(helper.make_opsetid("com.vendor", 1))
    return model


def _dangling_input() -> onnx.ModelProto:
    return make_model([helper.make_node("Add", ["x", "ghost"], ["y"], name="adder")],
                      {"x": ([4, 8], F32)}, {"y": ([4, 8], F32)}, check=False)


REFUSED = {
    "unknown op": (_unknown_op, "mystery"),
    "custom domain": (_custom_domain, "vendor_relu"),
    "bfloat16": (lambda: _neg(TensorProto.BFLOAT16), "'x'"),
    "float8": (lambda: _neg(TensorProto.FLOAT8E4M3FN), "'x'"),
    "string": (lambda: _neg(TensorProto.STRING), "'x'"),
    "dangling input": (_dangling_input, "ghost"),
}


@pytest.mark.parametrize("case", sorted(REFUSED))
def test_refused_models_get_a_clear_error(case: str, flow: str, tmp_path: Path,
                                          capsys: pytest.CaptureFixture) -> None:
    build, named = REFUSED[case]
    path = tmp_path / "model.onnx"
    onnx.save(build(), path)
    assert verify.main([str(path), "--pipeline", flow]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and named in err, err


def test_truncated_file_is_refused(flow: str, tmp_path: Path,
                                   capsys: pytest.CaptureFixture) -> None:
    path = tmp_path / "cut.onnx"
    path.write_bytes(_neg(F32).SerializeToString()[:40])
    assert verify.main([str(path), "--pipeline", flow]) == 2
    assert "cut.onnx" in capsys.readouterr().err


def test_importer_failures_are_model_errors(flow: str, tmp_path: Path,
                                            capsys: pytest.CaptureFixture) -> None:
    """Shapes that cannot be mapped (a reshape to a different element count) stop in the
    front end with a ModelError, not a traceback."""
    model = make_model([helper.make_node("Reshape", ["x", "s"], ["y"], name="bad_reshape")],
                       {"x": ([4, 8], F32)}, {"y": ([5, 7], F32)},
                       {"s": np.array([5, 7], np.int64)})
    path = tmp_path / "reshape.onnx"
    onnx.save(model, path)
    assert verify.main([str(path), "--pipeline", flow]) == 2
    assert "Reshape" in capsys.readouterr().err


def _plan_or_skip(scheduled) -> StitchPlan:
    plan = StitchPlan.of_module(scheduled)
    if plan is None:
        pytest.skip("the flow under test attaches no stitch plan (baseline)")
    return plan


def test_column_reduction_is_a_listed_fallback_with_right_numbers(flow: str) -> None:
    nodes = [helper.make_node("ReduceSum", ["x", "axes"], ["s"], keepdims=1),
             helper.make_node("Sub", ["x", "s"], ["y"])]
    model = make_model(nodes, {"x": ([64, 8], F32)}, {"y": ([64, 8], F32)},
                       {"axes": np.array([0], np.int64)})
    plan = _plan_or_skip(verify.compile_model(model, flow))
    assert plan.groups or plan.fallbacks
    assert all(f.reason for f in plan.fallbacks)
    assert check_model(model, flow).kind == "ok"


@pytest.mark.parametrize(("shape", "axis", "stitched"),
                         [(["n", 40], -1, True), ([5, "k"], -1, True), (["n", 40], 0, False)])
def test_symbolic_shapes_stitch_or_fall_back_and_run(shape: list, axis: int, stitched: bool,
                                                     flow: str) -> None:
    """A symbolic row count stitches (its grid is computed at run time), and so does a
    symbolic row length (the row walked at run time); a symbolic length reduced over the
    first axis (a column reduction) whose 40 column sums a block of 32 threads would sum in
    place over a wave of run-time tiles falls back to TVM with the reason in the plan. All
    run right."""
    model = make_model([helper.make_node("Softmax", ["x"], ["y"], axis=axis)],
                       {"x": (shape, F32)}, {"y": (shape, F32)})
    scheduled = verify.compile_model(model, flow)
    plan = StitchPlan.of_module(scheduled)
    if plan is not None:
        assert bool(plan.groups) is stitched
        assert stitched or any("symbolic" in f.reason for f in plan.fallbacks)
    x = np.random.default_rng(0).standard_normal((5, 40)).astype(np.float32)
    (y,) = SimtModule(scheduled)(x)
    e = np.exp(x - x.max(axis, keepdims=True))
    np.testing.assert_allclose(y, e / e.sum(axis, keepdims=True), rtol=1e-5, atol=1e-6)


def test_matmul_splits_the_graph_and_numbers_stay_right(flow: str) -> None:
    nodes = [helper.make_node("LayerNormalization", ["x", "g"], ["ln"], axis=-1),
             helper.make_node("MatMul", ["ln", "w"], ["h"]),
             helper.make_node("Softmax", ["h"], ["y"], axis=-1)]
    rng = np.random.default_rng(1)
    model = make_model(nodes, {"x": ([32, 64], F32)}, {"y": ([32, 48], F32)},
                       {"g": np.ones(64, np.float32),
                        "w": (rng.standard_normal((64, 48)) / 8).astype(np.float32)})
    outcome = check_model(model, flow)
    assert outcome.kind == "ok" and not outcome.violations, outcome.error


@pytest.mark.parametrize("elem_type", [TensorProto.DOUBLE, TensorProto.INT64,
                                       TensorProto.INT32, TensorProto.BOOL])
def test_other_supported_dtypes_run_right(elem_type: int, flow: str) -> None:
    if elem_type == TensorProto.BOOL:
        nodes = [helper.make_node("Not", ["x"], ["n"]), helper.make_node("Xor", ["x", "n"], ["y"])]
    else:
        nodes = [helper.make_node("ReduceMax", ["x", "axes"], ["m"], keepdims=1),
                 helper.make_node("Sub", ["x", "m"], ["y"])]
    model = make_model(nodes, {"x": ([6, 10], elem_type)}, {"y": ([6, 10], elem_type)},
                       {"axes": np.array([1], np.int64)} if elem_type != TensorProto.BOOL
                       else None)
    outcome = check_model(model, flow)
    assert outcome.kind == "ok" and not outcome.violations, outcome.error
