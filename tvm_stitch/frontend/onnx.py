"""ONNX import with errors that name the node, on top of TVM's Relax ONNX frontend."""

from __future__ import annotations

import os
from collections.abc import Mapping

import onnx
from onnx import numpy_helper
from tvm.ir import IRModule
from tvm.relax.frontend.onnx import from_onnx
from tvm.relax.frontend.onnx.onnx_frontend import ONNXGraphImporter, _get_convert_map

from ..symbolic import BOUNDS_ATTR
from .lost_shapes import ShapeCheck
from .names import identifier_inputs
from .outputs import OutputError, rewrite
from .precision import convert_gemm, convert_matmul
from .repairs import RepairError, repair
from .shapes import CONVERTERS as SHAPE_CONVERTERS

CONVERTERS = {**SHAPE_CONVERTERS, "MatMul": convert_matmul, "Gemm": convert_gemm}
"""Our converters by ONNX op type, tried before TVM's (which take over when ours return
None): shapes TVM loses (``frontend.shapes``), half-precision products (``precision``)."""

# Element types the stitch and baseline flows compile and the SIMT runner can execute.
SUPPORTED_ELEM_TYPES = {
    onnx.TensorProto.FLOAT: "float32",
    onnx.TensorProto.FLOAT16: "float16",
    onnx.TensorProto.DOUBLE: "float64",
    onnx.TensorProto.INT64: "int64",
    onnx.TensorProto.INT32: "int32",
    onnx.TensorProto.INT16: "int16",
    onnx.TensorProto.INT8: "int8",
    onnx.TensorProto.UINT64: "uint64",
    onnx.TensorProto.UINT32: "uint32",
    onnx.TensorProto.UINT16: "uint16",
    onnx.TensorProto.UINT8: "uint8",
    onnx.TensorProto.BOOL: "bool",
}


# Attributes TVM 0.27's importer reads but ignores: a node that sets one to anything but its
# default would compile to numbers that differ from what ONNX specifies, silently.
IGNORED_ATTRIBUTES = {
    ("IsInf", "detect_positive"): 1,
    ("IsInf", "detect_negative"): 1,
}

# Ops whose TVM 0.27 converter implements something else under the same name.
MISCONVERTED_OPS = {
    "Attention": "TVM's converter of this name implements com.microsoft's Attention, whose "
                 "inputs and attributes differ from ONNX's Attention",
}


class ModelError(ValueError):
    """A model that cannot be compiled; the message names the node or value at fault."""


def load(model: str | os.PathLike | onnx.ModelProto) -> onnx.ModelProto:
    """Load and check an ONNX model; malformed models raise ModelError naming the problem."""
    if not isinstance(model, onnx.ModelProto):
        try:
            model = onnx.load(os.fspath(model))
        except Exception as err:  # missing file, truncated or non-protobuf data
            raise ModelError(f"cannot read ONNX model {model}: {err}") from err
    try:
        onnx.checker.check_model(model)
    except onnx.checker.ValidationError as err:
        raise ModelError(f"malformed ONNX model: {err}") from err
    _check_supported(model)
    return model


