"""Random DAGs of memory-intensive ONNX ops, for differential testing of the compile flows.

:func:`random_graph` builds one ONNX model from a :class:`~tvm_stitch.testing.choices.Chooser`:
element-wise unary ops (light and expensive: exp, tanh, erf, pow, sqrt, log, ...), binary ops
with broadcasting, reductions over random axes with and without keepdims, softmax and
log-softmax over a random axis, layer norm, reshape, transpose, expand, comparisons feeding
``Where``, casts, and (optionally) matmuls between the memory-intensive parts, on float32 or
float16, with shapes that include 1s, primes, very long rows and many short rows.

Generated graphs are numerically well conditioned, so that two correct implementations agree
within the comparison's tolerance: each value carries an interval that bounds it (graph inputs
are standard normal, bounded by 6) and every op checks its operands' intervals; ops with a
restricted domain (log, sqrt, pow, division) get operands moved into it first; exp takes only
operands whose exponential stays small; comparisons, floor and sign take only *exact* values
(ones every correct implementation computes bit for bit), since a tie broken differently by one
rounding would flip the result. :func:`graphs` wraps the generator as a Hypothesis strategy.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field, replace

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from .choices import Chooser, HypothesisChooser, RandomChooser

OPSET = 18
IR_VERSION = 8
INPUT_BOUND = 6.0  # standard-normal inputs: |x| > 6 has probability 2e-9 per element

# Options are listed simplest first: shrinking moves towards the front of each list.
ROW_LENGTHS = (1, 8, 2, 3, 5, 7, 13, 16, 31, 32, 64, 100, 127, 128, 255, 256, 512, 768, 1000,
               1024, 2048, 4097, 30000)
ROW_COUNTS = (1, 4, 2, 3, 7, 8, 16, 31, 64, 128, 257, 1000, 2048)
# The large-shape mode: 10^5 to 10^7 elements in the shapes models have, simplest first:
# (B*S, hidden), (B, HW, C), (B, C, H, W), (B, heads, S, S), and few long / many short rows.
LARGE_SHAPES = ((4096, 768), (1000, 128), (2048, 4096), (2, 784, 384), (8, 196, 768),
                (2, 3136, 96), (2, 96, 56, 56), (4, 256, 14, 14), (8, 64, 56, 56),
                (2, 12, 128, 128), (8, 12, 64, 64), (1, 16, 512, 512), (64, 30000),
                (300000, 32))
EXPAND_SIZES = (2, 3, 4, 7, 16)
MATMUL_WIDTHS = (4, 1, 3, 16, 64, 100)
POW_EXPONENTS = (2.0, 0.5, 3.0, -1.0, 1.5)


@dataclass(frozen=True)
class GraphConfig:
    """Limits and mix of the generated graphs."""

    max_nodes: int = 8
    max_elements: int = 65536
    float16: float = 0.2  # probability that a graph computes in float16
    matmul: float = 1.0  # weight of MatMul among the op kinds (0 disables matmuls)
    extra_outputs: float = 0.15  # probability that an intermediate value is also an output
    large: float = 0.0  # probability that a graph starts from one of LARGE_SHAPES

    def bound(self, dtype: str) -> float:
        """Largest magnitude a value may have: keeps rounding errors within the tolerance
        (float16 values cross kernel boundaries rounded to 11 bits)."""
        return 8.0 if dtype == "float16" else 100.0


@dataclass
class Value:
    """A tensor of the graph under construction; ``lo``/``hi`` bound its elements."""

    name: str
    shape: tuple[int, ...]
    dtype: str  # "float32", "float16" or "bool"
    lo: float = -INPUT_BOUND
    hi: float = INPUT_BOUND
    exact: bool = True

    @property
    def size(self) -> int:
        """Number of elements."""
        return math.prod(self.shape)

    @property
    def magnitude(self) -> float:
        """Largest absolute value an element can have."""
        return max(abs(self.lo), abs(self.hi))


_ELEM_TYPES = {"float32": TensorProto.FLOAT, "float16": TensorProto.FLOAT16,
               "bool": TensorProto.BOOL}


@dataclass
class _Builder:
    """Accumulates nodes, inputs and initializers; ``values`` is the pool ops draw from."""

    chooser: Chooser
    config: GraphConfig
    dtype: str
    values: list[Value] = field(default_factory=list)
    nodes: list[onnx.NodeProto] = field(default_factory=list)
    inputs: list[Value] = field(default_factory=list)
    initializers: list[onnx.TensorProto] = field(default_factory=list)
    consumed: set[str] = field(default_factory=set)

    # Graph pieces -------------------------------------------------------------------------

    def new_input(self, shape: tuple[int, ...]) -> Value:
        """A fresh standard-normal graph input."""
        value = Value(f"in{len(self.inputs)}", shape, self.dtype)
        self.inputs.append(value)
        self.values.append(value)
        return value

    def constant(self, array: np.ndarray) -> str:
        """An initializer holding ``array``; its name."""
        name = f"c{len(self.initializers)}"
        self.initializers.append(numpy_helper.from_array(array, name))
        return name

    def float_constant(self, values: np.ndarray) -> Value:
        """A float initializer in the graph's dtype, as a value (exact, bounded by itself)."""
        array = np.asarray(values, dtype=self.dtype)
        name = self.constant(array)
        return Value(name, array.shape, self.dtype, float(array.min(initial=0.0)),
                     float(array.max(initial=0.0)))

    def add(self, op: str, operands: list[str], like: Value, **attrs: object) -> Value:
        """Append node ``op`` producing a value shaped and bounded like ``like``."""
        index = len(self.nodes)
        value = Value(f"v{index}", like.shape, like.dtype, like.lo, like.hi, like.exact)
        self.nodes.append(helper.make_node(op, operands, [value.name], name=f"n{index}_{op}",
                                           **attrs))
        self.consumed.update(operands)
        self.values.append(value)
        return value

    # Operand selection ------------------------------------------------------------------

    def pick(self, accept: Callable[[Value], bool]) -> Value | None:
        """A value of the pool that ``accept`` admits, or None."""
        candidates = [v for v in self.values if accept(v)]
        return self.chooser.choice(candidates) if candidates else None

    def floating(self, v: Value) -> bool:
        """True for values of the graph's float dtype within the magnitude bound."""
        return v.dtype == self.dtype and v.magnitude <= self.config.bound(self.dtype)

    def positive(self, v: Value, floor: float = 0.5) -> Value:
        """``v`` itself if it is at least ``floor``, else ``Abs(v) + floor``."""
        if v.lo >= floor:
            return v
        magnitude = self.add("Abs", [v.name], Value("", v.shape, v.dtype, 0.0, v.magnitude,
                                                     v.exact))
        shift = self.float_constant(np.array(floor))
        return self.add("Add", [magnitude.name, shift.name],
                        Value("", v.shape, v.dtype, floor, magnitude.hi + floor, False))

    def broadcast_partner(self, v: Value, also: tuple[int, ...] = ()) -> Value:
        """A second operand whose shape broadcasts with ``v``'s (and ``also``) to their common
        shape: a scalar or row constant, a new input, or a compatible value of the pool."""
        target = tuple(np.broadcast_shapes(v.shape, also))
        kind = self.chooser.integer(0, 3)
        if kind == 0:
            return self.float_constant(np.array(self.chooser.choice((1.5, -0.5, 2.0, 0.25))))
        if kind == 1 and v.shape:
            row = np.linspace(-1.0, 1.0, v.shape[-1]) if v.shape[-1] > 1 else np.ones(1)
            return self.float_constant(row)
        if kind == 2:
            found = self.pick(lambda u: self.floating(u) and u is not v
                              and _broadcasts_into(u.shape, target))
            if found is not None:
                return found
        keep = [self.chooser.boolean(0.7) for _ in v.shape]
        drop = self.chooser.integer(0, len(v.shape))
        shape = tuple(d if k else 1 for d, k in zip(v.shape, keep, strict=True))[drop:]
        return self.new_input(shape)


