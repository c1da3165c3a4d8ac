"""The outputs of multi-output ONNX ops: each one computed right, or refused.

TVM 0.27's ONNX importer returns some outputs as placeholders: LayerNormalization's Mean and
InvStdDev are the constant 0 (torch's exporter emits both in every autograd graph, so training
graphs got wrong gradients, silently), and a MaxPool's Indices or an inference Dropout's mask
are not what ONNX specifies. A BatchNormalization in training mode it imports as one in
inference mode: normalised with the running statistics given, which it returns unchanged.
``MULTI_OUTPUT_OPS`` says, for every ONNX op with more than one output that TVM's importer
converts, what becomes of each output after the first:

- ``IMPORTED``: TVM's importer computes it (checked against onnxruntime in the tests);
- ``REWRITTEN``: we rewrite the node before the importer sees it (``rewrite``), computing the
  output with ops the importer gets right;
- ``REFUSED``: a model that reads it fails with a ModelError naming the node and the output.

An output a model does not read (an empty name, or one no node or graph output uses) is
never a problem: TVM's placeholder is then dead code. (A BatchNormalization in training mode
is rewritten whatever the model reads of it: its Y would be wrong too.)
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from enum import Enum

import numpy as np
import onnx
from onnx import helper, numpy_helper


class OutputHandling(Enum):
    """What happens to an output after the first of a multi-output op."""

    IMPORTED = "computed by TVM's importer"
    REWRITTEN = "rewritten into ops TVM's importer computes right"
    REFUSED = "refused"


MULTI_OUTPUT_OPS: dict[str, tuple[OutputHandling, str]] = {
    "LayerNormalization": (OutputHandling.REWRITTEN,
                           "Mean and InvStdDev (TVM imports both as the constant 0)"),
    "Dropout": (OutputHandling.REWRITTEN, "the mask of an inference Dropout (all true)"),
    "Split": (OutputHandling.IMPORTED, "every part"),
    "TopK": (OutputHandling.IMPORTED, "Values and Indices"),
    "Unique": (OutputHandling.IMPORTED, "Y, indices, inverse_indices and counts"),
    "DynamicQuantizeLinear": (OutputHandling.IMPORTED, "y_scale and y_zero_point"),
    "BatchNormalization": (OutputHandling.REWRITTEN,
                           "running_mean and running_var, in training mode (opset 14 on), "
                           "where Y too is rewritten: TVM's importer ignores the mode"),
    "MaxPool": (OutputHandling.REFUSED, "Indices (TVM's importer does not compute them)"),
    "Attention": (OutputHandling.REFUSED,
                  "the op itself is refused: TVM's converter of this name is com.microsoft's "
                  "Attention, not ONNX's (frontend.onnx.MISCONVERTED_OPS)"),
}
"""Every ONNX op with several outputs that TVM's importer converts (the tests check the list
against ONNX's schemas and TVM's converters)."""


class OutputError(ValueError):
    """A model reads an output that would be imported wrong; the message names the node."""


@dataclass
class _Context:
    """What a rewrite may need of the model, and the initializers it adds."""

    ranks: dict[str, int]
    types: dict[str, int]
    opset: int
    added: list[onnx.TensorProto] = field(default_factory=list)

    def constant(self, name: str, value: np.ndarray) -> str:
        """Add an initializer ``name`` holding ``value``; returns its name."""
        self.added.append(numpy_helper.from_array(value, name))
        return name


def rewrite(model: onnx.ModelProto) -> onnx.ModelProto:
    """``model`` with the multi-output nodes that need it rewritten (a copy; ``model`` itself
    is unchanged when nothing needs rewriting). Raises OutputError for a read output that is
    refused, or a node whose rewrite needs facts the model does not give (an unknown rank)."""
    used = _used_names(model.graph)
    needs = [(i, n) for i, n in enumerate(model.graph.node)
             if any(o and o in used for o in n.output[1:]) or _training(n)]
    if not needs:
        return model
    out = onnx.ModelProto()
    out.CopyFrom(model)
    ctx = _Context(*_ranks_and_types(out),
                   next((o.version for o in out.opset_import if o.domain in ("", "ai.onnx")), 0))
    nodes: list[onnx.NodeProto] = []
    at = dict(needs)
    for i, node in enumerate(out.graph.node):
        if i not in at:
            nodes.append(node)
            continue
        label = f"node {node.name or '#' + str(i)} ({node.op_type})"
        read = [o for o in node.output[1:] if o and o in used]
        handling, what = MULTI_OUTPUT_OPS.get(node.op_type, (OutputHandling.REFUSED, ""))
        if handling is OutputHandling.IMPORTED:
            nodes.append(node)
            continue
        if handling is OutputHandling.REFUSED:
            raise OutputError(f"{label}: output {read[0]!r} is not supported ({what})")
        nodes.extend(_REWRITERS[node.op_type](node, label, ctx))
    del out.graph.node[:]
    out.graph.node.extend(nodes)
    out.graph.initializer.extend(ctx.added)
    return out


def _used_names(graph: onnx.GraphProto) -> set[str]:
    used = {name for node in graph.node for name in node.input}
    for node in graph.node:  # names read inside subgraphs (If, Loop) count too
        for attr in node.attribute:
            for sub in [attr.g, *attr.graphs] if attr.type in (
                    onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS) else []:
                used |= _used_names(sub)
    return used | {v.name for v in graph.output}


def _training(node: onnx.NodeProto) -> bool:
    """Whether ``node`` is a BatchNormalization in training mode."""
    return node.op_type == "BatchNormalization" and any(
        a.name == "training_mode" and helper.get_attribute_value(a) for a in node.attribute)


def _ranks_and_types(model: onnx.ModelProto) -> tuple[dict[str, int], dict[str, int]]:
    """The rank and the element type of each value of ``model`` whose shape inference
    knows them."""
    inferred = onnx.shape_inference.infer_shapes(model)
    ranks, types = {}, {}
    values = [*inferred.graph.input, *inferred.graph.value_info, *inferred.graph.output]
    for value in values:
        tensor = value.type.tensor_type
        types[value.name] = tensor.elem_type
        if tensor.HasField("shape"):
            ranks[value.name] = len(tensor.shape.dim)
    ranks.update({t.name: len(t.dims) for t in model.graph.initializer})
    types.update({t.name: t.data_type for t in model.graph.initializer})
    return ranks, types


def _layer_norm_statistics(node: onnx.NodeProto, label: str, ctx: _Context
                           ) -> list[onnx.NodeProto]:
    """The LayerNormalization for Y alone, and ONNX's formulas for Mean and InvStdDev: the
    mean and 1/sqrt(variance + epsilon) over axes ``axis``.. in the stash type, kept dims."""
    attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    x = node.input[0]
    if x not in ctx.ranks:
        raise OutputError(f"{label}: the rank of input {x!r} is unknown, needed for its "
                          "Mean and InvStdDev outputs")
    rank = ctx.ranks[x]
    axis = attrs.get("axis", -1)
    axis = axis + rank if axis < 0 else axis
    stash = attrs.get("stash_type", onnx.TensorProto.FLOAT)
    epsilon = attrs.get("epsilon", 1e-5)
    stem = f"{node.name or node.output[0]}__stats"
    name = iter(f"{stem}_{k}" for k in range(1000))
    layer_norm = helper.make_node("LayerNormalization", list(node.input), [node.output[0]],
                                  node.name, **attrs)
    mean_out = node.output[1] if len(node.output) > 1 and node.output[1] else next(name)
    inv_out = node.output[2] if len(node.output) > 2 and node.output[2] else next(name)
    xs, centred, square, var, shifted, std = (next(name) for _ in range(6))
    axes = list(range(axis, rank))
    eps = ctx.constant(next(name), np.asarray(epsilon, helper.tensor_dtype_to_np_dtype(stash)))

    def mean(src: str, dst: str) -> onnx.NodeProto:
        if ctx.opset >= 18:
            axes_name = ctx.constant(next(name), np.asarray(axes, np.int64))
            return helper.make_node("ReduceMean", [src, axes_name], [dst], keepdims=1)
        return helper.make_node("ReduceMean", [src], [dst], axes=axes, keepdims=1)

    return [
        layer_norm,
        helper.make_node("Cast", [x], [xs], to=stash),
        mean(xs, mean_out),
        helper.make_node("Sub", [xs, mean_out], [centred]),
        helper.make_node("Mul", [centred, centred], [square]),
        mean(square, var),
        helper.make_node("Add", [var, eps], [shifted]),
        helper.make_node("Sqrt", [shifted], [std]),
        helper.make_node("Reciprocal", [std], [inv_out]),
    ]


def _dropout_mask(node: onnx.NodeProto, label: str, ctx: _Context) -> list[onnx.NodeProto]:
    """An inference Dropout: Y is its input, the mask all true (a Dropout that may be in
    training mode is refused before, by ``frontend.onnx``)."""
    shape = f"{node.output[1]}__shape"
    return [
        helper.make_node("Identity", [node.input[0]], [node.output[0]], node.name),
        helper.make_node("Shape", [node.input[0]], [shape]),
        helper.make_node("ConstantOfShape", [shape], [node.output[1]],
                         value=numpy_helper.from_array(np.ones(1, bool))),
    ]


def _batch_norm_training(node: onnx.NodeProto, label: str, ctx: _Context
                         ) -> list[onnx.NodeProto]:
    """ONNX's formulas for a BatchNormalization in training mode: the mean and the
    (population) variance of X over every axis but the channels' (axis 1), Y normalised by
    them, times scale, plus B; running_mean and running_var the given ones times momentum
    plus the batch's times 1 - momentum. Float16 statistics are computed in float32."""
    attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    x = node.input[0]
    if not _training(node):
        raise OutputError(f"{label}: outputs {list(node.output[1:])} are not supported "
                          "without training_mode=1 (opset 14 on)")
    if x not in ctx.ranks or ctx.ranks[x] < 2:
        raise OutputError(f"{label}: the rank of input {x!r} is unknown or below 2, needed "
                          "for its statistics over every axis but the channels'")
    rank, dtype = ctx.ranks[x], ctx.types.get(x, onnx.TensorProto.FLOAT)
    work = onnx.TensorProto.FLOAT if dtype == onnx.TensorProto.FLOAT16 else dtype
    np_work = helper.tensor_dtype_to_np_dtype(work)
    momentum = attrs.get("momentum", 0.9)
    stem = f"{node.name or node.output[0]}__train"
    name = iter(f"{stem}_{k}" for k in range(1000))
    axes = [0, *range(2, rank)]
    nodes: list[onnx.NodeProto] = []

    def emit(op: str, inputs: list[str], output: str | None = None, **kw) -> str:
        output = output or next(name)
        nodes.append(helper.make_node(op, inputs, [output], **kw))
        return output

    def cast(value: str, of: int, to: int, output: str | None = None) -> str:
        return value if of == to and output is None else emit("Cast", [value], output, to=to)

    def mean(value: str) -> str:
        if ctx.opset >= 18:
            return emit("ReduceMean", [value, ctx.constant(next(name), np.asarray(
                axes, np.int64))], keepdims=1)
        return emit("ReduceMean", [value], axes=axes, keepdims=1)

    def per_channel(value: str) -> str:  # (C,) broadcast along X's other axes
        shape = ctx.constant(next(name), np.asarray([-1] + [1] * (rank - 2), np.int64))
        return emit("Reshape", [cast(value, ctx.types.get(value, work), work), shape])

    xs = cast(x, dtype, work)
    batch_mean = mean(xs)
    centred = emit("Sub", [xs, batch_mean])
    batch_var = mean(emit("Mul", [centred, centred]))
    eps = ctx.constant(next(name), np.asarray(attrs.get("epsilon", 1e-5), np_work))
    std = emit("Sqrt", [emit("Add", [batch_var, eps])])
    scaled = emit("Mul", [emit("Div", [centred, std]), per_channel(node.input[1])])
    if work == dtype:
        emit("Add", [scaled, per_channel(node.input[2])], node.output[0])
    else:
        cast(emit("Add", [scaled, per_channel(node.input[2])]), work, dtype, node.output[0])
    flat = ctx.constant(next(name), np.asarray([-1], np.int64))
    for given, batch, out in zip(node.input[3:5], (batch_mean, batch_var),
                                 node.output[1:3], strict=False):
        if not out:
            continue
        kind = ctx.types.get(given, work)
        np_kind = helper.tensor_dtype_to_np_dtype(kind)
        kept = emit("Mul", [given, ctx.constant(next(name), np.asarray(momentum, np_kind))])
        new = emit("Mul", [cast(emit("Reshape", [batch, flat]), work, kind),
                           ctx.constant(next(name), np.asarray(1 - momentum, np_kind))])
        emit("Add", [kept, new], out)
    return nodes


_REWRITERS: dict[str, Callable[[onnx.NodeProto, str, _Context], list[onnx.NodeProto]]] = {
    "LayerNormalization": _layer_norm_statistics,
    "BatchNormalization": _batch_norm_training,
    "Dropout": _dropout_mask,
}
