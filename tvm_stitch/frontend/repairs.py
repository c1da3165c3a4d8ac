"""ONNX nodes TVM 0.27 gets wrong for some of their inputs or attributes, each rewritten into
ops it gets right, or refused with the node named.

``KNOWN_IMPORT_BUGS`` lists every such case we know: what meets it, what TVM does (wrong
numbers or a crash while importing or compiling) and what we do. ``tests/frontend/
test_import_bugs.py`` shows, for each entry, that TVM alone still gets its ONNX node tests
wrong (so the list cannot go stale: a bug TVM fixes fails that test) and that our import
gets them right or refuses them. The node-test runner (``testing.node``) excuses no wrong
number: a case TVM imports wrongly is repaired here or refused.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper


class Repair(Enum):
    """What the front end does with a node that meets a known TVM bug."""

    REWRITTEN = "rewritten into ops TVM gets right"
    REFUSED = "refused with a ModelError naming the node"


@dataclass(frozen=True)
class ImportBug:
    """A known wrong import or crash of TVM 0.27, and the ONNX node tests that meet it."""

    ops: tuple[str, ...]
    when: str  # the inputs or attributes that meet the bug
    tvm_does: str  # what TVM's importer and pipeline do with such a node
    repair: Repair
    node_cases: tuple[str, ...]


_FLOAT = (TensorProto.FLOAT, TensorProto.DOUBLE, TensorProto.FLOAT16)
_INTEGER = (TensorProto.INT8, TensorProto.INT16, TensorProto.INT32, TensorProto.INT64,
            TensorProto.UINT8, TensorProto.UINT16, TensorProto.UINT32, TensorProto.UINT64)

KNOWN_IMPORT_BUGS: dict[str, ImportBug] = {
    "float_mod": ImportBug(
        ("Mod",), "fmod=0 on floating-point inputs",
        "computes x - floor(x / y) * y: NaN where y is infinite (ONNX: x, or y's infinity)",
        Repair.REWRITTEN, tuple(f"test_mod_float_edge_cases_fmod_0_{t}"
                                for t in ("float16", "float32", "float64"))),
    "bool_max_min": ImportBug(
        ("ReduceMax", "ReduceMin"), "a bool input",
        "crashes while compiling (InternalError: Cannot decide min_value for bool)",
        Repair.REWRITTEN, ("test_reduce_max_bool_inputs", "test_reduce_max_empty_set_bool",
                           "test_reduce_min_bool_inputs")),
    "empty_max_min": ImportBug(
        ("ReduceMax", "ReduceMin"), "a floating-point input with no elements (an empty set)",
        "gives the largest finite value of the type instead of -inf (max) or inf (min)",
        Repair.REWRITTEN, ("test_reduce_max_empty_set", "test_reduce_min_empty_set")),
    "integer_pow": ImportBug(
        ("Pow",), "an integer base and an integer exponent",
        "crashes while compiling (InternalError: power only applies to float)",
        Repair.REWRITTEN, ("test_pow_types_int32_int32", "test_pow_types_int64_int64")),
    "rms_norm_all_axes": ImportBug(
        ("RMSNormalization",), "an axis that normalises over every dimension (axis 0)",
        "crashes while compiling (InternalError: Tensor dimension mismatch in read)",
        Repair.REWRITTEN, tuple(f"test_rms_normalization_{c}" for c in (
            "2d_axis0", "2d_axis_negative_2", "3d_axis0_epsilon",
            "3d_axis_negative_3_epsilon", "4d_axis0", "4d_axis_negative_4"))),
    "empty_split": ImportBug(
        ("Split",), "a part of size 0",
        "crashes while importing (InternalError: split_indices must be sorted)",
        Repair.REFUSED, ("test_split_zero_size_splits_opset13",
                         "test_split_zero_size_splits_opset18")),
}


class RepairError(ValueError):
    """A node meets a known TVM bug that is refused; the message names the node."""


@dataclass
class _Model:
    """Types, shapes and constants of a model's values, and the initializers a repair adds."""

    types: dict[str, int]
    shapes: dict[str, tuple[int, ...]]  # static shapes only
    constants: dict[str, np.ndarray]
    opset: int
    added: list[onnx.TensorProto]

    @classmethod
    def of(cls, model: onnx.ModelProto) -> _Model:
        inferred = onnx.shape_inference.infer_shapes(model)
        types, shapes = {}, {}
        graph = inferred.graph
        for value in [*graph.input, *graph.value_info, *graph.output]:
            tensor = value.type.tensor_type
            types[value.name] = tensor.elem_type
            dims = tensor.shape.dim if tensor.HasField("shape") else None
            if dims is not None and all(d.HasField("dim_value") for d in dims):
                shapes[value.name] = tuple(d.dim_value for d in dims)
        constants = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
        for t in model.graph.initializer:
            types[t.name], shapes[t.name] = t.data_type, tuple(t.dims)
        opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 0)
        return cls(types, shapes, constants, opset, [])

    def constant(self, name: str, value: np.ndarray) -> str:
        """Add an initializer ``name`` holding ``value``; returns its name."""
        self.added.append(numpy_helper.from_array(value, name))
        return name