def _broadcast_size(a: tuple[int, ...], b: tuple[int, ...], limit: int) -> bool:
    """True if ``a`` and ``b`` broadcast to a shape of at most ``limit`` elements."""
    try:
        shape = np.broadcast_shapes(a, b)
    except ValueError:
        return False
    return math.prod(shape) <= limit


def _broadcasts_into(shape: tuple[int, ...], target: tuple[int, ...]) -> bool:
    """True if ``shape`` broadcasts to ``target`` without enlarging it."""
    if len(shape) > len(target):
        return False
    return all(d in (1, t) for d, t in zip(reversed(shape), reversed(target), strict=False))


def _interval(fn: Callable[[float], float], v: Value) -> tuple[float, float]:
    """Bounds of a monotonic ``fn`` over ``v``'s interval."""
    ends = sorted((fn(v.lo), fn(v.hi)))
    return ends[0], ends[1]


# Op makers: each adds one or a few nodes from the pool and returns the value it made, or None
# when no operand in the pool suits it (the generator then tries another op).

_UNARY: dict[str, tuple[Callable[[float], float] | None, bool]] = {
    # op: (monotonic function for the interval, None if handled specially; keeps exactness)
    "Neg": (lambda x: -x, True),
    "Relu": (lambda x: max(x, 0.0), True),
    "Sigmoid": (lambda x: 1.0 / (1.0 + math.exp(-max(min(x, 50.0), -50.0))), False),
    "Tanh": (math.tanh, False),
    "Erf": (math.erf, False),
    "Abs": (None, True),
    "Exp": (math.exp, False),
    "Sqrt": (math.sqrt, False),
    "Log": (math.log, False),
    "Reciprocal": (lambda x: 1.0 / x, False),
    "Floor": (math.floor, True),
    "Sign": (None, True),
}


