"""Shapes TVM's converters lose: a node whose outputs ONNX's shape inference knows, in static
sizes and the model's input dimensions, but whose converted value has no shape in Relax.

TVM 0.27's shape inference gives up where a symbolic dimension meets a static one that the op
needs equal (a LayerNormalization of ``x (8, d)`` with a ``(64,)`` scale): the value keeps
its rank and loses its shape, nothing is legalized for it, and the compile crashes far from
the node ("CodeGenVM cannot emit this Relax operator"). ONNX itself infers ``(8, d)``.
"""

from __future__ import annotations

import onnx
from tvm import relax


class ShapeCheck:
    """Checks each converted node of ``model`` against ONNX's shape inference, which runs
    once, the first time a converted value has no shape."""

    def __init__(self, model: onnx.ModelProto, symbols: list[str]) -> None:
        self._model = model
        self._symbols = set(symbols)
        self._inferred: dict[str, tuple[int | str, ...] | None] | None = None

    def lost(self, node_name: str, op_type: str, result: object) -> str | None:
        """Why the node called ``node_name`` is refused, naming it, if an output of
        ``result`` (the converter's value for it) has no shape where ONNX infers one of
        static sizes and input dimensions; else None. Nodes whose name does not identify
        one node are not checked."""
        lost = [i for i, ty in enumerate(_output_types(result))
                if isinstance(ty, relax.TensorType) and ty.shape is None]
        node = self._node(node_name, op_type) if lost else None
        if node is None:
            return None
        inferred = self._shapes()
        for i in lost:
            if i >= len(node.output) or not node.output[i]:
                continue
            shape = inferred.get(node.output[i])
            if shape is None:
                continue
            inputs = ", ".join(f"{name} {_text(inferred.get(name))}" for name in node.input
                               if name)
            return (
                f"node {node_name} ({op_type}): TVM's importer loses the shape of output "
                f"{node.output[i]!r}, which ONNX infers as {_text(shape)}, from inputs "
                f"{inputs}: a symbolic dimension meets a static one that TVM cannot prove "
                "equal to it, and the compile would crash; give that input dimension its "
                "static size")
        return None

    def _node(self, name: str, op_type: str) -> onnx.NodeProto | None:
        found = [n for n in self._model.graph.node if n.name == name and n.op_type == op_type]
        return found[0] if name and len(found) == 1 else None

    def _shapes(self) -> dict[str, tuple[int | str, ...] | None]:
        """Every value's shape as ONNX infers it: a tuple of sizes and input dimension
        names, or None where a dimension is unknown or a symbol of ONNX's own."""
        if self._inferred is None:
            try:
                graph = onnx.shape_inference.infer_shapes(self._model).graph
            except Exception:  # noqa: BLE001 - no inference, nothing to hold TVM to
                graph = onnx.GraphProto()
            values = [*graph.input, *graph.value_info, *graph.output]
            self._inferred = {v.name: self._shape(v) for v in values}
            for t in graph.initializer:
                self._inferred[t.name] = tuple(t.dims)
        return self._inferred

    def _shape(self, value: onnx.ValueInfoProto) -> tuple[int | str, ...] | None:
        tensor = value.type.tensor_type
        if not tensor.HasField("shape"):
            return None
        dims: list[int | str] = []
        for d in tensor.shape.dim:
            if d.HasField("dim_value"):
                dims.append(d.dim_value)
            elif d.HasField("dim_param") and d.dim_param in self._symbols:
                dims.append(d.dim_param)
            else:
                return None
        return tuple(dims)


def _output_types(result: object) -> list[object]:
    if isinstance(result, relax.Tuple):
        return [field.ty for field in result.fields]
    ty = getattr(result, "ty", None)
    if isinstance(ty, relax.TupleType):
        return list(ty.fields)
    return [ty]


def _text(shape: tuple[int | str, ...] | None) -> str:
    if shape is None:
        return "(unknown)"
    return "(" + ", ".join(map(str, shape)) + ("," if len(shape) == 1 else "") + ")"