def _check_supported(model: onnx.ModelProto) -> None:
    opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), None)
    converters = _get_convert_map()
    for i, node in enumerate(model.graph.node):
        label = f"node {node.name or '#' + str(i)} ({node.op_type})"
        if node.domain not in ("", "ai.onnx"):
            raise ModelError(f"{label}: custom domain {node.domain!r} is not supported")
        if node.op_type not in converters:
            raise ModelError(
                f"{label}: operator {node.op_type} has no TVM importer (opset {opset})"
            )
        if node.op_type in MISCONVERTED_OPS:
            raise ModelError(f"{label}: not supported: {MISCONVERTED_OPS[node.op_type]}")
        if node.op_type == "Dropout" and not _constant_false(model, node.input[2:3]):
            raise ModelError(f"{label}: a training_mode input that may be true is not "
                             "supported (TVM's importer ignores it; the mask is random)")
        for attr in node.attribute:
            default = IGNORED_ATTRIBUTES.get((node.op_type, attr.name))
            if default is not None and onnx.helper.get_attribute_value(attr) != default:
                raise ModelError(f"{label}: attribute {attr.name}="
                                 f"{onnx.helper.get_attribute_value(attr)} is not supported "
                                 "(TVM's importer would ignore it)")
    initializers = {t.name for t in model.graph.initializer}
    for value in list(model.graph.input) + list(model.graph.output):
        if value.name in initializers:
            continue
        elem = value.type.tensor_type.elem_type
        if elem not in SUPPORTED_ELEM_TYPES:
            name = onnx.TensorProto.DataType.Name(elem) if elem else "unknown"
            raise ModelError(f"value {value.name!r}: element type {name} is not supported")


def _constant_false(model: onnx.ModelProto, names: list[str]) -> bool:
    """Whether the optional input ``names`` (at most one) is absent or an initializer holding
    false."""
    name = names[0] if names else ""
    if not name:
        return True
    value = next((t for t in model.graph.initializer if t.name == name), None)
    return value is not None and not bool(numpy_helper.to_array(value))


DIM_MAX_KEY = "tvm_stitch.dim_max."
"""Prefix of the ONNX metadata keys that declare the upper bound of a symbolic dimension:
``tvm_stitch.dim_max.seq`` = ``"512"`` (what ``--dim-max seq=512`` means)."""


def declared_dim_max(model: onnx.ModelProto) -> dict[str, int]:
    """The upper bounds of symbolic dimensions that ``model``'s metadata declares
    (``DIM_MAX_KEY``); raises ModelError for a value that is no positive integer."""
    bounds = {}
    for prop in model.metadata_props:
        if not prop.key.startswith(DIM_MAX_KEY):
            continue
        if not prop.value.isdigit() or int(prop.value) < 1:
            raise ModelError(f"metadata {prop.key!r} = {prop.value!r}: an upper bound must be "
                             "a positive integer")
        bounds[prop.key[len(DIM_MAX_KEY):]] = int(prop.value)
    return bounds


def with_dim_max(model: onnx.ModelProto, bounds: Mapping[str, int]) -> onnx.ModelProto:
    """A copy of ``model`` whose metadata declares ``bounds`` for the symbolic dimensions of
    its inputs that ``bounds`` names (``declared_dim_max`` reads them back); the others are
    left out, so one set of bounds serves models with fewer dimensions."""
    out = onnx.ModelProto()
    out.CopyFrom(model)
    props = {p.key: p.value for p in out.metadata_props}
    props.update({DIM_MAX_KEY + name: str(bound) for name, bound in bounds.items()
                  if name in dim_params(model)})
    onnx.helper.set_model_props(out, props)
    return out


def import_model(model: str | os.PathLike | onnx.ModelProto,
                 shape_dict: dict[str, list[int]] | None = None,
                 dim_max: Mapping[str, int] | None = None) -> IRModule:
    """Check an ONNX model and import it into Relax (weights become constants of ``main``).

    Graph inputs whose names are no identifiers are renamed (``frontend.names``). Outputs
    of multi-output ops that TVM's importer would get wrong (``frontend.outputs``),
    and nodes that meet a known bug of TVM's (``frontend.repairs``), are rewritten into ops it
    gets right, or refused; shape computations whose symbolic shape TVM's converters lose
    are converted by ours (``frontend.shapes``). ``dim_max`` declares upper bounds of
    symbolic dimensions (over those of the model's metadata, ``declared_dim_max``): ``main``
    carries them (``symbolic.BOUNDS_ATTR``), and stitched kernels stage rows of those
    lengths on chip, checked at run time; naming a dimension no input has raises
    ModelError."""
    model = load(model)
    bounds = {**declared_dim_max(model), **(dim_max or {})}
    check_dims(model, bounds)
    mod = _imported(model, shape_dict)
    if bounds:
        mod["main"] = mod["main"].with_attr(BOUNDS_ATTR, bounds)
    return mod


