"""Micro workloads at ci size: valid ONNX, run in onnxruntime, and match numpy references."""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import helper, numpy_helper

from tvm_stitch import workloads
from tvm_stitch.workloads.micro import ADAM, BN_MOMENTUM, EPS, MASKED

Arrays = dict[str, np.ndarray]


def _run(model: onnx.ModelProto, feeds: Arrays) -> list[np.ndarray]:
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, feeds)


def _weights(model: onnx.ModelProto) -> Arrays:
    return {t.name: numpy_helper.to_array(t).astype(np.float64) for t in model.graph.initializer}


def _softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def _layer_norm(x: np.ndarray, gamma: np.ndarray, beta: np.ndarray) -> np.ndarray:
    centred = x - x.mean(-1, keepdims=True)
    return centred / np.sqrt(centred.var(-1, keepdims=True) + EPS) * gamma + beta


def _gelu(x: np.ndarray) -> np.ndarray:
    return 0.5 * x * (1.0 + np.vectorize(math.erf)(x / math.sqrt(2.0)))


def _nll(f: Arrays) -> float:
    shifted = f["logits"] - f["logits"].max(-1, keepdims=True)
    log_probs = shifted - np.log(np.exp(shifted).sum(-1, keepdims=True))
    return -log_probs[np.arange(len(log_probs)), f["targets"]].mean()


def _layernorm_backward(f: Arrays) -> list[np.ndarray]:
    xhat = (f["x"] - f["mean"]) * f["rstd"]
    g = f["dy"] * f["gamma"]
    width = g.shape[-1]
    dx = f["rstd"] / width * (width * g - g.sum(-1, keepdims=True)
                              - xhat * (g * xhat).sum(-1, keepdims=True))
    return [dx, (f["dy"] * xhat).sum(0), f["dy"].sum(0)]


def _batchnorm(f: Arrays, w: Arrays) -> list[np.ndarray]:
    x = f["x"]
    mean, var = x.mean(0, keepdims=True), x.var(0, keepdims=True)
    return [(x - mean) / np.sqrt(var + EPS) * w["gamma"] + w["beta"], mean, var]


def _batchnorm_nchw(f: Arrays, w: Arrays) -> list[np.ndarray]:
    x, channel = f["x"], (1, -1, 1, 1)
    mean, var = x.mean((0, 2, 3)), x.var((0, 2, 3))
    y = (x - mean.reshape(channel)) / np.sqrt(var.reshape(channel) + EPS)
    y = y * w["gamma"].reshape(channel) + w["beta"].reshape(channel)
    m = BN_MOMENTUM
    return [np.maximum(y, 0), w["mean"] * m + mean * (1 - m), w["var"] * m + var * (1 - m)]


def _adam(f: Arrays) -> list[np.ndarray]:
    b1, b2, t = ADAM["beta1"], ADAM["beta2"], ADAM["step"]
    m = b1 * f["m"] + (1 - b1) * f["grad"]
    v = b2 * f["v"] + (1 - b2) * f["grad"] ** 2
    step = ADAM["lr"] * (m / (1 - b1**t)) / (np.sqrt(v / (1 - b2**t)) + ADAM["eps"])
    return [f["param"] - step, m, v]


