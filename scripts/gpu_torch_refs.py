"""PyTorch reference programs for micro workloads, generated from their ONNX graphs.

The GPU machine has PyTorch but neither ``onnx`` nor our package, so ``gpu_pack.py`` turns each
micro workload's ONNX graph into straight-line PyTorch source here (``generate_program``), one
call per ONNX node, and ships the source with the node constants. ``gpu_check.py`` loads the
source (``load_programs``) and runs it eagerly and under ``torch.compile``. Each generated
function has its own code object, so ``torch.compile`` traces every workload separately.

Only the node types in ``OPS`` are covered, with shape-like inputs (reshape targets, reduction
axes, slice bounds) required to be constants; anything else raises ``Unsupported`` and the pack
marks PyTorch timing for that workload as not available, with the reason. Importing this module
needs neither torch nor onnx; running a program needs torch, generating one needs onnx.
"""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

try:
    import torch
    import torch.nn.functional as F
except ImportError:  # generating programs needs no torch
    torch = None  # type: ignore[assignment]
    F = None  # type: ignore[assignment]


class Unsupported(Exception):
    """An ONNX graph that this generator cannot express as a PyTorch program."""


# ---------------------------------------------------------------------------------------------
# Node implementations. Each takes the node's inputs in ONNX order (None for an omitted optional
# input; a tuple of ints for a shape-like input listed in STATIC_INPUTS) and its attributes as
# keyword arguments with ONNX's defaults.

OPS: dict[str, Callable[..., Any]] = {}
STATIC_INPUTS: dict[str, tuple[int, ...]] = {}
MIN_OPSET: dict[str, int] = {}


def _op(*names: str, static: tuple[int, ...] = (), min_opset: int = 1) -> Callable:
    def register(fn: Callable[..., Any]) -> Callable[..., Any]:
        for name in names:
            OPS[name] = fn
            STATIC_INPUTS[name] = static
            MIN_OPSET[name] = min_opset
        return fn

    return register


for _name, _fn in {
    "Add": lambda a, b: a + b,
    "Sub": lambda a, b: a - b,
    "Mul": lambda a, b: a * b,
    "Pow": lambda a, b: torch.pow(a, b),
    "Equal": lambda a, b: torch.eq(a, b),
    "Less": lambda a, b: torch.lt(a, b),
    "LessOrEqual": lambda a, b: torch.le(a, b),
    "Greater": lambda a, b: torch.gt(a, b),
    "GreaterOrEqual": lambda a, b: torch.ge(a, b),
    "And": lambda a, b: torch.logical_and(a, b),
    "Or": lambda a, b: torch.logical_or(a, b),
    "Xor": lambda a, b: torch.logical_xor(a, b),
    "MatMul": lambda a, b: torch.matmul(a, b),
}.items():
    _op(_name)(_fn)

for _name, _fn in {
    "Identity": lambda x: x,
    "Neg": lambda x: torch.neg(x),
    "Abs": lambda x: torch.abs(x),
    "Exp": lambda x: torch.exp(x),
    "Log": lambda x: torch.log(x),
    "Sqrt": lambda x: torch.sqrt(x),
    "Reciprocal": lambda x: torch.reciprocal(x),
    "Tanh": lambda x: torch.tanh(x),
    "Erf": lambda x: torch.erf(x),
    "Sigmoid": lambda x: torch.sigmoid(x),
    "Relu": lambda x: torch.relu(x),
    "Not": lambda x: torch.logical_not(x),
    "Floor": lambda x: torch.floor(x),
    "Ceil": lambda x: torch.ceil(x),
    "Sin": lambda x: torch.sin(x),
    "Cos": lambda x: torch.cos(x),
    "Softplus": lambda x: F.softplus(x),
}.items():
    _op(_name)(_fn)


@_op("Div")
def _div(a: Any, b: Any) -> Any:
    if a.is_floating_point():
        return a / b
    return torch.div(a, b, rounding_mode="trunc")  # ONNX integer division truncates


@_op("Max", "Min", "Sum")
def _variadic(*xs: Any, _op_type: str) -> Any:
    fn = {"Max": torch.maximum, "Min": torch.minimum, "Sum": torch.add}[_op_type]
    out = xs[0]
    for x in xs[1:]:
        out = fn(out, x)
    return out


@_op("Where")
def _where(cond: Any, a: Any, b: Any) -> Any:
    return torch.where(cond, a, b)


@_op("LeakyRelu")
def _leaky_relu(x: Any, alpha: float = 0.01) -> Any:
    return F.leaky_relu(x, alpha)


@_op("Gelu", min_opset=20)
def _gelu(x: Any, approximate: str = "none") -> Any:
    return F.gelu(x, approximate=approximate)


@_op("Clip", min_opset=11)
def _clip(x: Any, lo: Any = None, hi: Any = None) -> Any:
    return torch.clamp(x, lo, hi)