def _unary(b: _Builder) -> Value | None:
    op = b.chooser.choice(tuple(_UNARY))
    fn, keeps_exact = _UNARY[op]
    exact_only = op in ("Floor", "Sign")
    v = b.pick(lambda u: b.floating(u) and (u.exact or not exact_only))
    if v is None:
        return None
    if op == "Exp" and v.hi > math.log(b.config.bound(b.dtype)):
        v = b.add("Tanh", [v.name], Value("", v.shape, v.dtype, *_interval(math.tanh, v), False))
    if op in ("Sqrt", "Log", "Reciprocal"):
        v = b.positive(v)
    if op == "Abs":
        lo, hi = (0.0 if v.lo < 0 < v.hi else min(abs(v.lo), abs(v.hi))), v.magnitude
    elif op == "Sign":
        lo, hi = -1.0, 1.0
    else:
        lo, hi = _interval(fn, v)
    return b.add(op, [v.name], Value("", v.shape, v.dtype, lo, hi, keeps_exact and v.exact))


def _pow(b: _Builder) -> Value | None:
    v = b.pick(b.floating)
    if v is None:
        return None
    exponent = b.chooser.choice(POW_EXPONENTS)
    if (v.hi if v.lo >= 0.5 else v.magnitude + 0.5) ** exponent > b.config.bound(b.dtype):
        v = b.add("Tanh", [v.name], Value("", v.shape, v.dtype, *_interval(math.tanh, v), False))
    base = b.positive(v)
    lo, hi = _interval(lambda x: x ** exponent, base)
    e = b.float_constant(np.array(exponent))
    return b.add("Pow", [base.name, e.name], Value("", base.shape, base.dtype, lo, hi, False))


_BINARY = ("Add", "Mul", "Sub", "Div", "Max", "Min")