def _group_norm_silu(x: np.ndarray, gamma: np.ndarray, beta: np.ndarray) -> np.ndarray:
    batch, channels = x.shape[:2]
    grouped = x.reshape(batch, min(32, channels // 8), -1)
    mean, var = grouped.mean(-1, keepdims=True), grouped.var(-1, keepdims=True)
    y = ((grouped - mean) / np.sqrt(var + EPS)).reshape(x.shape) * gamma + beta
    return y / (1 + np.exp(-y))


# name -> (feeds, weights) -> expected outputs, in float64
REFERENCES: dict[str, Callable[[Arrays, Arrays], list[np.ndarray]]] = {
    "softmax": lambda f, w: [_softmax(f["x"])],
    "layer_norm": lambda f, w: [_layer_norm(f["x"], w["gamma"], w["beta"])],
    "add_layer_norm": lambda f, w: [_layer_norm(f["x"] + f["residual"], w["gamma"], w["beta"])],
    "rms_norm": lambda f, w: [
        f["x"] / np.sqrt((f["x"] ** 2).mean(-1, keepdims=True) + EPS) * w["gamma"]
    ],
    "bias_gelu": lambda f, w: [_gelu(f["x"] + w["bias"])],
    "scale_mask_softmax": lambda f, w: [_softmax(f["scores"] / 8.0 + f["mask"])],
    "layernorm_softmax_add": lambda f, w: [
        _softmax(_layer_norm(f["x"], w["gamma"], w["beta"])) + f["x"]
    ],
    "logsoftmax_nll": lambda f, w: [np.asarray(_nll(f))],
    "cross_entropy_128256": lambda f, w: [np.asarray(_nll(f))],
    "layernorm_backward": lambda f, w: _layernorm_backward(f),
    "batchnorm_train": _batchnorm,
    "batchnorm_nchw_train": _batchnorm_nchw,
    "adam_update": lambda f, w: _adam(f),
    "rowreduce_750000x32": lambda f, w: [f["x"].sum(-1)],
    "softmax_64x30000": lambda f, w: [_softmax(f["x"])],
    "colsum_8192x1024": lambda f, w: [f["x"].sum(0)],
    "group_norm_silu": lambda f, w: [_group_norm_silu(f["x"], w["gamma"], w["beta"])],
}

MICRO = workloads.names("micro")


def test_every_micro_workload_has_a_reference() -> None:
    assert sorted(REFERENCES) == sorted(MICRO)


@pytest.mark.parametrize("name", MICRO)
def test_micro_ci_matches_numpy_reference(name: str) -> None:
    model = workloads.get(name).model("ci")
    onnx.checker.check_model(model, full_check=True)
    assert [(o.domain, o.version) for o in model.opset_import] == [("", 18)]
    feeds = workloads.inputs(model, seed=1)
    outputs = _run(model, feeds)
    assert all(np.isfinite(o).all() for o in outputs)
    as64 = {k: v.astype(np.float64) if v.dtype.kind == "f" else v for k, v in feeds.items()}
    expected = REFERENCES[name](as64, _weights(model))
    assert len(outputs) == len(expected)
    for got, want in zip(outputs, expected, strict=True):
        assert got.shape == want.shape
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("name", ["softmax", "softmax_64x30000", "scale_mask_softmax"])
def test_softmax_rows_sum_to_one(name: str) -> None:
    model = workloads.get(name).model("ci")
    (probs,) = _run(model, workloads.inputs(model))
    np.testing.assert_allclose(probs.sum(-1), 1.0, rtol=1e-5)
    assert (probs >= 0).all()


def test_scale_mask_softmax_gives_masked_keys_no_weight() -> None:
    model = workloads.get("scale_mask_softmax").model("ci")
    feeds = workloads.inputs(model, seed=3)
    (probs,) = _run(model, feeds)
    masked = np.broadcast_to(feeds["mask"] == MASKED, probs.shape)
    assert masked.any() and (~masked).any()
    assert probs[masked].max() < 1e-6


@pytest.mark.parametrize("name", ["layer_norm", "add_layer_norm", "layernorm_softmax_add"])
def test_layer_norm_rows_are_normalised(name: str) -> None:
    """Undo gamma/beta: the normalised rows have zero mean and unit variance."""
    model = workloads.get(name).model("ci")
    feeds = workloads.inputs(model)
    w = _weights(model)
    if name == "layernorm_softmax_add":
        # Strip the graph back to its LayerNormalization output.
        ln = next(n for n in model.graph.node if n.op_type == "LayerNormalization")
        model.graph.ClearField("output")
        model.graph.output.append(helper.make_tensor_value_info(ln.output[0], 1, None))
    y = _run(model, feeds)[0].astype(np.float64)
    normed = (y - w["beta"]) / w["gamma"]
    np.testing.assert_allclose(normed.mean(-1), 0.0, atol=1e-4)
    np.testing.assert_allclose(normed.var(-1), 1.0, rtol=1e-3)


def test_logsoftmax_nll_equals_onnx_nll_operator() -> None:
    """Our gather formulation against onnxruntime's own NegativeLogLikelihoodLoss."""
    model = workloads.get("logsoftmax_nll").model("ci")
    feeds = workloads.inputs(model, seed=2)
    (loss,) = _run(model, feeds)
    logits, targets = model.graph.input
    nodes = [
        helper.make_node("LogSoftmax", ["logits"], ["lp"], axis=-1),
        helper.make_node("NegativeLogLikelihoodLoss", ["lp", "targets"], ["loss"],
                         reduction="mean"),
    ]
    out = helper.make_tensor_value_info("loss", onnx.TensorProto.FLOAT, [])
    graph = helper.make_graph(nodes, "nll", [logits, targets], [out])
    reference = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    (want,) = _run(reference, feeds)
    assert loss.shape == () and loss > 0
    np.testing.assert_allclose(loss, want, rtol=1e-5)


def test_layernorm_backward_is_the_gradient_of_layer_norm() -> None:
    """With mean/rstd saved from x, dx matches finite differences of sum(dy * layer_norm(x))."""
    model = workloads.get("layernorm_backward").model("ci")
    f = {k: v.astype(np.float64) for k, v in workloads.inputs(model, seed=4).items()}
    x = f["x"]
    f["mean"] = x.mean(-1, keepdims=True)
    f["rstd"] = 1.0 / np.sqrt(x.var(-1, keepdims=True) + EPS)
    dx, dgamma, dbeta = _run(model, {k: v.astype(np.float32) for k, v in f.items()})

    def row_losses(x: np.ndarray) -> np.ndarray:
        return (f["dy"] * _layer_norm(x, f["gamma"], 0.0)).sum(-1)

    h = 1e-4
    numeric = np.empty_like(x)
    for j in range(x.shape[1]):  # rows are independent: perturb one column of every row at once
        step = np.zeros_like(x)
        step[:, j] = h
        numeric[:, j] = (row_losses(x + step) - row_losses(x - step)) / (2 * h)
    np.testing.assert_allclose(dx, numeric, rtol=1e-3, atol=1e-3)
    xhat = (x - f["mean"]) * f["rstd"]
    np.testing.assert_allclose(dgamma, (f["dy"] * xhat).sum(0), rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(dbeta, f["dy"].sum(0), rtol=1e-4, atol=1e-4)


def test_micro_models_are_deterministic() -> None:
    for name in MICRO:
        first = workloads.get(name).model("ci").SerializeToString()
        assert workloads.get(name).model("ci").SerializeToString() == first, name


def test_micro_models_use_the_oldest_ir_version_of_their_opset() -> None:
    """onnxruntime releases lag behind the onnx package's newest IR version (the GPU
    machine's onnxruntime 1.30 refused IR 14), so the models declare the opset's own."""
    for name in MICRO:
        model = workloads.get(name).model("ci")
        assert model.ir_version == helper.find_min_ir_version_for(list(model.opset_import))
