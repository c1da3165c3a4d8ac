"""Micro patterns: the memory-intensive subgraphs of DESIGN.md section 7, built with onnx.helper.

Every builder takes the shape of its first input and returns an opset-18 float32 model whose
weights are initializers drawn from a seeded RNG, so the same shape always gives the same model.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import numpy as np
import onnx

from .graph import GraphBuilder
from .inputs import integers, prefix, uniform
from .registry import Workload, register

Shape = tuple[int, ...]

EPS = 1e-5
MASKED = -10000.0  # additive attention-mask value, as BERT uses for padded keys


def _layer_norm(b: GraphBuilder, x: str, width: int, name: str | None = None) -> str:
    """LayerNormalization over the last axis with seeded gamma (around 1) and beta."""
    gamma = b.weight("gamma", (width,), mean=1.0, std=0.1)
    beta = b.weight("beta", (width,), std=0.1)
    return b.op("LayerNormalization", x, gamma, beta, axis=-1, epsilon=EPS,
                outputs=[name] if name else 1)


def _softmax(b: GraphBuilder, x: str, name: str | None = None) -> str:
    return b.op("Softmax", x, axis=-1, outputs=[name] if name else 1)


def _single_input(name: str, shape: Sequence[int], body: Callable[[GraphBuilder, str], str],
                  doc: str) -> onnx.ModelProto:
    """A model with one float input ``x`` and the one output ``body`` computes from it."""
    b = GraphBuilder(name)
    return b.model([body(b, b.input("x", shape))], doc)


def _reduce_sum(b: GraphBuilder, x: str, axis: int, keepdims: int = 1,
                name: str | None = None) -> str:
    return b.op("ReduceSum", x, b.axes(axis), keepdims=keepdims, outputs=[name] if name else 1)


def softmax(shape: Sequence[int]) -> onnx.ModelProto:
    """Softmax over the last axis."""
    return _single_input("softmax", shape, lambda b, x: _softmax(b, x, "y"), softmax.__doc__)


def layer_norm(shape: Sequence[int]) -> onnx.ModelProto:
    """LayerNormalization over the last axis with learned gamma and beta."""
    return _single_input("layer_norm", shape, lambda b, x: _layer_norm(b, x, shape[-1], "y"),
                         layer_norm.__doc__)


def add_layer_norm(shape: Sequence[int]) -> onnx.ModelProto:
    """Residual add then LayerNormalization: ``layer_norm(x + residual)``."""
    b = GraphBuilder("add_layer_norm")
    total = b.op("Add", b.input("x", shape), b.input("residual", shape))
    return b.model([_layer_norm(b, total, shape[-1], "y")], add_layer_norm.__doc__)


def rms_norm(shape: Sequence[int]) -> onnx.ModelProto:
    """RMSNorm, ``x / sqrt(mean(x^2) + eps) * gamma``, from Pow/ReduceMean/Add/Sqrt/Div/Mul
    (opset 18 has no RMSNormalization)."""
    b = GraphBuilder("rms_norm")
    x = b.input("x", shape)
    mean_square = b.op("ReduceMean", b.op("Pow", x, b.constant(2.0)), b.axes(-1), keepdims=1)
    rms = b.op("Sqrt", b.op("Add", mean_square, b.constant(EPS)))
    normed = b.op("Mul", x, b.op("Div", b.constant(1.0), rms))
    gamma = b.weight("gamma", (shape[-1],), mean=1.0, std=0.1)
    return b.model([b.op("Mul", normed, gamma, outputs=["y"])], rms_norm.__doc__)


def bias_gelu(shape: Sequence[int]) -> onnx.ModelProto:
    """Bias add then exact GELU, ``y * 0.5 * (1 + erf(y / sqrt(2)))`` with ``y = x + bias``."""
    b = GraphBuilder("bias_gelu")
    y = b.op("Add", b.input("x", shape), b.weight("bias", (shape[-1],), std=0.1))
    erf = b.op("Erf", b.op("Div", y, b.constant(math.sqrt(2.0))))
    gelu = b.op("Mul", b.op("Mul", y, b.op("Add", erf, b.constant(1.0))), b.constant(0.5),
                outputs=["y"])
    return b.model([gelu], bias_gelu.__doc__)


def scale_mask_softmax(shape: Sequence[int]) -> onnx.ModelProto:
    """Attention scores (batch x heads x seq x seq): scale, add a padding mask of shape
    batch x 1 x 1 x seq broadcast over heads and queries, softmax over keys."""
    batch, _, _, keys = shape
    b = GraphBuilder("scale_mask_softmax")
    scores = b.input("scores", shape)
    mask = b.input("mask", (batch, 1, 1, keys), dist=prefix(MASKED, 0.0))
    scaled = b.op("Mul", scores, b.constant(1.0 / math.sqrt(64.0)))  # head dim 64
    return b.model([_softmax(b, b.op("Add", scaled, mask), "probs")], scale_mask_softmax.__doc__)


def layernorm_softmax_add(shape: Sequence[int]) -> onnx.ModelProto:
    """``softmax(layer_norm(x)) + x`` (the DESIGN.md section 1 example)."""

    def body(b: GraphBuilder, x: str) -> str:
        return b.op("Add", _softmax(b, _layer_norm(b, x, shape[-1])), x, outputs=["y"])

    return _single_input("layernorm_softmax_add", shape, body, layernorm_softmax_add.__doc__)


def logsoftmax_nll(shape: Sequence[int]) -> onnx.ModelProto:
    """Mean negative log-likelihood of int64 ``targets`` under ``log_softmax(logits)``.

    Written as LogSoftmax + GatherElements + ReduceMean + Neg, which is what
    NegativeLogLikelihoodLoss computes: TVM 0.27's ONNX importer has no NLL operator.
    """
    rows, classes = shape
    b = GraphBuilder("logsoftmax_nll")
    log_probs = b.op("LogSoftmax", b.input("logits", shape), axis=-1)
    targets = b.input("targets", (rows,), np.int64, dist=integers(0, classes))
    index = b.op("Unsqueeze", targets, b.axes(1))
    picked = b.op("GatherElements", log_probs, index, axis=1)
    mean = b.op("ReduceMean", picked, b.axes(0, 1), keepdims=0)
    return b.model([b.op("Neg", mean, outputs=["loss"])], logsoftmax_nll.__doc__)


def layernorm_backward(shape: Sequence[int]) -> onnx.ModelProto:
    """LayerNorm backward over rows of width D from saved ``mean`` and ``rstd`` (rows x 1):
    ``dgamma``, ``dbeta`` are column sums; ``dx`` needs two row sums:
    ``dx = rstd * (g - sum(g)/D - xhat * sum(g * xhat)/D)`` with ``g = dy * gamma``."""
    rows, width = shape
    b = GraphBuilder("layernorm_backward")
    dy = b.input("dy", shape)
    x = b.input("x", shape)
    gamma = b.input("gamma", (width,))
    mean = b.input("mean", (rows, 1))
    rstd = b.input("rstd", (rows, 1), dist=uniform(0.5, 2.0))
    xhat = b.op("Mul", b.op("Sub", x, mean), rstd)
    dgamma = _reduce_sum(b, b.op("Mul", dy, xhat), 0, keepdims=0, name="dgamma")
    dbeta = _reduce_sum(b, dy, 0, keepdims=0, name="dbeta")
    g = b.op("Mul", dy, gamma)
    inv_width = b.constant(1.0 / width)
    mean_g = b.op("Mul", _reduce_sum(b, g, -1), inv_width)
    mean_gx = b.op("Mul", _reduce_sum(b, b.op("Mul", g, xhat), -1), inv_width)
    centred = b.op("Sub", b.op("Sub", g, mean_g), b.op("Mul", xhat, mean_gx))
    dx = b.op("Mul", centred, rstd, outputs=["dx"])
    return b.model([dx, dgamma, dbeta], layernorm_backward.__doc__)


def batchnorm_train(shape: Sequence[int]) -> onnx.ModelProto:
    """Batch-norm training step on rows x channels: batch mean and biased variance (column
    reductions, keepdims), then normalise with gamma/beta. Outputs ``y``, ``mean``, ``var``."""
    b = GraphBuilder("batchnorm_train")
    x = b.input("x", shape)
    mean = b.op("ReduceMean", x, b.axes(0), keepdims=1, outputs=["mean"])
    centred = b.op("Sub", x, mean)
    var = b.op("ReduceMean", b.op("Mul", centred, centred), b.axes(0), keepdims=1,
               outputs=["var"])
    normed = b.op("Div", centred, b.op("Sqrt", b.op("Add", var, b.constant(EPS))))
    gamma = b.weight("gamma", (shape[-1],), mean=1.0, std=0.1)
    beta = b.weight("beta", (shape[-1],), std=0.1)
    y = b.op("Add", b.op("Mul", normed, gamma), beta, outputs=["y"])
    return b.model([y, mean, var], batchnorm_train.__doc__)


BN_MOMENTUM = 0.9


def batchnorm_nchw_train(shape: Sequence[int]) -> onnx.ModelProto:
    """A conv net's batch-norm training step over (B, C, H, W), as torch exports it: a
    BatchNormalization in training mode (the batch's mean and variance over every axis but
    the channels', the running statistics updated with momentum ``BN_MOMENTUM``), then ReLU.
    Outputs ``y``, ``running_mean``, ``running_var``."""
    b = GraphBuilder("batchnorm_nchw_train")
    x = b.input("x", shape)
    channels = (shape[1],)
    gamma = b.weight("gamma", channels, mean=1.0, std=0.1)
    beta = b.weight("beta", channels, std=0.1)
    mean = b.weight("mean", channels, std=0.1)
    var = b.constant(b.rng.uniform(0.5, 1.5, channels), "var")
    normed, running_mean, running_var = b.op(
        "BatchNormalization", x, gamma, beta, mean, var, epsilon=EPS, momentum=BN_MOMENTUM,
        training_mode=1, outputs=["normed", "running_mean", "running_var"])
    y = b.op("Relu", normed, outputs=["y"])
    return b.model([y, running_mean, running_var], batchnorm_nchw_train.__doc__)


ADAM = {"lr": 1e-3, "beta1": 0.9, "beta2": 0.999, "eps": 1e-8, "step": 10}


def adam_update(shape: Sequence[int]) -> onnx.ModelProto:
    """One Adam step with bias correction (constants in ``ADAM``): inputs ``param``, ``grad``,
    ``m``, ``v``; outputs ``param_out``, ``m_out``, ``v_out``."""
    b = GraphBuilder("adam_update")
    param, grad, m = (b.input(name, shape) for name in ("param", "grad", "m"))
    v = b.input("v", shape, dist=uniform(0.0, 1.0))
    beta1, beta2, step = ADAM["beta1"], ADAM["beta2"], ADAM["step"]

    def blend(old: str, new: str, beta: float, name: str) -> str:
        return b.op("Add", b.op("Mul", old, b.constant(beta)),
                    b.op("Mul", new, b.constant(1.0 - beta)), outputs=[name])

    m_out = blend(m, grad, beta1, "m_out")
    v_out = blend(v, b.op("Mul", grad, grad), beta2, "v_out")
    m_hat = b.op("Mul", m_out, b.constant(1.0 / (1.0 - beta1**step)))
    v_hat = b.op("Mul", v_out, b.constant(1.0 / (1.0 - beta2**step)))
    denom = b.op("Add", b.op("Sqrt", v_hat), b.constant(ADAM["eps"]))
    update = b.op("Mul", b.op("Div", m_hat, denom), b.constant(ADAM["lr"]))
    param_out = b.op("Sub", param, update, outputs=["param_out"])
    return b.model([param_out, m_out, v_out], adam_update.__doc__)


def row_sum(shape: Sequence[int]) -> onnx.ModelProto:
    """ReduceSum over the last axis (many short rows in ``rowreduce_750000x32``)."""
    return _single_input("row_sum", shape, lambda b, x: _reduce_sum(b, x, -1, 0, "y"),
                         row_sum.__doc__)


def column_sum(shape: Sequence[int]) -> onnx.ModelProto:
    """ReduceSum over the first axis (a column reduction)."""
    return _single_input("column_sum", shape, lambda b, x: _reduce_sum(b, x, 0, 0, "y"),
                         column_sum.__doc__)


def group_norm_silu(shape: Sequence[int]) -> onnx.ModelProto:
    """GroupNorm + SiLU over (B, C, H, W) as torch exports it before opset 18 (diffusion
    U-Nets and VAEs): a reshape to (B, G, C / G x H x W), InstanceNormalization, a reshape
    back, the per-channel scale and shift, SiLU; 8 channels per group, at most 32 groups."""
    batch, channels = shape[0], shape[1]
    groups = min(32, channels // 8)

    def body(b: GraphBuilder, x: str) -> str:
        grouped = b.op("Reshape", x, b.constant([batch, groups, -1], dtype=np.int64))
        normed = b.op("InstanceNormalization", grouped, b.constant(np.ones(groups)),
                      b.constant(np.zeros(groups)), epsilon=EPS)
        back = b.op("Reshape", normed, b.constant(list(shape), dtype=np.int64))
        scaled = b.op("Mul", back, b.weight("gamma", (channels, 1, 1), mean=1.0, std=0.1))
        shifted = b.op("Add", scaled, b.weight("beta", (channels, 1, 1), std=0.1))
        return b.op("Mul", shifted, b.op("Sigmoid", shifted), outputs=["y"])

    return _single_input("group_norm_silu", shape, body, group_norm_silu.__doc__)


def _register(name: str, build: Callable[[Sequence[int]], onnx.ModelProto], ci: Shape,
              real: Shape, description: str | None = None) -> None:
    shapes = {"ci": ci, "real": real}
    register(
        Workload(
            name=name,
            kind="micro",
            description=description or " ".join((build.__doc__ or "").split("\n\n")[0].split()),
            sizes={size: "x".join(map(str, dims)) for size, dims in shapes.items()},
            build=lambda size: build(shapes[size]),
        )
    )


_register("softmax", softmax, (64, 256), (8192, 1024))
_register("layer_norm", layer_norm, (64, 256), (8192, 768))
_register("add_layer_norm", add_layer_norm, (64, 256), (8192, 768))
_register("rms_norm", rms_norm, (64, 256), (8192, 4096))
_register("bias_gelu", bias_gelu, (32, 1024), (8192, 3072))
_register("scale_mask_softmax", scale_mask_softmax, (2, 4, 64, 64), (8, 12, 512, 512),
          "Attention scores: scale, padding mask broadcast over heads, softmax")
_register("layernorm_softmax_add", layernorm_softmax_add, (64, 256), (128, 768))
_register("logsoftmax_nll", logsoftmax_nll, (32, 1000), (2048, 32000),
          "LogSoftmax + negative log-likelihood loss of int64 targets (mean)")
_register("cross_entropy_128256", logsoftmax_nll, (1, 50257), (2048, 128256),
          "Cross-entropy (LogSoftmax + NLL) over a vocabulary of LLaMA 3's size: a row of "
          "logits is too long for the chip (one row of GPT-2's vocabulary at ci size)")
_register("layernorm_backward", layernorm_backward, (64, 256), (8192, 768),
          "LayerNorm backward: dx (row reductions), dgamma and dbeta (column reductions)")
_register("batchnorm_train", batchnorm_train, (256, 128), (16384, 1024),
          "Batch-norm training statistics (column reductions) and normalisation")
_register("batchnorm_nchw_train", batchnorm_nchw_train, (8, 32, 14, 14), (32, 64, 56, 56),
          "Batch-norm training step of a conv net over (B, C, H, W) (training-mode "
          "BatchNormalization: statistics over mixed axes), then ReLU")
_register("adam_update", adam_update, (32, 1024), (4096, 4096),
          "Adam optimizer step: 4 inputs, 3 outputs, element-wise only")
_register("rowreduce_750000x32", row_sum, (2000, 32), (750000, 32),
          "Row sum over many short rows (irregular shape)")
_register("softmax_64x30000", softmax, (4, 3000), (64, 30000),
          "Softmax over few very long rows (irregular shape)")
_register("colsum_8192x1024", column_sum, (256, 128), (8192, 1024),
          "Column sum (ReduceSum over axis 0)")
_register("group_norm_silu", group_norm_silu, (2, 64, 16, 16), (2, 320, 64, 64),
          "GroupNorm + SiLU as torch exports it (InstanceNormalization between reshapes), "
          "32 groups at Stable Diffusion's (2, 320, 64, 64)")