def _binary(b: _Builder) -> Value | None:
    op = b.chooser.choice(_BINARY)
    x = b.pick(b.floating)
    if x is None:
        return None
    y = b.broadcast_partner(x)
    if op == "Div":
        y = b.positive(y)
    shape = tuple(np.broadcast_shapes(x.shape, y.shape))
    if op in ("Max", "Min"):
        fn = max if op == "Max" else min
        lo, hi = fn(x.lo, y.lo), fn(x.hi, y.hi)
    elif op in ("Add", "Sub"):
        lo, hi = (x.lo + y.lo, x.hi + y.hi) if op == "Add" else (x.lo - y.hi, x.hi - y.lo)
    else:
        other = (y.lo, y.hi) if op == "Mul" else (1.0 / y.hi, 1.0 / y.lo)
        corners = [p * q for p in (x.lo, x.hi) for q in other]
        lo, hi = min(corners), max(corners)
    if max(abs(lo), abs(hi)) > b.config.bound(b.dtype):
        op, lo, hi = "Max", max(x.lo, y.lo), max(x.hi, y.hi)
    exact = op in ("Max", "Min") and x.exact and y.exact
    return b.add(op, [x.name, y.name], Value("", shape, x.dtype, lo, hi, exact))


_REDUCTIONS = ("ReduceSum", "ReduceMean", "ReduceMax", "ReduceMin")


def _reduce(b: _Builder) -> Value | None:
    v = b.pick(lambda u: b.floating(u) and len(u.shape) > 0)
    if v is None:
        return None
    op = b.chooser.choice(_REDUCTIONS)
    axes = b.chooser.subset(list(range(len(v.shape))), min_size=1)
    keep = b.chooser.boolean()
    count = math.prod(v.shape[a] for a in axes)
    lo, hi = v.lo, v.hi
    if op == "ReduceSum":
        lo, hi = lo * count, hi * count
        if max(abs(lo), abs(hi)) > b.config.bound(b.dtype):
            op, lo, hi = "ReduceMean", v.lo, v.hi
    shape = tuple(1 if i in axes else d for i, d in enumerate(v.shape) if keep or i not in axes)
    negative = b.chooser.boolean(0.3)
    axes_name = b.constant(np.array([a - len(v.shape) if negative else a for a in axes],
                                    dtype=np.int64))
    exact = op in ("ReduceMax", "ReduceMin") and v.exact
    return b.add(op, [v.name, axes_name], Value("", shape, v.dtype, lo, hi, exact),
                 keepdims=int(keep))


def _softmax(b: _Builder) -> Value | None:
    v = b.pick(lambda u: b.floating(u) and len(u.shape) > 0)
    if v is None:
        return None
    op = b.chooser.choice(("Softmax", "LogSoftmax"))
    axis = b.chooser.integer(-len(v.shape), len(v.shape) - 1)
    length = v.shape[axis]
    if op == "Softmax":
        lo, hi = 0.0, 1.0
    else:
        lo, hi = -(v.hi - v.lo) - math.log(length), 0.0
        if -lo > b.config.bound(b.dtype):
            return None
    return b.add(op, [v.name], Value("", v.shape, v.dtype, lo, hi, False), axis=axis)


def _layer_norm(b: _Builder) -> Value | None:
    v = b.pick(lambda u: b.floating(u) and len(u.shape) > 0)
    if v is None:
        return None
    axis = b.chooser.integer(-len(v.shape), len(v.shape) - 1)
    normalized = v.shape[axis:]
    count = math.prod(normalized)
    # Normalised values are bounded by sqrt(count - 1), and beyond 5 only for rows with a
    # single outlier; gamma <= 1.5 and |beta| <= 0.5.
    reach = 1.5 * min(math.sqrt(max(count - 1, 0)), 5.0) + 0.5
    if reach > b.config.bound(b.dtype):
        return None
    scale = np.linspace(0.5, 1.5, count).reshape(normalized)
    operands = [v.name, b.float_constant(scale).name]
    if b.chooser.boolean(0.7):
        operands.append(b.float_constant(np.linspace(-0.5, 0.5, count).reshape(normalized)).name)
    return b.add("LayerNormalization", operands, Value("", v.shape, v.dtype, -reach, reach,
                                                       False), axis=axis, epsilon=1e-5)