# A repair: None when the node does not meet its bug, else the nodes replacing it.
_Rewrite = Callable[[onnx.NodeProto, str, _Model], list[onnx.NodeProto] | None]


def _names(node: onnx.NodeProto, what: str):
    stem = f"{node.name or node.output[0]}__{what}"
    return iter(f"{stem}_{k}" for k in range(100))


def _float_mod(node: onnx.NodeProto, label: str, m: _Model) -> list[onnx.NodeProto] | None:
    """Python's modulo as C's fmod plus y where the remainder's sign differs from y's."""
    attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    x, y = node.input
    if attrs.get("fmod", 0) != 0 or m.types.get(x) not in _FLOAT:
        return None
    name = _names(node, "mod")
    rem, rem_neg, y_neg, differ, zero_rem, nonzero, fix, shifted = (next(name) for _ in range(8))
    zero = m.constant(next(name), np.zeros((), helper.tensor_dtype_to_np_dtype(m.types[x])))
    return [
        helper.make_node("Mod", [x, y], [rem], fmod=1),
        helper.make_node("Less", [rem, zero], [rem_neg]),
        helper.make_node("Less", [y, zero], [y_neg]),
        helper.make_node("Xor", [rem_neg, y_neg], [differ]),
        helper.make_node("Equal", [rem, zero], [zero_rem]),
        helper.make_node("Not", [zero_rem], [nonzero]),
        helper.make_node("And", [differ, nonzero], [fix]),
        helper.make_node("Add", [rem, y], [shifted]),
        helper.make_node("Where", [fix, shifted, rem], [node.output[0]]),
    ]


def _empty_max_min(node: onnx.NodeProto, label: str, m: _Model
                   ) -> list[onnx.NodeProto] | None:
    """A max or min over an empty set is the infinity of its sign, in every output element."""
    data, out = node.input[0], node.output[0]
    shape, out_shape = m.shapes.get(data), m.shapes.get(out)
    if (m.types.get(data) not in _FLOAT or shape is None or out_shape is None
            or math.prod(shape) != 0 or math.prod(out_shape) == 0):
        return None
    name = _names(node, "empty")
    dtype = helper.tensor_dtype_to_np_dtype(m.types[data])
    value = m.constant(next(name), np.asarray(-np.inf if node.op_type == "ReduceMax" else np.inf,
                                              dtype))
    dims = m.constant(next(name), np.asarray(out_shape, np.int64))
    return [helper.make_node("Expand", [value, dims], [out])]


def _bool_max_min(node: onnx.NodeProto, label: str, m: _Model) -> list[onnx.NodeProto] | None:
    """The reduction on uint8 (false < true, and 0 and 255 for an empty set), cast back."""
    data = node.input[0]
    if m.types.get(data) != TensorProto.BOOL:
        return None
    name = _names(node, "bool")
    wide, reduced = next(name), next(name)
    reduce = helper.make_node(node.op_type, [wide, *node.input[1:]], [reduced], node.name)
    reduce.attribute.extend(node.attribute)
    return [helper.make_node("Cast", [data], [wide], to=TensorProto.UINT8), reduce,
            helper.make_node("Cast", [reduced], [node.output[0]], to=TensorProto.BOOL)]