_DTYPES = {
    1: "float32",
    2: "uint8",
    3: "int8",
    5: "int16",
    6: "int32",
    7: "int64",
    9: "bool",
    10: "float16",
    11: "float64",
    16: "bfloat16",
}


@_op("Cast")
def _cast(x: Any, to: int, saturate: int = 1) -> Any:
    if to not in _DTYPES:
        raise Unsupported(f"Cast to ONNX type {to}")
    return x.to(getattr(torch, _DTYPES[to]))


@_op("Softmax", "LogSoftmax", min_opset=13)
def _softmax(x: Any, axis: int = -1, _op_type: str = "Softmax") -> Any:
    fn = torch.softmax if _op_type == "Softmax" else torch.log_softmax
    return fn(x, dim=axis)


@_op("LayerNormalization", min_opset=17)
def _layer_norm(
    x: Any, scale: Any, bias: Any = None, axis: int = -1, epsilon: float = 1e-5, stash_type: int = 1
) -> Any:
    shape = tuple(x.shape[axis % x.dim() :])
    if tuple(scale.shape) == shape and (bias is None or tuple(bias.shape) == shape):
        return F.layer_norm(x, shape, scale, bias, epsilon)
    y = F.layer_norm(x, shape, None, None, epsilon) * scale
    return y if bias is None else y + bias


@_op("BatchNormalization", min_opset=15)
def _batch_norm(
    x: Any,
    scale: Any,
    bias: Any,
    mean: Any,
    var: Any,
    epsilon: float = 1e-5,
    momentum: float = 0.9,
    training_mode: int = 0,
) -> Any:
    if training_mode:
        raise Unsupported("BatchNormalization with training_mode=1")
    return F.batch_norm(x, mean, var, scale, bias, False, 0.0, epsilon)


def _axes(axes: Sequence[int] | None, rank: int) -> list[int]:
    return sorted(a % rank for a in axes) if axes else []


@_op(
    "ReduceSum",
    "ReduceMean",
    "ReduceMax",
    "ReduceMin",
    "ReduceProd",
    "ReduceSumSquare",
    "ReduceL2",
    "ReduceLogSumExp",
    static=(1,),
)
def _reduce(
    x: Any,
    axes: Sequence[int] | None = None,
    keepdims: int = 1,
    noop_with_empty_axes: int = 0,
    _op_type: str = "ReduceSum",
) -> Any:
    dims = _axes(axes, x.dim())
    if not dims:
        if noop_with_empty_axes:
            return x
        dims = list(range(x.dim()))
    keep = bool(keepdims)
    if _op_type == "ReduceSum":
        return torch.sum(x, dim=dims, keepdim=keep)
    if _op_type == "ReduceMean":
        return torch.mean(x, dim=dims, keepdim=keep)
    if _op_type == "ReduceMax":
        return torch.amax(x, dim=dims, keepdim=keep)
    if _op_type == "ReduceMin":
        return torch.amin(x, dim=dims, keepdim=keep)
    if _op_type == "ReduceSumSquare":
        return torch.sum(x * x, dim=dims, keepdim=keep)
    if _op_type == "ReduceL2":
        return torch.sqrt(torch.sum(x * x, dim=dims, keepdim=keep))
    if _op_type == "ReduceLogSumExp":
        return torch.logsumexp(x, dim=dims, keepdim=keep)
    for dim in reversed(dims):  # ReduceProd
        x = torch.prod(x, dim=dim, keepdim=keep)
    return x


@_op("Reshape", static=(1,))
def _reshape(x: Any, shape: Sequence[int], allowzero: int = 0) -> Any:
    new = [x.shape[i] if (d == 0 and not allowzero) else d for i, d in enumerate(shape)]
    return x.reshape(new)


@_op("Flatten")
def _flatten(x: Any, axis: int = 1) -> Any:
    axis %= x.dim() + 1
    return x.reshape(int(np.prod(x.shape[:axis])), -1)


@_op("Transpose")
def _transpose(x: Any, perm: Sequence[int] | None = None) -> Any:
    return x.permute(*(perm if perm is not None else reversed(range(x.dim()))))


@_op("Unsqueeze", static=(1,))
def _unsqueeze(x: Any, axes: Sequence[int]) -> Any:
    for axis in _axes(axes, x.dim() + len(axes)):
        x = x.unsqueeze(axis)
    return x


@_op("Squeeze", static=(1,))
def _squeeze(x: Any, axes: Sequence[int] | None = None) -> Any:
    dims = _axes(axes, x.dim()) or [i for i, d in enumerate(x.shape) if d == 1]
    for axis in reversed(dims):
        x = x.squeeze(axis)
    return x