def _reshape(b: _Builder) -> Value | None:
    v = b.pick(lambda u: u.dtype != "bool")
    if v is None:
        return None
    shape = list(v.shape)
    kind = b.chooser.integer(0, 3)
    if kind == 0 or len(shape) < 2:
        target = [v.size] if kind == 0 else [1, *shape]
    elif kind == 1:
        i = b.chooser.integer(0, len(shape) - 2)
        target = shape[:i] + [shape[i] * shape[i + 1]] + shape[i + 2:]
    else:
        i = b.chooser.integer(0, len(shape) - 1)
        factors = [f for f in range(2, shape[i]) if shape[i] % f == 0]
        if not factors:
            target = shape[:i] + [1, shape[i]] + shape[i + 1:]
        else:
            f = b.chooser.choice(factors)
            target = shape[:i] + [f, shape[i] // f] + shape[i + 1:]
    spec = list(target)
    if b.chooser.boolean(0.3):
        spec[b.chooser.integer(0, len(spec) - 1)] = -1
    shape_name = b.constant(np.array(spec, dtype=np.int64))
    return b.add("Reshape", [v.name, shape_name], Value("", tuple(target), v.dtype, v.lo, v.hi,
                                                         v.exact))


def _transpose(b: _Builder) -> Value | None:
    v = b.pick(lambda u: len(u.shape) > 1)
    if v is None:
        return None
    perm = list(range(len(v.shape)))
    for i in range(len(perm) - 1, 0, -1):
        j = i - b.chooser.integer(0, i)
        perm[i], perm[j] = perm[j], perm[i]
    shape = tuple(v.shape[p] for p in perm)
    return b.add("Transpose", [v.name], Value("", shape, v.dtype, v.lo, v.hi, v.exact),
                 perm=perm)


def _expand(b: _Builder) -> Value | None:
    v = b.pick(lambda u: u.size * min(EXPAND_SIZES) <= b.config.max_elements)
    if v is None:
        return None
    room = b.config.max_elements // v.size
    sizes = [s for s in EXPAND_SIZES if s <= room]
    ones = [i for i, d in enumerate(v.shape) if d == 1]
    shape = list(v.shape)
    if ones and b.chooser.boolean(0.7):
        shape[b.chooser.choice(ones)] = b.chooser.choice(sizes)
    else:
        shape = [b.chooser.choice(sizes), *shape]
    shape_name = b.constant(np.array(shape, dtype=np.int64))
    return b.add("Expand", [v.name, shape_name], Value("", tuple(shape), v.dtype, v.lo, v.hi,
                                                        v.exact))


_COMPARISONS = ("Less", "Greater", "Equal", "LessOrEqual", "GreaterOrEqual")


def _where(b: _Builder) -> Value | None:
    x = b.pick(lambda u: b.floating(u) and u.exact)
    if x is None:
        return None
    op = b.chooser.choice(_COMPARISONS)
    partner = b.pick(lambda u: b.floating(u) and u.exact and u is not x
                     and _broadcast_size(u.shape, x.shape, b.config.max_elements))
    if partner is None or b.chooser.boolean():
        partner = b.float_constant(np.array(b.chooser.choice((0.0, 0.5, -1.0))))
    shape = tuple(np.broadcast_shapes(x.shape, partner.shape))
    cond = b.add(op, [x.name, partner.name], Value("", shape, "bool", 0.0, 1.0, True))
    if b.chooser.boolean(0.3):  # a mask as numbers: Cast(bool) -> float
        to = _ELEM_TYPES[b.dtype]
        return b.add("Cast", [cond.name], Value("", shape, b.dtype, 0.0, 1.0, True), to=to)
    y = b.pick(lambda u: b.floating(u) and _broadcast_size(u.shape, shape,
                                                            b.config.max_elements)) or x
    z = b.broadcast_partner(y, shape)
    out_shape = tuple(np.broadcast_shapes(shape, y.shape, z.shape))
    lo, hi = min(y.lo, z.lo), max(y.hi, z.hi)
    return b.add("Where", [cond.name, y.name, z.name],
                 Value("", out_shape, b.dtype, lo, hi, y.exact and z.exact))


def _cast_island(b: _Builder) -> Value | None:
    """In a float16 graph, compute one op in float32 between two casts (mixed precision);
    in a float32 graph, a Cast to float32 (a no-op cast TVM must still handle)."""
    v = b.pick(b.floating)
    if v is None:
        return None
    if b.dtype == "float32":
        return b.add("Cast", [v.name], v, to=TensorProto.FLOAT)
    wide = b.add("Cast", [v.name], Value("", v.shape, "float32", v.lo, v.hi, v.exact),
                 to=TensorProto.FLOAT)
    b.dtype = "float32"
    try:
        inner = b.chooser.choice((_unary, _softmax, _layer_norm, _reduce))(b) or wide
    finally:
        b.dtype = "float16"
    if inner.dtype != "float32" or inner.magnitude > b.config.bound("float16"):
        return wide
    return b.add("Cast", [inner.name], Value("", inner.shape, "float16", inner.lo, inner.hi,
                                             inner.exact), to=TensorProto.FLOAT16)


def _matmul(b: _Builder) -> Value | None:
    v = b.pick(lambda u: b.floating(u) and len(u.shape) > 0)
    if v is None:
        return None
    k = v.shape[-1]
    n = b.chooser.choice(MATMUL_WIDTHS)
    if v.size // k * n > b.config.max_elements:
        return None
    # Rows of |w| summing to at most 1 keep the product within the operand's bound.
    weights = np.cos(np.arange(k * n).reshape(k, n)) / k
    w = b.float_constant(weights)
    shape = (*v.shape[:-1], n)
    return b.add("MatMul", [v.name, w.name], Value("", shape, v.dtype, -v.magnitude,
                                                   v.magnitude, False))


_MAKERS: tuple[tuple[Callable[[_Builder], Value | None], float], ...] = (
    (_unary, 3.0),
    (_binary, 3.0),
    (_reduce, 2.0),
    (_softmax, 1.0),
    (_layer_norm, 1.0),
    (_reshape, 1.0),
    (_transpose, 1.0),
    (_expand, 0.7),
    (_where, 1.0),
    (_pow, 0.7),
    (_cast_island, 0.5),
    (_matmul, 0.0),  # weight set from GraphConfig.matmul
)


def _base_shape(chooser: Chooser, limit: int) -> tuple[int, ...]:
    """Rows x row length with at most ``limit`` elements; rows split over leading dims."""
    length = chooser.choice(ROW_LENGTHS)
    rows = chooser.choice([r for r in ROW_COUNTS if r * length <= limit] or [1])
    leading = [rows]
    if chooser.boolean(0.4):
        factors = [f for f in range(2, rows) if rows % f == 0]
        if factors:
            f = chooser.choice(factors)
            leading = [f, rows // f]
    if rows == 1 and chooser.boolean(0.3):
        leading = []
    return (*leading, length)


def random_graph(chooser: Chooser, config: GraphConfig = GraphConfig()) -> onnx.ModelProto:
    """One random ONNX model (opset 18) built from ``chooser``'s decisions."""
    dtype = "float16" if chooser.boolean(config.float16) else "float32"
    if config.large and chooser.boolean(config.large):
        shape = chooser.choice(LARGE_SHAPES)
        config = replace(config, max_elements=max(config.max_elements, math.prod(shape)))
    else:
        shape = _base_shape(chooser, config.max_elements)
    b = _Builder(chooser, config, dtype)
    b.new_input(shape)
    count = chooser.integer(1, config.max_nodes)
    makers = [m for m, _ in _MAKERS]
    weights = [config.matmul if m is _matmul else w for m, w in _MAKERS]
    while len(b.nodes) < count:
        before = len(b.nodes)
        made = makers[chooser.weighted(weights)](b)
        if made is None or len(b.nodes) == before:
            made = _unary(b)
        if made is None:  # nothing takes the pool's values: give up on more nodes
            break
    return _finish(b)


def _finish(b: _Builder) -> onnx.ModelProto:
    """Pick the outputs (every unused value, some others) and assemble the model."""
    produced = [v for v in b.values if v not in b.inputs]
    outputs = [v for v in produced if v.name not in b.consumed
               or (v.dtype == b.dtype and b.chooser.boolean(b.config.extra_outputs))]
    # In a float16 graph a float32 or bool output would be compared at a tolerance that
    # float16 rounding between kernels cannot meet; such values stay internal.
    if b.dtype == "float16":
        outputs = [v for v in outputs if v.dtype == "float16"]
        if not outputs:
            last = produced[-1]
            outputs = [b.add("Cast", [last.name], Value("", last.shape, "float16"),
                             to=TensorProto.FLOAT16)]
    graph = helper.make_graph(
        b.nodes, "random",
        [helper.make_tensor_value_info(v.name, _ELEM_TYPES[v.dtype], list(v.shape))
         for v in b.inputs],
        [helper.make_tensor_value_info(v.name, _ELEM_TYPES[v.dtype], list(v.shape))
         for v in outputs],
        initializer=b.initializers)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)],
                              producer_name="tvm_stitch.testing")
    model.ir_version = IR_VERSION
    onnx.checker.check_model(model)
    return model