def _integer_pow(node: onnx.NodeProto, label: str, m: _Model) -> list[onnx.NodeProto] | None:
    """The power in float64 (exact for integer results below 2^53), cast back."""
    x, y = node.input
    if m.types.get(x) not in _INTEGER or m.types.get(y) not in _INTEGER:
        return None
    name = _names(node, "pow")
    xd, yd, power = next(name), next(name), next(name)
    return [helper.make_node("Cast", [x], [xd], to=TensorProto.DOUBLE),
            helper.make_node("Cast", [y], [yd], to=TensorProto.DOUBLE),
            helper.make_node("Pow", [xd, yd], [power]),
            helper.make_node("Cast", [power], [node.output[0]], to=m.types[x])]


def _rms_norm_all_axes(node: onnx.NodeProto, label: str, m: _Model
                       ) -> list[onnx.NodeProto] | None:
    """ONNX's formula for a normalisation over every dimension: X / sqrt(mean(X^2) + eps) in
    the stash type, cast to X's type, times scale."""
    attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    x, scale = node.input[:2]
    shape = m.shapes.get(x)
    if shape is None or attrs.get("axis", -1) % len(shape) != 0:
        return None
    stash = attrs.get("stash_type", TensorProto.FLOAT)
    name = _names(node, "rms")
    xs, square, mean, shifted, root, normal, cast = (next(name) for _ in range(7))
    eps = m.constant(next(name), np.asarray(attrs.get("epsilon", 1e-5),
                                            helper.tensor_dtype_to_np_dtype(stash)))
    axes = m.constant(next(name), np.arange(len(shape), dtype=np.int64))
    return [
        helper.make_node("Cast", [x], [xs], to=stash),
        helper.make_node("Mul", [xs, xs], [square]),
        helper.make_node("ReduceMean", [square, axes], [mean], keepdims=1),
        helper.make_node("Add", [mean, eps], [shifted]),
        helper.make_node("Sqrt", [shifted], [root]),
        helper.make_node("Div", [xs, root], [normal]),
        helper.make_node("Cast", [normal], [cast], to=m.types[x]),
        helper.make_node("Mul", [cast, scale], [node.output[0]]),
    ]


def _empty_split(node: onnx.NodeProto, label: str, m: _Model) -> list[onnx.NodeProto] | None:
    attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    sizes = attrs.get("split")
    if sizes is None and len(node.input) > 1 and node.input[1] in m.constants:
        sizes = m.constants[node.input[1]].tolist()
    if sizes is None or 0 not in sizes:
        return None
    bug = KNOWN_IMPORT_BUGS["empty_split"]
    raise RepairError(f"{label}: a Split into {bug.when} is not supported (TVM {bug.tvm_does})")


_REWRITES: dict[str, _Rewrite] = {
    "float_mod": _float_mod,
    "bool_max_min": _bool_max_min,
    "empty_max_min": _empty_max_min,
    "integer_pow": _integer_pow,
    "rms_norm_all_axes": _rms_norm_all_axes,
    "empty_split": _empty_split,
}
"""The repair of each of ``KNOWN_IMPORT_BUGS``, tried in the table's order (ReduceMax and
ReduceMin meet two bugs: a bool input is repaired first, its empty set is then right too)."""


def repair(model: onnx.ModelProto) -> onnx.ModelProto:
    """``model`` with every node that meets a known TVM bug rewritten (a copy; ``model``
    itself when no node does). Raises RepairError for a node whose bug is refused."""
    ops = {op for bug in KNOWN_IMPORT_BUGS.values() for op in bug.ops}
    if not any(n.op_type in ops for n in model.graph.node):
        return model
    m = _Model.of(model)
    nodes: list[onnx.NodeProto] = []
    changed = False
    for i, node in enumerate(model.graph.node):
        label = f"node {node.name or '#' + str(i)} ({node.op_type})"
        bugs = [key for key, bug in KNOWN_IMPORT_BUGS.items() if node.op_type in bug.ops]
        for key in bugs:
            replaced = _REWRITES[key](node, label, m)
            if replaced is not None:
                nodes.extend(replaced)
                changed = True
                break
        else:
            nodes.append(node)
    if not changed:
        return model
    out = onnx.ModelProto()
    out.CopyFrom(model)
    del out.graph.node[:]
    out.graph.node.extend(nodes)
    out.graph.initializer.extend(m.added)
    return out
