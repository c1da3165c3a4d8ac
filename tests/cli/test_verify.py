"""verify and the tvm-stitch command line, end to end on real workloads."""

import json

import numpy as np
import onnx
import pytest

from tvm_stitch import cli, verify, workloads


@pytest.fixture(scope="module")
def layer_norm_path(tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("models") / "layer_norm.onnx"
    onnx.save(workloads.get("layer_norm").model("ci"), path)
    return str(path)


def test_verify_prints_json_and_matches(layer_norm_path, capsys) -> None:
    assert verify.main([layer_norm_path, "--pipeline", "baseline"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert set(result) == {"kernels", "global_bytes", "compulsory_bytes", "traffic_ratio",
                           "max_abs_err", "ok"}
    assert result["ok"] is True
    assert result["kernels"] == 1
    # 64x256 float32: x in, y out, gamma and beta once each.
    assert result["compulsory_bytes"] == 64 * 256 * 4 * 2 + 256 * 4 * 2
    assert result["max_abs_err"] < 1e-4


def test_verify_stitch_makes_one_kernel_and_prints_the_plan(tmp_path, capsys) -> None:
    path = tmp_path / "lsa.onnx"
    onnx.save(workloads.get("layernorm_softmax_add").model("ci"), path)
    assert verify.main([str(path), "--pipeline", "stitch", "--plan"]) == 0
    captured = capsys.readouterr()
    result = json.loads(captured.out)
    assert result["ok"] is True and result["kernels"] == 1
    assert "StitchPlan: 1 stitched group(s)" in captured.err


def test_unknown_pipeline_is_refused(layer_norm_path, capsys) -> None:
    assert verify.main([layer_norm_path, "--pipeline", "nonsense"]) == 2
    assert "not available" in capsys.readouterr().err


def test_malformed_model_is_refused(tmp_path, capsys) -> None:
    path = tmp_path / "bad.onnx"
    path.write_bytes(b"garbage")
    assert verify.main([str(path)]) == 2
    assert "bad.onnx" in capsys.readouterr().err


def test_compare_catches_nan_and_small_errors() -> None:
    ref = [np.ones((4, 4), np.float32)]
    assert verify.compare([ref[0] + 5e-5], ref).ok
    assert not verify.compare([ref[0] + 1e-3], ref).ok
    nan = ref[0].copy()
    nan[1, 2] = np.nan
    check = verify.compare([nan], ref)
    assert not check.ok and check.max_abs_err == np.inf
    assert not verify.compare([np.ones((4, 5), np.float32)], ref).ok
    assert not verify.compare([np.array([1, 2])], [np.array([1, 3])]).ok


def test_boolean_masks_of_a_real_model_run_correctly() -> None:
    """bert_layer's attention mask goes through vectorised boolean kernels."""
    pytest.importorskip("torch")
    model = workloads.get("bert_layer").model("ci")
    scheduled = verify.compile_model(model, "baseline")
    check = verify.run_simt(scheduled, model)
    assert check.ok, check.max_abs_err


def test_cli_demo_and_workloads(capsys) -> None:
    assert cli.main(["demo", "--workload", "softmax"]) == 0
    out = capsys.readouterr().out
    assert "== baseline ==" in out and "== stitch ==" in out
    assert out.count("SIMT run matches onnxruntime") == 2
    assert cli.main(["workloads"]) == 0
    assert "colsum_8192x1024" in capsys.readouterr().out