def graph_from_seed(seed: int | str, config: GraphConfig = GraphConfig()
                    ) -> tuple[onnx.ModelProto, list[int]]:
    """The graph for ``seed`` and the choices that made it (for :func:`choices.shrink`)."""
    chooser = RandomChooser(seed)
    return random_graph(chooser, config), chooser.record


def graphs(config: GraphConfig = GraphConfig()):
    """A Hypothesis strategy of random models (shrinks towards small float32 graphs)."""
    from hypothesis import strategies as st

    @st.composite
    def strategy(draw) -> onnx.ModelProto:
        return random_graph(HypothesisChooser(draw), config)

    return strategy()


def describe(model: onnx.ModelProto) -> str:
    """A compact text form of ``model``: inputs, one line per node, outputs (constants are
    shown by shape, not by value)."""
    consts = {t.name: _show_constant(t) for t in model.graph.initializer}

    def typed(v: onnx.ValueInfoProto) -> str:
        t = v.type.tensor_type
        dims = [d.dim_value if d.HasField("dim_value") else d.dim_param for d in t.shape.dim]
        return f"{v.name}: {TensorProto.DataType.Name(t.elem_type).lower()}{dims}"

    lines = ["inputs " + ", ".join(typed(v) for v in model.graph.input if v.name not in consts)]
    for node in model.graph.node:
        attrs = ", ".join(f"{a.name}={_show_attribute(a)}" for a in node.attribute)
        args = ", ".join(consts.get(i, i) for i in node.input)
        lines.append(f"{', '.join(node.output)} = {node.op_type}({args})"
                     + (f" [{attrs}]" if attrs else ""))
    lines.append("outputs " + ", ".join(typed(v) for v in model.graph.output))
    return "\n".join(lines)


def _show_constant(tensor: onnx.TensorProto) -> str:
    array = numpy_helper.to_array(tensor)
    if array.size <= 8:
        return f"{array.tolist()}:{array.dtype}"
    return f"const{list(array.shape)}"


def _show_attribute(attr: onnx.AttributeProto) -> str:
    value = helper.get_attribute_value(attr)
    return f"{value:g}" if isinstance(value, float) else str(value)