@_op("Expand", static=(1,))
def _expand(x: Any, shape: Sequence[int]) -> Any:
    return x.expand(torch.broadcast_shapes(tuple(x.shape), tuple(shape)))


@_op("Concat")
def _concat(*xs: Any, axis: int) -> Any:
    return torch.cat(xs, dim=axis)


# Gather and GatherElements take non-negative indices only (PyTorch rejects negative ones, so the
# pack-time check against onnxruntime catches them); wrapping them would add kernels to the timing.
@_op("Gather")
def _gather(x: Any, idx: Any, axis: int = 0) -> Any:
    axis %= x.dim()
    picked = torch.index_select(x, axis, idx.reshape(-1))
    return picked.reshape(tuple(x.shape[:axis]) + tuple(idx.shape) + tuple(x.shape[axis + 1 :]))


@_op("GatherElements")
def _gather_elements(x: Any, idx: Any, axis: int = 0) -> Any:
    return torch.gather(x, axis % x.dim(), idx)


@_op("Slice", static=(1, 2, 3, 4), min_opset=10)
def _slice(
    x: Any,
    starts: Sequence[int],
    ends: Sequence[int],
    axes: Sequence[int] | None = None,
    steps: Sequence[int] | None = None,
) -> Any:
    index = [slice(None)] * x.dim()
    for i, axis in enumerate(axes if axes is not None else range(len(starts))):
        step = steps[i] if steps is not None else 1
        if step <= 0:
            raise Unsupported("Slice with a non-positive step")
        index[axis % x.dim()] = slice(starts[i], ends[i], step)
    return x[tuple(index)]


@_op("Gemm")
def _gemm(
    a: Any,
    b: Any,
    c: Any = None,
    alpha: float = 1.0,
    beta: float = 1.0,
    transA: int = 0,  # noqa: N803 (ONNX attribute names)
    transB: int = 0,  # noqa: N803
) -> Any:
    out = torch.matmul(a.t() if transA else a, b.t() if transB else b)
    out = out if alpha == 1.0 else out * alpha
    return out if c is None else out + (c if beta == 1.0 else c * beta)


@_op("NegativeLogLikelihoodLoss", min_opset=12)
def _nll(
    x: Any,
    target: Any,
    weight: Any = None,
    ignore_index: int | None = None,
    reduction: str = "mean",
) -> Any:
    ignore = -100 if ignore_index is None else ignore_index
    return F.nll_loss(x, target, weight, ignore_index=ignore, reduction=reduction)


@_op("Dropout")
def _dropout(x: Any, ratio: Any = None, training_mode: Any = None, seed: int = 0) -> Any:
    return x  # inference: identity (a requested mask output is rejected at generation)


# ---------------------------------------------------------------------------------------------
# Generation (pack machine: needs onnx).


@dataclass
class Program:
    """One generated function: its Python source and the constants it indexes as ``c[i]``."""

    function: str
    source: str
    consts: list[np.ndarray] = field(default_factory=list)


def _attributes(node: Any) -> dict[str, Any]:
    from onnx import helper, numpy_helper

    out: dict[str, Any] = {}
    for attr in node.attribute:
        value = helper.get_attribute_value(attr)
        if isinstance(value, bytes):
            value = value.decode()
        elif isinstance(value, list) and value and isinstance(value[0], bytes):
            value = [v.decode() for v in value]
        elif hasattr(value, "dims"):  # TensorProto
            value = numpy_helper.to_array(value)
        elif not isinstance(value, int | float | str | list):
            raise Unsupported(f"{node.op_type} attribute {attr.name} of type {type(value)}")
        out[attr.name] = value
    return out


def _constant_value(node: Any) -> np.ndarray:
    attrs = _attributes(node)
    for key, dtype in (
        ("value", None),
        ("value_float", np.float32),
        ("value_floats", np.float32),
        ("value_int", np.int64),
        ("value_ints", np.int64),
    ):
        if key in attrs:
            return np.asarray(attrs[key], dtype=dtype)
    raise Unsupported(f"Constant with attributes {sorted(attrs)}")


def _opset(model: Any) -> int:
    return max((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), default=1)