def _imported(model: onnx.ModelProto, shape_dict: dict[str, list[int]] | None) -> IRModule:
    model, renames = identifier_inputs(model)
    if shape_dict:
        shape_dict = {renames.get(name, name): shape for name, shape in shape_dict.items()}
    try:
        model = repair(rewrite(model))
    except (OutputError, RepairError) as err:
        raise ModelError(str(err)) from err
    failed_ops: list[str] = []
    convert = ONNXGraphImporter._convert_operator
    shapes = ShapeCheck(model, dim_params(model))
    lost: list[str] = []  # refused after TVM's importer returns: it prints a converter's error

    def recording_convert(self: ONNXGraphImporter, op_name: str, inputs: list, attrs: dict,
                          opset: int) -> object:
        failed_ops.append(op_name)
        ours = CONVERTERS.get(op_name)
        result = None if ours is None else ours(self.bb, inputs, attrs,
                                                [self._nodes, self._params])
        if result is None:
            result = convert(self, op_name, inputs, attrs, opset)
        why = shapes.lost(attrs.get("tvm_custom", {}).get("name", ""), op_name, result)
        if why is not None:
            lost.append(why)
        failed_ops.pop()
        return result

    ONNXGraphImporter._convert_operator = recording_convert
    try:
        mod = from_onnx(model, shape_dict=shape_dict, keep_params_in_input=False)
    except Exception as err:  # TVM raises many types; keep its message, add the node
        if lost:
            raise ModelError(lost[0]) from err
        where = _nodes_of(model, failed_ops[-1]) if failed_ops else "the graph"
        raise ModelError(f"TVM's ONNX importer failed on {where}: {err}") from err
    finally:
        ONNXGraphImporter._convert_operator = convert
    if lost:
        raise ModelError(lost[0])
    return mod


def _nodes_of(model: onnx.ModelProto, op_type: str) -> str:
    """Name the nodes of ``op_type``: TVM's importer does not say which one it was converting."""
    names = [n.name or f"#{i}" for i, n in enumerate(model.graph.node) if n.op_type == op_type]
    which = "node" if len(names) == 1 else "one of nodes"
    return f"{which} {', '.join(names)} ({op_type})"


def graph_inputs(model: onnx.ModelProto) -> list[onnx.ValueInfoProto]:
    """The graph inputs that are fed at run time (initializers excluded), in order."""
    initializers = {t.name for t in model.graph.initializer}
    return [v for v in model.graph.input if v.name not in initializers]


def dim_params(model: onnx.ModelProto) -> list[str]:
    """Names of the symbolic dimensions (ONNX dim_params) of the run-time inputs, in order of
    first use."""
    names: dict[str, None] = {}
    for value in graph_inputs(model):
        for d in value.type.tensor_type.shape.dim:
            if d.dim_param:
                names.setdefault(d.dim_param)
    return list(names)


def check_dims(model: onnx.ModelProto, dims: Mapping[str, int], *, complete: bool = False
               ) -> None:
    """Raise ModelError if ``dims`` names a dimension that is no dim_param of the model's
    inputs, or, when ``complete``, if it leaves one unsized."""
    symbolic = dim_params(model)
    unknown = [name for name in dims if name not in symbolic]
    if unknown:
        have = ", ".join(symbolic) if symbolic else "none: every input shape is static"
        raise ModelError(f"no input has a symbolic dimension named "
                         f"{', '.join(map(repr, unknown))} (the model's: {have})")
    missing = [name for name in symbolic if name not in dims]
    if complete and missing:
        raise ModelError(f"symbolic dimension(s) {', '.join(missing)} need a size: give each "
                         "one (--dim NAME=SIZE)")
