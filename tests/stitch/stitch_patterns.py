"""Small ONNX graphs of the memory-intensive patterns the stitch pass must handle.

Each builder returns ``(model, inputs)``: an ONNX model made with ``onnx.helper`` and random
inputs for it. Sizes are small so that the SIMT runner (OpenCL on PoCL) stays quick.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper

OPSET = 18
_rng = np.random.default_rng(0)


def _f32(*shape: int) -> np.ndarray:
    return _rng.standard_normal(shape).astype("float32")


def _vi(name: str, shape: tuple[int, ...], dtype: int = TensorProto.FLOAT):
    return helper.make_tensor_value_info(name, dtype, list(shape))


def _const(name: str, array: np.ndarray):
    return helper.make_tensor(name, helper.np_dtype_to_tensor_dtype(array.dtype),
                              list(array.shape), array.flatten().tolist())


def _model(nodes, inputs, outputs, initializers=(), opset: int = OPSET) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, "pattern", inputs, outputs, initializer=list(initializers))
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model


def _layer_norm(x: str, out: str, d: int, tag: str = "") -> tuple[list, list]:
    gamma = _const(f"gamma{tag}", (_rng.random(d) + 0.5).astype("float32"))
    beta = _const(f"beta{tag}", _rng.standard_normal(d).astype("float32"))
    node = helper.make_node("LayerNormalization", [x, gamma.name, beta.name], [out], axis=-1,
                            epsilon=1e-5)
    return [node], [gamma, beta]


def softmax(n: int = 16, d: int = 64):
    """softmax over the last axis."""
    nodes = [helper.make_node("Softmax", ["x"], ["out"], axis=-1)]
    return _model(nodes, [_vi("x", (n, d))], [_vi("out", (n, d))]), {"x": _f32(n, d)}


def layer_norm(n: int = 16, d: int = 64):
    """LayerNormalization over the last axis."""
    nodes, inits = _layer_norm("x", "out", d)
    return _model(nodes, [_vi("x", (n, d))], [_vi("out", (n, d))], inits), {"x": _f32(n, d)}


def add_layer_norm(n: int = 16, d: int = 64):
    """Residual add followed by a layer norm; both the sum and the norm are outputs."""
    ln, inits = _layer_norm("sum", "out", d)
    nodes = [helper.make_node("Add", ["x", "res"], ["sum"]), *ln]
    model = _model(nodes, [_vi("x", (n, d)), _vi("res", (n, d))],
                   [_vi("out", (n, d)), _vi("sum", (n, d))], inits)
    return model, {"x": _f32(n, d), "res": _f32(n, d)}


def rms_norm(n: int = 16, d: int = 64):
    """RMSNorm spelled with primitive ops: x / sqrt(mean(x^2) + eps) * w."""
    w = _const("w", (_rng.random(d) + 0.5).astype("float32"))
    eps = _const("eps", np.array(1e-6, "float32"))
    axes = _const("axes", np.array([-1], "int64"))
    nodes = [
        helper.make_node("Mul", ["x", "x"], ["sq"]),
        helper.make_node("ReduceMean", ["sq", "axes"], ["ms"], keepdims=1),
        helper.make_node("Add", ["ms", "eps"], ["mse"]),
        helper.make_node("Sqrt", ["mse"], ["rms"]),
        helper.make_node("Div", ["x", "rms"], ["xn"]),
        helper.make_node("Mul", ["xn", "w"], ["out"]),
    ]
    model = _model(nodes, [_vi("x", (n, d))], [_vi("out", (n, d))], [w, eps, axes])
    return model, {"x": _f32(n, d)}


def bias_gelu(n: int = 16, d: int = 64):
    """bias add and GELU (erf form): element-wise only."""
    b = _const("b", _rng.standard_normal(d).astype("float32"))
    half = _const("half", np.array(0.5, "float32"))
    one = _const("one", np.array(1.0, "float32"))
    rsqrt2 = _const("rsqrt2", np.array(1 / np.sqrt(2), "float32"))
    nodes = [
        helper.make_node("Add", ["x", "b"], ["h"]),
        helper.make_node("Mul", ["h", "rsqrt2"], ["hs"]),
        helper.make_node("Erf", ["hs"], ["e"]),
        helper.make_node("Add", ["e", "one"], ["e1"]),
        helper.make_node("Mul", ["h", "half"], ["hh"]),
        helper.make_node("Mul", ["hh", "e1"], ["out"]),
    ]
    model = _model(nodes, [_vi("x", (n, d))], [_vi("out", (n, d))], [b, half, one, rsqrt2])
    return model, {"x": _f32(n, d)}


def scale_mask_softmax(b: int = 2, h: int = 2, s: int = 16):
    """Attention scores: scale, add a broadcast mask, softmax over the keys."""
    scale = _const("scale", np.array(0.125, "float32"))
    nodes = [
        helper.make_node("Mul", ["scores", "scale"], ["scaled"]),
        helper.make_node("Add", ["scaled", "mask"], ["masked"]),
        helper.make_node("Softmax", ["masked"], ["out"], axis=-1),
    ]
    mask = np.where(_rng.random((b, 1, 1, s)) < 0.2, -1e4, 0.0).astype("float32")
    model = _model(nodes, [_vi("scores", (b, h, s, s)), _vi("mask", (b, 1, 1, s))],
                   [_vi("out", (b, h, s, s))], [scale])
    return model, {"scores": _f32(b, h, s, s), "mask": mask}


def log_softmax_nll(n: int = 16, c: int = 32):
    """log-softmax followed by the NLL loss (gather the target's log-probability, mean)."""
    axes = _const("axes", np.array([0, 1], "int64"))
    nodes = [
        helper.make_node("LogSoftmax", ["x"], ["lp"], axis=-1),
        helper.make_node("GatherElements", ["lp", "target"], ["picked"], axis=1),
        helper.make_node("Neg", ["picked"], ["nll"]),
        helper.make_node("ReduceMean", ["nll", "axes"], ["out"], keepdims=0),
    ]
    model = _model(nodes, [_vi("x", (n, c)), _vi("target", (n, 1), TensorProto.INT64)],
                   [_vi("out", ())], [axes])
    target = _rng.integers(0, c, (n, 1)).astype("int64")
    return model, {"x": _f32(n, c), "target": target}


def ln_softmax_add(n: int = 16, d: int = 64):
    """layer_norm -> softmax -> add: one group with two dominants."""
    ln, inits = _layer_norm("x", "ln", d)
    nodes = [*ln, helper.make_node("Softmax", ["ln"], ["sm"], axis=-1),
             helper.make_node("Add", ["sm", "y"], ["out"])]
    model = _model(nodes, [_vi("x", (n, d)), _vi("y", (n, d))], [_vi("out", (n, d))], inits)
    return model, {"x": _f32(n, d), "y": _f32(n, d)}


def matmul_between_layer_norms(n: int = 16, d: int = 64):
    """LN -> MatMul -> LN: the matmul splits the memory-intensive clusters."""
    ln1, i1 = _layer_norm("x", "a", d, "1")
    ln2, i2 = _layer_norm("m", "out", d, "2")
    w = _const("w", (_rng.standard_normal((d, d)) / np.sqrt(d)).astype("float32"))
    nodes = [*ln1, helper.make_node("MatMul", ["a", "w"], ["m"]), *ln2]
    model = _model(nodes, [_vi("x", (n, d))], [_vi("out", (n, d))], [*i1, *i2, w])
    return model, {"x": _f32(n, d)}


def residual_cycle(n: int = 16, d: int = 64):
    """LN1 -> MatMul (+ LN1 residual) -> LN2: merging LN1 with LN2 would form a cycle."""
    ln1, i1 = _layer_norm("x", "a", d, "1")
    ln2, i2 = _layer_norm("r", "out", d, "2")
    w = _const("w", (_rng.standard_normal((d, d)) / np.sqrt(d)).astype("float32"))
    nodes = [*ln1, helper.make_node("MatMul", ["a", "w"], ["m"]),
             helper.make_node("Add", ["m", "a"], ["r"]), *ln2]
    model = _model(nodes, [_vi("x", (n, d))], [_vi("out", (n, d))], [*i1, *i2, w])
    return model, {"x": _f32(n, d)}


def two_layer_norms(n: int = 16, d: int = 64):
    """Two independent layer norms of the same shape: remote stitching makes one kernel."""
    ln1, i1 = _layer_norm("x", "o1", d, "1")
    ln2, i2 = _layer_norm("y", "o2", d, "2")
    model = _model([*ln1, *ln2], [_vi("x", (n, d)), _vi("y", (n, d))],
                   [_vi("o1", (n, d)), _vi("o2", (n, d))], [*i1, *i2])
    return model, {"x": _f32(n, d), "y": _f32(n, d)}


def sibling_reads(n: int = 16, d: int = 64):
    """Three unconnected ops reading one input, -x, exp(x) and a row sum of x: remote
    stitching reads x once for all three."""
    axes = _const("axes", np.array([1], "int64"))
    nodes = [helper.make_node("Neg", ["x"], ["neg"]), helper.make_node("Exp", ["x"], ["exp"]),
             helper.make_node("ReduceSum", ["x", "axes"], ["sum"], keepdims=0)]
    model = _model(nodes, [_vi("x", (n, d))],
                   [_vi("neg", (n, d)), _vi("exp", (n, d)), _vi("sum", (n,))], [axes])
    return model, {"x": _f32(n, d)}


def layer_norm_beside_gather(n: int = 16, d: int = 64):
    """A layer norm of x beside exp(y) gathered at reversed rows: stitched with the layer
    norm's rows, a block would read exp(y) of another block's rows, so the two are grouped
    apart (a BERT embedding's LayerNorm beside its attention mask)."""
    ln, inits = _layer_norm("x", "norm", d)
    rows = _const("rows", np.arange(n - 1, -1, -1, dtype="int64"))
    nodes = [*ln, helper.make_node("Exp", ["y"], ["e"]),
             helper.make_node("Gather", ["e", "rows"], ["g"], axis=0),
             helper.make_node("Neg", ["g"], ["out"])]
    model = _model(nodes, [_vi("x", (n, d)), _vi("y", (n, d))],
                   [_vi("norm", (n, d)), _vi("out", (n, d))], [*inits, rows])
    return model, {"x": _f32(n, d), "y": _f32(n, d)}


def gathered_mask(b: int = 2, s: int = 32):
    """BERT's attention mask as transformers' encoders export it: the int64 padding mask cast
    to booleans, gathered per batch and key (GatherND), and-ed with an all-true (b, 1, s, s)
    mask and made additive (Where): the gather's result is broadcast over the query rows."""
    index = np.zeros((b, 1, 1, s, 2), "int64")
    index[..., 0] = np.arange(b)[:, None, None, None]
    index[..., 1] = np.arange(s)
    inits = [_const("index", index), _const("full", np.ones((b, 1, s, s), bool)),
             _const("zero", np.array(0.0, "float32")),
             _const("lowest", np.array(np.finfo("float32").min, "float32"))]
    nodes = [helper.make_node("Cast", ["mask"], ["on"], to=TensorProto.BOOL),
             helper.make_node("GatherND", ["on", "index"], ["keys"]),
             helper.make_node("And", ["full", "keys"], ["both"]),
             helper.make_node("Where", ["both", "zero", "lowest"], ["out"])]
    mask = np.zeros((b, s), "int64")
    for i, length in enumerate(_rng.integers(1, s + 1, b)):
        mask[i, :length] = 1
    model = _model(nodes, [_vi("mask", (b, s), TensorProto.INT64)], [_vi("out", (b, 1, s, s))],
                   inits)
    return model, {"mask": mask}


def short_sums_long_rows(n: int = 4, d: int = 8, w: int = 1 << 20):
    """exp(y) of (n, w) beside the row sums of x (n, d): few short reduced rows beside long
    element-wise rows."""
    axes = _const("axes", np.array([1], "int64"))
    nodes = [helper.make_node("Exp", ["y"], ["e"]),
             helper.make_node("ReduceSum", ["x", "axes"], ["s"], keepdims=1)]
    model = _model(nodes, [_vi("x", (n, d)), _vi("y", (n, w))],
                   [_vi("e", (n, w)), _vi("s", (n, 1))], [axes])
    return model, {"x": _f32(n, d), "y": _f32(n, w)}


def column_mean_center(n: int = 16, d: int = 64):
    """x - mean(x, axis=0): a column reduction read back by every row (Global stitching)."""
    axes = _const("axes", np.array([0], "int64"))
    nodes = [helper.make_node("ReduceMean", ["x", "axes"], ["mu"], keepdims=1),
             helper.make_node("Sub", ["x", "mu"], ["out"])]
    model = _model(nodes, [_vi("x", (n, d))], [_vi("out", (n, d))], [axes])
    return model, {"x": _f32(n, d)}


def softmax_of_transposed_log_softmax(n: int = 64, d: int = 64):
    """A softmax over the first axis of a log-softmax over the last: the softmax reads the
    log-softmax's results across its rows (fuzz graph 12011:136)."""
    nodes = [helper.make_node("LogSoftmax", ["x"], ["log"], axis=1),
             helper.make_node("Softmax", ["log"], ["out"], axis=0)]
    return _model(nodes, [_vi("x", (n, d))], [_vi("out", (n, d))]), {"x": _f32(n, d)}


def row_min_read_by_columns(n: int = 64, d: int = 64, softmax_down: bool = False):
    """where(min(x, axis=-1) > 0, x + c, c) of (n, n): the row minima (n,) broadcast along
    the last axis, so that element (i, j) reads the minimum of row j (fuzz graph 12011:136);
    with ``softmax_down``, also the softmax of x over its first axis (a transposed view whose
    result is written back across the rows)."""
    inits = [_const("axes", np.array([-1], "int64")), _const("zero", np.array(0.0, "float32")),
             _const("c", np.linspace(-1.0, 1.0, d, dtype="float32"))]
    nodes = [helper.make_node("ReduceMin", ["x", "axes"], ["m"], keepdims=0),
             helper.make_node("Greater", ["m", "zero"], ["g"]),
             helper.make_node("Add", ["x", "c"], ["a"]),
             helper.make_node("Where", ["g", "a", "c"], ["out"])]
    outputs = [_vi("out", (n, d))]
    if softmax_down:
        nodes.append(helper.make_node("Softmax", ["x"], ["down"], axis=0))
        outputs.append(_vi("down", (n, d)))
    return _model(nodes, [_vi("x", (n, d))], outputs, inits), {"x": _f32(n, d)}


def middle_axis_sum(a: int = 4, b: int = 8, c: int = 16):
    """A sum over the middle axis of (a, b, c) followed by an exp: neither a row nor a column
    reduction (the stitch flow reduces rows of a transposed view)."""
    axes = _const("axes", np.array([1], "int64"))
    nodes = [helper.make_node("ReduceSum", ["x", "axes"], ["s"], keepdims=0),
             helper.make_node("Exp", ["s"], ["out"])]
    model = _model(nodes, [_vi("x", (a, b, c))], [_vi("out", (a, c))], [axes])
    return model, {"x": _f32(a, b, c)}


def adam_update(n: int = 16, d: int = 64):
    """An Adam step: many element-wise inputs, three outputs (p, m, v)."""
    c = {k: _const(k, np.array(v, "float32")) for k, v in
         {"b1": 0.9, "nb1": 0.1, "b2": 0.999, "nb2": 0.001, "lr": 1e-3, "eps": 1e-8}.items()}
    nodes = [
        helper.make_node("Mul", ["m", "b1"], ["m1"]),
        helper.make_node("Mul", ["g", "nb1"], ["g1"]),
        helper.make_node("Add", ["m1", "g1"], ["m_new"]),
        helper.make_node("Mul", ["v", "b2"], ["v1"]),
        helper.make_node("Mul", ["g", "g"], ["gg"]),
        helper.make_node("Mul", ["gg", "nb2"], ["g2"]),
        helper.make_node("Add", ["v1", "g2"], ["v_new"]),
        helper.make_node("Sqrt", ["v_new"], ["vs"]),
        helper.make_node("Add", ["vs", "eps"], ["den"]),
        helper.make_node("Div", ["m_new", "den"], ["step"]),
        helper.make_node("Mul", ["step", "lr"], ["upd"]),
        helper.make_node("Sub", ["p", "upd"], ["p_new"]),
    ]
    names = ["p", "g", "m", "v"]
    model = _model(nodes, [_vi(k, (n, d)) for k in names],
                   [_vi(k, (n, d)) for k in ("p_new", "m_new", "v_new")], list(c.values()))
    inputs = {k: _f32(n, d) for k in names}
    inputs["v"] = np.abs(inputs["v"])
    return model, inputs


def _rotate_half(x: str, tag: str) -> list:
    """Nodes of x * cos + rotate_half(x) * sin over the last axis (rotary embedding) of
    ``x``, with the halves sliced at ``half`` (constants ``zero``, ``half``, ``end``, ``last``);
    the result is ``{tag}_rot``."""
    return [
        helper.make_node("Slice", [x, "zero", "half", "last"], [f"{tag}1"]),
        helper.make_node("Slice", [x, "half", "end", "last"], [f"{tag}2"]),
        helper.make_node("Neg", [f"{tag}2"], [f"{tag}n"]),
        helper.make_node("Concat", [f"{tag}n", f"{tag}1"], [f"{tag}h"], axis=-1),
        helper.make_node("Mul", [x, "cos"], [f"{tag}c"]),
        helper.make_node("Mul", [f"{tag}h", "sin"], [f"{tag}s"]),
        helper.make_node("Add", [f"{tag}c", f"{tag}s"], [f"{tag}_rot"]),
    ]


def rotary_grouped_heads(s: int = 16, hq: int = 4, hk: int = 2, d: int = 16):
    """Rotary embedding of queries (``hq`` heads) and keys (``hk`` heads, repeated to ``hq``
    as in grouped-query attention), each head-major after a transpose: element-wise and
    injective only, one kernel once every part has found the ops that read what it passes on."""
    angles = np.outer(np.arange(s), 1.0 / 10000 ** (np.arange(d // 2) / (d // 2)))
    angles = np.concatenate([angles, angles], axis=-1)
    cos = _const("cos", np.cos(angles).astype("float32"))
    sin = _const("sin", np.sin(angles).astype("float32"))
    shape = _const("shape", np.array([hk, hq // hk, s, d], "int64"))
    heads = _const("heads", np.array([hq, s, d], "int64"))
    axes = _const("axes", np.array([1], "int64"))
    slices = [_const(k, np.array([v], "int64"))
              for k, v in {"zero": 0, "half": d // 2, "end": d, "last": -1}.items()]
    nodes = [
        helper.make_node("Transpose", ["q"], ["qt"], perm=[1, 0, 2]),
        helper.make_node("Transpose", ["k"], ["kt"], perm=[1, 0, 2]),
        *_rotate_half("qt", "q"),
        *_rotate_half("kt", "k"),
        helper.make_node("Unsqueeze", ["k_rot", "axes"], ["ku"]),
        helper.make_node("Expand", ["ku", "shape"], ["ke"]),
        helper.make_node("Reshape", ["ke", "heads"], ["k_out"]),
    ]
    model = _model(nodes, [_vi("q", (s, hq, d)), _vi("k", (s, hk, d))],
                   [_vi("q_rot", (hq, s, d)), _vi("k_out", (hq, s, d))],
                   [cos, sin, shape, heads, axes, *slices])
    return model, {"q": _f32(s, hq, d), "k": _f32(s, hk, d)}


def qkv_split(s: int = 16, h: int = 2, d: int = 16):
    """A fused QKV projection's result split into queries, keys and values (GPT-2), each made
    head-major: a split whose parts are read by transposes."""
    heads = _const("heads", np.array([s, h, d], "int64"))
    nodes = [
        helper.make_node("Split", ["qkv"], ["q", "k", "v"], axis=-1, num_outputs=3),
        *(node for x in "qkv" for node in (
            helper.make_node("Reshape", [x, "heads"], [f"{x}h"]),
            helper.make_node("Transpose", [f"{x}h"], [f"{x}t"], perm=[1, 0, 2]))),
    ]
    model = _model(nodes, [_vi("qkv", (s, 3 * h * d))],
                   [_vi(f"{x}t", (h, s, d)) for x in "qkv"], [heads])
    return model, {"qkv": _f32(s, 3 * h * d)}


def packed_short_rows(n: int = 512, d: int = 32):
    """Many short rows: warp-per-row with several rows packed per block."""
    return ln_softmax_add(n, d)


PATTERNS = {
    "softmax": softmax,
    "layer_norm": layer_norm,
    "add_layer_norm": add_layer_norm,
    "rms_norm": rms_norm,
    "bias_gelu": bias_gelu,
    "scale_mask_softmax": scale_mask_softmax,
    "log_softmax_nll": log_softmax_nll,
    "ln_softmax_add": ln_softmax_add,
    "matmul_between_layer_norms": matmul_between_layer_norms,
    "residual_cycle": residual_cycle,
    "two_layer_norms": two_layer_norms,
    "sibling_reads": sibling_reads,
    "layer_norm_beside_gather": layer_norm_beside_gather,
    "gathered_mask": gathered_mask,
    "column_mean_center": column_mean_center,
    "softmax_of_transposed_log_softmax": softmax_of_transposed_log_softmax,
    "row_min_read_by_columns": row_min_read_by_columns,
    "middle_axis_sum": middle_axis_sum,
    "adam_update": adam_update,
    "rotary_grouped_heads": rotary_grouped_heads,
    "qkv_split": qkv_split,
}


def broadcast_mul_sum(b: int = 2, h: int = 2, s: int = 8, d: int = 16):
    """Attention scores spelled as a broadcast multiply and a sum over the last axis (TVM's
    default GPU pipeline can crash on this in dlight's GEMV rule)."""
    axes = _const("axes", np.array([-1], "int64"))
    nodes = [helper.make_node("Mul", ["q", "k"], ["prod"]),
             helper.make_node("ReduceSum", ["prod", "axes"], ["out"], keepdims=0)]
    model = _model(nodes, [_vi("q", (b, h, s, 1, d)), _vi("k", (b, h, 1, s, d))],
                   [_vi("out", (b, h, s, s))], [axes])
    return model, {"q": _f32(b, h, s, 1, d), "k": _f32(b, h, 1, s, d)}


PATTERNS["broadcast_mul_sum"] = broadcast_mul_sum