class _Generator:
    """Emits one function for one ONNX graph; see ``generate_program``."""

    def __init__(self, model: Any, function: str) -> None:
        self.model = model
        self.graph = model.graph
        self.opset = _opset(model)
        self.function = function
        self.consts: list[np.ndarray] = []
        self.values: dict[str, np.ndarray] = {}  # constant values known while generating
        self.expr: dict[str, str] = {}  # ONNX value name -> Python expression
        self.lines: list[str] = []

    def const(self, name: str, value: np.ndarray) -> None:
        self.values[name] = value
        self.expr[name] = f"c[{len(self.consts)}]"
        self.consts.append(value)

    def values_of(self, node: Any, name: str) -> np.ndarray:
        if name not in self.values:
            raise Unsupported(f"{node.op_type} input {name!r} is computed at run time")
        return self.values[name]

    def static(self, node: Any, name: str) -> str:
        return repr(tuple(int(v) for v in np.asarray(self.values_of(node, name)).reshape(-1)))

    def emit_node(self, node: Any) -> None:
        op = node.op_type
        if node.domain not in ("", "ai.onnx"):
            raise Unsupported(f"node {op} of domain {node.domain!r}")
        if op == "Constant":
            self.const(node.output[0], _constant_value(node))
            return
        if op == "ConstantOfShape":
            value = _attributes(node).get("value", np.zeros(1, np.float32))
            shape = [int(d) for d in self.values_of(node, node.input[0])]
            self.const(node.output[0], np.full(shape, value.reshape(-1)[0], value.dtype))
            return
        if op not in OPS:
            raise Unsupported(f"ONNX operator {op}")
        if self.opset < MIN_OPSET[op]:
            raise Unsupported(f"{op} at opset {self.opset} (< {MIN_OPSET[op]})")
        outputs = [o for o in node.output if o]
        if len(outputs) != 1 or node.output[0] != outputs[0]:
            raise Unsupported(f"{op} with outputs {list(node.output)}")
        args = []
        for i, name in enumerate(node.input):
            if not name:
                args.append("None")
            elif i in STATIC_INPUTS[op]:
                args.append(self.static(node, name))
            else:
                args.append(self.expr[name])
        while args and args[-1] == "None":
            args.pop()
        attrs = _attributes(node)
        if any(isinstance(v, np.ndarray) for v in attrs.values()):
            raise Unsupported(f"{op} with a tensor attribute")
        if "_op_type" in OPS[op].__code__.co_varnames:
            attrs["_op_type"] = op
        call = ", ".join(args + [f"{k}={v!r}" for k, v in attrs.items()])
        var = f"v{len(self.lines)}"
        self.lines.append(f"    {var} = OPS[{op!r}]({call})")
        self.expr[outputs[0]] = var

    def generate(self) -> Program:
        from onnx import numpy_helper

        for init in self.graph.initializer:
            self.const(init.name, numpy_helper.to_array(init))
        params = []
        for i, value in enumerate(self.graph.input):
            if value.name not in self.expr:
                params.append(f"a{i}")
                self.expr[value.name] = f"a{i}"
        for node in self.graph.node:
            self.emit_node(node)
        results = [self.expr[o.name] for o in self.graph.output]
        head = f"def {self.function}(c, {', '.join(params)}):"
        body = self.lines + [f"    return ({', '.join(results)},)"]
        return Program(self.function, "\n".join([head, *body]) + "\n", self.consts)


def generate_program(model: Any, function: str) -> Program:
    """PyTorch source for ONNX ``model`` as ``function(c, *inputs) -> tuple of outputs``.

    ``c`` holds the returned constants as tensors on the run device, inputs come in the graph's
    input order. Raises ``Unsupported`` naming the first node that cannot be expressed.
    """
    if not function.isidentifier():
        raise ValueError(f"not a Python identifier: {function!r}")
    return _Generator(model, function).generate()


def write_programs(path: Path, programs: Sequence[Program]) -> None:
    """Write ``programs`` into one module with ``PROGRAMS = {function: callable}``."""
    parts = [
        '"""Generated by scripts/gpu_pack.py: PyTorch programs of the micro workloads."""\n',
        "from gpu_torch_refs import OPS\n",
        *(p.source for p in programs),
        "PROGRAMS = {" + ", ".join(f"{p.function!r}: {p.function}" for p in programs) + "}\n",
    ]
    path.write_text("\n\n".join(parts))


# ---------------------------------------------------------------------------------------------
# Running (GPU machine: needs torch).


def load_programs(path: Path) -> dict[str, Callable[..., tuple[Any, ...]]]:
    """Import a module written by ``write_programs`` and return its ``PROGRAMS``."""
    here = str(Path(__file__).resolve().parent)
    if here not in sys.path:
        sys.path.insert(0, here)  # generated code imports this module by name
    spec = importlib.util.spec_from_file_location(f"torch_programs_{abs(hash(path))}", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return dict(module.PROGRAMS)


def to_device(arrays: Sequence[np.ndarray], device: str) -> list[Any]:
    """``arrays`` as torch tensors on ``device`` (constants and inputs, moved once)."""
    return [torch.from_numpy(np.array(a, copy=True)).to(device) for a in arrays]


def to_numpy(outputs: Any) -> list[np.ndarray]:
    """Outputs of a program (a tensor or a nested tuple of tensors) as numpy arrays."""
    if isinstance(outputs, list | tuple):
        return [a for o in outputs for a in to_numpy(o)]
    return [outputs.detach().cpu().numpy()]
