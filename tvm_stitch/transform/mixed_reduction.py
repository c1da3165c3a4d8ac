"""Mixed reductions: a reduction whose reduced axes are mixed with kept ones reduces a
transposed view of its input instead, in which they are all trailing.

The stitch schedule maps two forms of reduction: row reductions (the reduced axes trail) and
column reductions (they lead). ONNX graphs also reduce axes in between: a ReduceMean over
axes (0, 2) of (B, C, L), or a softmax over the middle axis of (B, N, C). Summing, averaging,
or taking the maximum, minimum or product does not depend on the order of the elements, so
such a reduction is the same reduction of ``permute_dims`` of its input with the reduced axes
moved last: a row reduction, whose rows gather the reduced elements of each kept index.
(Moving them first instead would make a column reduction, but Global stitching reads each
row of a column reduction as one contiguous run of its input, which a transposed input is
not.) A column reduction (over leading axes) of no more rows than columns whose input
nothing else stitches with reduces a transposed view too (``_strided_columns``): strided
rows read each element once where Global stitching's partial sums of short row tiles make
a round trip through global memory. A softmax or log-softmax over a middle axis is the
same op over the last axis of a transposed input, transposed back (one over the first
axis is a column softmax, which Global stitching maps as it is where it has more rows than
columns, ``_few_rows``). The transpose into the reduction stitches into the reduction's
kernel, which reads the input through it (grouping merges a transpose that only a
reduction reads into that reduction first); the one back may be a kernel of its own. A
transposed view of a transpose is one transpose of its source, and none when the two cancel:
attention pooling (a softmax over the steps of (B, T, E), weighting a sum over them) reads
the softmax's rows as they are made, one kernel.
"""

from __future__ import annotations

from collections.abc import Callable
from math import prod

import tvm
import tvm_ffi
from tvm import relax, tirx
from tvm.ir import IRModule

from .rewrite import rewrite_functions
from .unit_reduction import REDUCTIONS, reduced_axes

_SOFTMAX = {"relax.nn.softmax": relax.op.nn.softmax,
            "relax.nn.log_softmax": relax.op.nn.log_softmax}


def _static_dims(expr: relax.Expr) -> list[int | None] | None:
    """The extents of ``expr``'s shape (None for a symbolic one); None when the shape is
    unknown."""
    ty = expr.ty
    if not isinstance(ty, relax.TensorType) or ty.shape is None:
        return None
    return [int(d) if isinstance(d, tirx.IntImm) else None for d in ty.shape]


def reduction_permutation(dims: list[int | None], reduced: list[int]) -> list[int] | None:
    """The order of axes in which a reduction over ``reduced`` of a tensor of extents
    ``dims`` reduces trailing axes only, or None when it already reduces trailing or leading
    axes only. Axes of extent 1 are ignored: they may sit anywhere."""
    long_axes = [a for a, d in enumerate(dims) if d != 1]
    kinds = "".join("R" if a in reduced else "S" for a in long_axes)
    if "SR" not in kinds or "RS" not in kinds:
        return None
    return [a for a in range(len(dims)) if a not in reduced] + sorted(reduced)


def _trailing(dims: list[int | None], reduced: list[int]) -> bool:
    """Whether a reduction over ``reduced`` of extents ``dims`` is a row reduction: no kept
    axis after a reduced one (axes of extent 1 ignored)."""
    kinds = "".join("R" if a in reduced else "S" for a, d in enumerate(dims) if d != 1)
    return "RS" not in kinds


def _permuted(data: relax.Expr, dims: list[int | None], perm: list[int]) -> relax.Expr:
    """``permute_dims(data, perm)``, or the reshape to its shape when the permutation only
    moves axes of extent 1 (the elements keep their order: a view, not a copy)."""
    long_axes = [a for a in perm if dims[a] != 1]
    if long_axes == sorted(long_axes) and None not in dims:
        return relax.op.reshape(data, [dims[a] for a in perm])
    return relax.op.permute_dims(data, perm)


_MATERIALISED = frozenset({
    "relax.reshape", "relax.permute_dims", "relax.expand_dims", "relax.squeeze",
    "relax.strided_slice", "relax.concat", "relax.matmul", "relax.nn.conv1d",
    "relax.nn.conv2d", "relax.nn.conv3d", "relax.nn.softmax", "relax.nn.log_softmax",
    "relax.nn.layer_norm", "relax.nn.rms_norm", "relax.nn.group_norm"})
"""Ops whose result a transposed reduction may read: copies (read through, as a parameter
is) and ops whose result is written to global memory anyway (a matmul's, a normalisation's:
TVM fuses no reduction after another; nor a slice or a concatenation before one). Not a
broadcast: TVM fuses it into the reduction, and its result, in the order of the reduction's
input, does not split into the rows of the transposed view, so it would be a kernel of its
own (a Min over the middle axis of ``Expand(x, (7, 2, 16))``: 3 kernels where TVM's flow
takes 2, fuzz graphs 12014:69 and 12016:355)."""


def _read_through(lookup: Callable[[relax.Var], relax.Expr | None], data: relax.Expr,
                  outputs: list[relax.Var]) -> bool:
    """Whether a reduction of ``data`` read through a transpose moves no more bytes than it
    does now: ``data`` is a parameter, a constant, a result of the function (``outputs``:
    written anyway), or the result of a copy or a matmul. The result of an element-wise op
    is not: TVM fuses it into the reduction, but the stitched transpose breaks its rows, so
    it would be written for the reduction to read back (the attention-weighted sum over the
    sequence axis of DIEN moved 64 KB more). ``lookup`` gives a variable's bound value."""
    bound = lookup(data) if isinstance(data, relax.Var) else None
    if bound is None or any(data.same_as(v) for v in outputs):
        return True
    return isinstance(bound, relax.Call) and isinstance(bound.op, tvm.ir.Op) \
        and bound.op.name in _MATERIALISED


_ELEMENT_WISE = frozenset(f"relax.{name}" for name in (
    "abs", "exp", "log", "tanh", "sigmoid", "sqrt", "rsqrt", "negative", "sin", "cos", "erf",
    "floor", "ceil", "round", "sign", "square", "clip", "nn.relu", "nn.gelu", "nn.silu",
    "astype", "add", "subtract", "multiply", "divide", "power", "maximum", "minimum",
    "greater", "greater_equal", "less", "less_equal", "equal", "not_equal", "where"))
"""Element-wise ops a transposed view moves through: each element of the result depends on
the elements of its operands at the same (broadcast) index only."""

MAX_PUSHED = 8
"""Element-wise ops a transposed view moves through at most, for one reduction."""


def _bound(func: relax.Function) -> dict[relax.Var, relax.Expr]:
    """The value bound to each variable of ``func``'s body, in binding order."""
    return {b.var: b.value for block in func.body.blocks for b in block.bindings
            if isinstance(b, relax.VarBinding)}


def _function_outputs(func: relax.Function) -> list[relax.Var]:
    """The variables whose values a function returns (the fields of a returned tuple)."""
    bound = _bound(func)
    result = func.body.body
    while isinstance(result, relax.Var) and result in bound \
            and isinstance(bound[result], relax.Var | relax.Tuple):
        result = bound[result]
    fields = result.fields if isinstance(result, relax.Tuple) else [result]
    return [f for f in fields if isinstance(f, relax.Var)]


def _readers(bound: dict[relax.Var, relax.Expr]) -> dict[relax.Var, list[relax.Expr]]:
    """The values of ``bound`` (``_bound``) that read each variable: calls, tuples and
    aliases."""
    read: dict[relax.Var, list[relax.Expr]] = {}
    for value in bound.values():
        args = value.args if isinstance(value, relax.Call) else \
            value.fields if isinstance(value, relax.Tuple) else [value]
        for arg in args:
            if isinstance(arg, relax.Var):
                read.setdefault(arg, []).append(value)
    return read


def _pooled_softmaxes(func: relax.Function) -> set[relax.Call]:
    """The softmax calls of ``func`` whose result a reduction over the softmax's axis
    reads, directly or through at most ``MAX_PUSHED`` element-wise ops (attention pooling:
    a softmax over the steps weights a sum over them)."""
    bound = _bound(func)
    users: dict[relax.Var, list[relax.Call]] = {}
    for value in bound.values():
        if isinstance(value, relax.Call):
            for arg in value.args:
                if isinstance(arg, relax.Var):
                    users.setdefault(arg, []).append(value)
    var_of = {v: k for k, v in bound.items() if isinstance(v, relax.Call)}

    def reaches(var: relax.Var, axis: int, budget: int) -> bool:
        for user in users.get(var, []):
            if _is(user, REDUCTIONS) and reduced_axes(user) == [axis]:
                return True
            if _is(user, _ELEMENT_WISE) and budget > 0 and user in var_of \
                    and reaches(var_of[user], axis, budget - 1):
                return True
        return False

    found = set()
    for var, value in bound.items():
        if isinstance(value, relax.Call) and _is(value, _SOFTMAX) and value.ty.ndim > 0:
            axis = int(value.attrs.axis) % value.ty.ndim
            if reaches(var, axis, MAX_PUSHED):
                found.add(value)
    return found


_COMPUTE = frozenset({"relax.matmul", "relax.nn.conv1d", "relax.nn.conv2d", "relax.nn.conv3d"})
"""Ops whose kernels are not stitched: a transpose that only they read is no op's row."""


def _sinks(func: relax.Function, reductions: bool) -> set[relax.Call]:
    """The softmax calls of ``func``, and with ``reductions`` its reductions over axes mixed
    with kept ones that keep their dimensions, whose result no memory-intensive op reads
    but element-wise ops whose other operands are scalars or read through a transpose
    (``_sinkable``), at most ``MAX_PUSHED`` of them in a chain (it is returned, or read by
    matmuls only, in the end; a reduction's result may also be reshaped, and read by a
    reduction over the same axes): transposed back after those ops
    (``_MixedReduction._sunk``), the transpose is the last op of the kernel, written in
    place (``grouping._permuted_sink``). A batch norm over (N, C, H, W) is then one kernel
    over the channels' rows of a (C, N, H, W) view, where the statistics and the
    normalisation were two."""
    bound = _bound(func)
    outputs = _function_outputs(func)
    read = _readers(bound)
    var_of = {v: k for k, v in bound.items() if isinstance(v, relax.Call)}
    # what the chains of candidate sinks make: each is transposed back by the time an
    # element-wise op of two chains (a centred input over its deviation) is rewritten
    chained = {var for var, value in bound.items() if isinstance(value, relax.Call) and (
        _is(value, _SOFTMAX) or (reductions and _mixed(value) is not None))}
    frontier = list(chained)
    while frontier:
        for user in read.get(frontier.pop(), []):
            if user in var_of and _is(user, _ELEMENT_WISE) and var_of[user] not in chained:
                chained.add(var_of[user])
                frontier.append(var_of[user])

    def sinks(var: relax.Var, budget: int, axes: list[int] | None, reduced: bool) -> bool:
        return all(isinstance(user, relax.Tuple | relax.Var)
                   or (isinstance(user, relax.Call) and _is(user, _COMPUTE))
                   or (reduced and isinstance(user, relax.Call)
                       and _is(user, {"relax.reshape": None}))
                   or (axes is not None and isinstance(user, relax.Call)
                       and _mixed(user) == axes)
                   or (budget > 0 and user in var_of
                       and _sinkable(user, var, bound.get, outputs, chained,
                                     pushed=axes is not None)
                       and sinks(var_of[user], budget - 1, axes, False))
                   for user in read.get(var, []))

    found = set()
    for var, value in bound.items():
        if not isinstance(value, relax.Call):
            continue
        if _is(value, _SOFTMAX) and sinks(var, MAX_PUSHED, None, False):
            found.add(value)
        axes = _mixed(value) if reductions else None
        if axes is not None and value.attrs.keepdims and sinks(var, MAX_PUSHED, axes, True):
            found.add(value)
    return found


def _mixed(call: relax.Call) -> list[int] | None:
    """The axes a reduction reduces, where they are mixed with kept ones
    (``reduction_permutation``); None for any other call."""
    if not _is(call, REDUCTIONS):
        return None
    dims, reduced = _static_dims(call.args[0]), reduced_axes(call)
    if dims is None or reduced is None or reduction_permutation(dims, reduced) is None:
        return None
    return reduced


def _sinkable(expr: relax.Expr, var: relax.Var,
              lookup: Callable[[relax.Var], relax.Expr | None],
              outputs: list[relax.Var], chained: frozenset | set = frozenset(),
              pushed: bool = False) -> bool:
    """Whether ``expr`` is an element-wise call of ``var`` of ``var``'s shape, or of a shape
    ``var`` broadcasts to along its axes of extent 1, that applies alike to the elements of
    a transposed view of ``var``: its other operands are scalars, or tensors read through
    a transpose at no cost (``_read_through``), or with ``pushed`` computed from such
    (``_pushable``): a column softmax plus its input, or an input less its mean over mixed
    axes, say. ``chained``: operands that are sunk too."""
    if not (isinstance(expr, relax.Call) and _is(expr, _ELEMENT_WISE)):
        return False
    dims, out = _static_dims(var), _static_dims(expr)
    if dims is None or out is None or None in dims or None in out or len(out) != len(dims) \
            or any(d not in (1, o) for d, o in zip(dims, out, strict=True)):
        return False
    dims = out
    for arg in expr.args:
        shape = _static_dims(arg)
        if arg.same_as(var) or shape == [] or arg in chained:
            continue
        if shape is None or len(shape) > len(dims) or not (
                _pushable(lookup, arg, outputs) if pushed
                else _read_through(lookup, arg, outputs)):
            return False
    return True


def _pushable(lookup: Callable[[relax.Var], relax.Expr | None], expr: relax.Expr,
              outputs: list[relax.Var], budget: int = MAX_PUSHED) -> bool:
    """Whether ``expr`` is read through a transpose at no cost (``_read_through``), or made
    by element-wise ops of such operands, at most ``budget`` of them, that a transposed view
    computes from transposed views of their operands (``_MixedReduction._view``): the
    condition of a select of a mean over a middle axis, say."""
    if _read_through(lookup, expr, outputs):
        return True
    bound = lookup(expr) if isinstance(expr, relax.Var) else None
    return budget > 0 and isinstance(bound, relax.Call) and _is(bound, _ELEMENT_WISE) \
        and all(_static_dims(a) == [] or _pushable(lookup, a, outputs, budget - 1)
                for a in bound.args)


def _is(call: relax.Call, table: dict | frozenset) -> bool:
    return isinstance(call.op, tvm.ir.Op) and call.op.name in table


def _few_rows(dims: list[int | None], axis: int) -> bool:
    """Whether a column softmax over ``axis`` (no longer axis before it) of extents ``dims``
    has no more rows than columns: as strided rows of a transposed view (a row per column,
    threads side by side along the columns) it reads and writes each element once in one
    pass, with no grid barrier, where Global stitching combines (maximum, sum) pairs of
    row tiles through global memory between phases, and TVM's kernel reads a column per
    block, each thread a sector of its own. With many rows and few columns, strided rows
    would leave most of the GPU idle: Global stitching maps those."""
    return None not in dims and dims[axis] <= prod(dims[axis + 1:])


def _column_permutation(dims: list[int | None], reduced: list[int]) -> list[int] | None:
    """The order of axes in which a column reduction (over leading axes only) of extents
    ``dims`` over ``reduced`` reduces trailing axes, when its rows are no more than its
    columns (``_few_rows``' rule for a column softmax); else None. Read through a transpose,
    it is a reduction of strided rows, a thread per column reading down its column side by
    side with the next, each element once, where Global stitching writes a row of partial
    sums per row tile and reads them back after a grid barrier: with fewer rows than
    ``tiles.MIN_TILE_ROWS`` a whole row of partial sums for every few rows (a mean of
    (2, 30000) and its erf: 1.3 MB where its input and results are 480 KB, fuzz graph
    12032:219)."""
    if None in dims or not reduced or _trailing(dims, reduced) \
            or reduction_permutation(dims, reduced) is not None:
        return None
    rows = prod(dims[a] for a in reduced)
    if rows == 1 or rows > prod(dims) // rows:
        return None
    return [a for a in range(len(dims)) if a not in reduced] + sorted(reduced)


def _strided_columns(func: relax.Function) -> set[relax.Call]:
    """The column reductions of ``func`` to read through a transpose as strided rows
    (``_column_permutation``): of a parameter, a constant or a matmul's result that no
    other memory-intensive op reads but a column reduction over the same axes, and whose
    result no op makes larger again, directly or after other ops. Global stitching keeps,
    in one kernel, the column sums beside the row ops of their input or of what makes it
    (a copy, a softmax), and beside the ops that broadcast the sums back over the rows (a
    batch norm's normalisation): a transposed reduction would be a kernel apart from them."""
    bound = _bound(func)
    read = _readers(bound)
    var_of = {v: k for k, v in bound.items() if isinstance(v, relax.Call)}

    def axes_of(call: relax.Expr) -> list[int] | None:
        if not (isinstance(call, relax.Call) and _is(call, REDUCTIONS)):
            return None
        dims, reduced = _static_dims(call.args[0]), reduced_axes(call)
        return None if dims is None or reduced is None \
            or _column_permutation(dims, reduced) is None else reduced

    def stays_small(var: relax.Var, size: int) -> bool:
        """Whether no op reading ``var``, directly or after other ops, makes more than
        ``size`` elements."""
        seen, frontier = {var}, [var]
        while frontier:
            for user in read.get(frontier.pop(), []):
                if not isinstance(user, relax.Call):
                    continue
                dims = _static_dims(user) if isinstance(user.ty, relax.TensorType) else None
                if dims is None or None in dims or prod(dims) > size:
                    return False
                if user in var_of and var_of[user] not in seen:
                    seen.add(var_of[user])
                    frontier.append(var_of[user])
        return True

    found = set()
    for var, value in bound.items():
        axes = axes_of(value)
        data = value.args[0] if axes is not None else None
        made = bound.get(data) if isinstance(data, relax.Var) else None
        if data is None or (made is not None and not (isinstance(made, relax.Call)
                                                      and _is(made, _COMPUTE))) or any(
                isinstance(user, relax.Call) and not _is(user, _COMPUTE)
                and axes_of(user) != axes for user in read.get(data, [])):
            continue
        if stays_small(var, prod(_static_dims(value))):
            found.add(value)
    return found


@relax.expr_functor.mutator
class _MixedReduction(relax.PyExprMutator):
    """Rewrites reductions over axes mixed with kept ones, and softmaxes over a middle axis,
    into the same op over a transposed input."""

    outputs: list[relax.Var] = []
    pooled: set[relax.Call] = set()
    sinks: set[relax.Call] = set()
    strided: set[relax.Call] = set()  # column reductions read as strided rows
    # a sink's result transposed back -> (its rows, the inverse permutation, the names' stem)
    transposed_back: dict[relax.Var, tuple[relax.Var, list[int], str]] = {}
    # (a sink softmax's input, its permutation) -> the view the softmax reads
    views: dict[tuple[relax.Var, tuple[int, ...]], relax.Expr] = {}
    kept: frozenset[str] = frozenset()  # the bindings left as they are
    reduction_sinks = True  # whether reductions over mixed axes sink (``_sinks``)
    site = ""  # the binding being rewritten
    # each binding the rewrite made -> the binding it was made for
    origins: dict[str, str] = {}
    sunk: set[str] = set()  # the reductions that sank (``_sinks``), and their readers

    def visit_function_(self, func: relax.Function) -> relax.Expr:
        """``func`` rewritten, knowing the variables it returns and the softmaxes a
        reduction over their axis reads."""
        seq = isinstance(func.body, relax.SeqExpr)
        self.outputs = _function_outputs(func) if seq else []
        self.pooled = _pooled_softmaxes(func) if seq else set()
        self.sinks = _sinks(func, self.reduction_sinks) if seq else set()
        self.strided = _strided_columns(func) if seq else set()
        self.transposed_back = {}
        self.views = {}
        return super().visit_function_(func)

    def visit_var_binding_(self, binding: relax.VarBinding) -> None:
        """The binding rewritten, the bindings its rewrite makes recorded as its own."""
        self.site = binding.var.name
        super().visit_var_binding_(binding)

    def _emit(self, expr: relax.Expr, name_hint: str) -> relax.Var:
        """``expr`` bound to a new variable, made for the binding being rewritten."""
        var = self.builder_.emit(expr, name_hint=name_hint)
        self.origins[var.name] = self.site
        return var

    def visit_call_(self, call: relax.Call) -> relax.Expr:
        """The transposed form of a mixed reduction or softmax; other calls, and those of
        the bindings in ``kept``, unchanged. A binding rewritten is its own origin."""
        if self.site in self.kept:
            return super().visit_call_(call)
        pays = call in self.pooled or call in self.sinks
        sink = call in self.sinks
        strided = call in self.strided
        call = super().visit_call_(call)
        if _is(call, REDUCTIONS):
            result = self._reduction(call, sink, strided)
        elif _is(call, _SOFTMAX):
            result = self._softmax(call, pays, sink)
        elif _is(call, _ELEMENT_WISE):
            result = self._sunk(call)
        else:
            return call
        if not result.same_as(call):
            self.origins[self.site] = self.site
        return result

    def _sunk(self, call: relax.Call) -> relax.Expr:
        """An element-wise op of a sink softmax's result transposed back
        (``transposed_back``) applied to the softmax's rows instead, its other tensor
        operands read through the same transpose, and transposed back after it: the
        transpose moves to the end of the chain, where it is the kernel's permuted write.
        Other calls unchanged."""
        found = [(a, self._alias_of(a)) for a in call.args if isinstance(a, relax.Var)]
        found = [(a, b) for a, b in found if b in self.transposed_back]
        if not found:
            return call
        arg, back = found[0]
        _, inverse, stem = self.transposed_back[back]
        if not _sinkable(call, arg, self.lookup_binding, self.outputs, {a for a, _ in found},
                         pushed=stem == "sunk"):
            return call
        perm = [inverse.index(a) for a in range(len(inverse))]
        out = _static_dims(call)
        sunk = dict(found)
        args = []
        for a in call.args:
            if a in sunk and self.transposed_back[sunk[a]][1] == inverse:
                view = self.transposed_back[sunk[a]][0]  # rows of the same transpose
            elif _static_dims(a) == []:  # a scalar
                view = a
            elif (a, tuple(perm)) in self.views:  # the softmax's own input: read once
                view = self.views[(a, tuple(perm))]
            else:
                view = self._view(a, out, perm, f"{stem}_operand")
            if view is None:
                return call
            args.append(view)
        if stem == "sunk":
            self.sunk.add(self.site)
        result = self._emit(relax.Call(call.op, args, call.attrs, call.ty_args),
                            name_hint=f"{stem}_rows")
        return self._transposed_back(result, [out[a] for a in perm], inverse, stem)

    def _alias_of(self, var: relax.Var) -> relax.Var:
        """The variable ``var`` is bound to, through bindings of one variable to another."""
        while var not in self.transposed_back:
            bound = self.lookup_binding(var)
            if not isinstance(bound, relax.Var):
                break
            var = bound
        return var

    def _transposed_back(self, rows: relax.Var, dims: list[int | None], inverse: list[int],
                         stem: str) -> relax.Var:
        """``rows`` (of extents ``dims``) transposed back by ``inverse``, recorded as a sink's
        result (``transposed_back``) whose made bindings are named after ``stem``."""
        back = self._emit(_permuted(rows, dims, inverse), name_hint=f"{stem}_back")
        self.transposed_back[back] = (rows, inverse, stem)
        return back

    def _view(self, data: relax.Expr, dims: list[int | None], perm: list[int],
              name: str) -> relax.Expr | None:
        """``data`` transposed by ``perm``: read through the transpose where that costs
        nothing more (``_read_through``), else the element-wise ops that made it applied to
        transposed views of their operands (TVM's fusion computes them inside the
        reduction; so does the stitched kernel, reading their inputs through the
        transposes); None when neither holds."""
        budget = [MAX_PUSHED]

        def pushed(expr: relax.Expr) -> relax.Expr | None:
            if _read_through(self.lookup_binding, expr, self.outputs):
                shape = _static_dims(expr)
                if shape is None:
                    return None
                if not shape:  # a scalar broadcasts in any order
                    return expr
                lead = [1] * (len(dims) - len(shape))
                if len(lead) + len(shape) != len(dims):
                    return None
                if lead:
                    expr = self._emit(
                        relax.op.reshape(expr, lead + list(expr.ty.shape)), name_hint=name)
                    return self._emit(_permuted(expr, lead + shape, perm),
                                              name_hint=name)
                return self._transposed(expr, shape, perm, name)
            bound = self.lookup_binding(expr) if isinstance(expr, relax.Var) else None
            if not (isinstance(bound, relax.Call) and _is(bound, _ELEMENT_WISE)) \
                    or budget[0] == 0:
                return None
            budget[0] -= 1
            args = [pushed(a) for a in bound.args]
            if any(a is None for a in args):
                return None
            return self._emit(relax.Call(bound.op, args, bound.attrs), name_hint=name)

        if _read_through(self.lookup_binding, data, self.outputs) \
                and _static_dims(data) == dims:
            return self._transposed(data, dims, perm, name)
        return pushed(data)  # a broadcast operand of fewer axes gets its leading ones there

    def _transposed(self, data: relax.Expr, dims: list[int | None], perm: list[int],
                    name: str) -> relax.Expr:
        """``data`` (of extents ``dims``) transposed by ``perm``, emitted. A transpose of a
        transpose is one transpose of its source, read through as the first was, and none
        when the two cancel: a softmax over a middle axis transposed back, then into a
        reduction over that axis (attention pooling), reads the softmax's rows as they are,
        where two transposes in a row left a kernel of their own between the two groups."""
        bound = self.lookup_binding(data) if isinstance(data, relax.Var) else None
        if isinstance(bound, relax.Call) and _is(bound, {"relax.permute_dims": None}) \
                and bound.attrs.axes is not None:
            source = bound.args[0]
            order = [int(a) % len(dims) for a in bound.attrs.axes]
            composed = [order[p] for p in perm]
            source_dims = _static_dims(source)
            if composed == sorted(composed):
                return source
            if source_dims is not None \
                    and _read_through(self.lookup_binding, source, self.outputs):
                return self._emit(_permuted(source, source_dims, composed),
                                          name_hint=name)
        return self._emit(_permuted(data, dims, perm), name_hint=name)

    def _reduction(self, call: relax.Call, sink: bool, strided: bool) -> relax.Expr:
        source = self._alias_of(call.args[0]) if isinstance(call.args[0], relax.Var) else None
        if source is not None and not source.same_as(call.args[0]):
            # a sunk chain's result, read through its alias
            call = self.builder_.normalize(relax.Call(call.op, [source, *call.args[1:]],
                                                      call.attrs, call.ty_args))
        data = call.args[0]
        dims = _static_dims(data)
        reduced = reduced_axes(call)
        if dims is None or reduced is None or _static_dims(call) is None:
            return call
        untransposed = None if sink else self._untransposed(call, dims, reduced)
        if untransposed is not None:
            return untransposed
        perm = reduction_permutation(dims, reduced) or (
            _column_permutation(dims, reduced) if strided else None)
        moved = None if perm is None else self._view(data, dims, perm, "reduce_view")
        if moved is None:
            return call
        axes = list(range(len(dims) - len(reduced), len(dims)))
        if sink:  # element-wise readers apply to the rows, the transpose back after them
            if isinstance(data, relax.Var):
                self.views[(data, tuple(perm))] = moved
            rows = self._emit(REDUCTIONS[call.op.name](moved, axis=axes, keepdims=True),
                              name_hint="reduced")
            inverse = [perm.index(a) for a in range(len(dims))]
            kept_dims = [1 if a in reduced else dims[a] for a in perm]
            self.sunk.add(self.site)
            return self._transposed_back(rows, kept_dims, inverse, "sunk")
        result = REDUCTIONS[call.op.name](moved, axis=axes, keepdims=False)
        if call.attrs.keepdims:
            return relax.op.reshape(self._emit(result, name_hint="reduced"),
                                    call.ty.shape)
        return result  # not emitted: it stays the binding of the reduction, not an alias

    def _untransposed(self, call: relax.Call, dims: list[int | None], reduced: list[int]
                      ) -> relax.Expr | None:
        """A reduction of a transpose that is not a row reduction but reduces trailing axes
        of the transpose's input, as that row reduction with its (smaller) result
        transposed; None for any other reduction. A column mean of ``x.T`` is the row mean
        of ``x`` (fuzz graph 4242:258: "column reduction reads in0 outside the row it
        reduces")."""
        bound = self.lookup_binding(call.args[0]) if isinstance(call.args[0], relax.Var) \
            else None
        if not (isinstance(bound, relax.Call) and _is(bound, {"relax.permute_dims": None})
                and bound.attrs.axes is not None):
            return None
        source = bound.args[0]
        source_dims = _static_dims(source)
        order = [int(a) % len(dims) for a in bound.attrs.axes]
        mapped = sorted(order[a] for a in reduced)
        if source_dims is None or None in source_dims or _trailing(dims, reduced) \
                or not _trailing(source_dims, mapped):
            return None
        rows = self._emit(REDUCTIONS[call.op.name](source, axis=mapped, keepdims=True),
                                  name_hint="reduced_rows")
        kept = [1 if a in mapped else d for a, d in enumerate(source_dims)]
        result = _permuted(rows, kept, order)
        if tvm_ffi.structural_equal(self.builder_.normalize(result).ty.shape, call.ty.shape):
            return result
        return relax.op.reshape(self._emit(result, name_hint="reduced"),
                                call.ty.shape)

    def _softmax(self, call: relax.Call, pays: bool, sink: bool) -> relax.Expr:
        """A softmax over a middle axis as one over the last axis of a transposed view,
        transposed back. Only where that saves more than the transpose back costs: the
        input is made by element-wise ops (they stitch into the softmax's kernel through
        the view, where TVM runs them as a kernel of their own), or ``pays``: a reduction
        over the same axis reads the result (the two transposes cancel), or no
        memory-intensive op does (the transpose back is the last op of the softmax's
        kernel, written in place: one kernel reading and writing each element once, in
        strided rows that a warp reads side by side, where TVM's kernel reads its input
        twice, each lane a sector of its own), or the transposes only move axes of extent 1
        (views). Else the transpose back would be a kernel of its own after the one TVM
        makes of the softmax (softmax over the channels of (2, 64, 256): 2 kernels and 1.25x
        TVM's bytes), and the softmax is left as it is."""
        data = call.args[0]
        dims = _static_dims(data)
        if dims is None:
            return call
        axis = int(call.attrs.axis) % len(dims)
        if axis == len(dims) - 1 or (all(d == 1 for d in dims[:axis])
                                     and not _few_rows(dims, axis)):
            return call  # a row softmax, or a column softmax of many rows (Global stitching)
        # with the axes after it (even of extent 1: the TIR then reduces an inner axis)
        perm = [a for a in range(len(dims)) if a != axis] + [axis]
        view = None not in dims and [a for a in perm if dims[a] != 1] == sorted(
            a for a in perm if dims[a] != 1)  # a reshape both ways (``_permuted``)
        if not (pays or view) and _read_through(self.lookup_binding, data, self.outputs):
            return call
        moved = self._view(data, dims, perm, "softmax_view")
        if moved is None:
            return call
        result = self._emit(_SOFTMAX[call.op.name](moved, axis=-1),
                                    name_hint="softmax_rows")
        inverse = [perm.index(a) for a in range(len(dims))]
        if sink:  # element-wise readers apply to the rows, the transpose back after them
            if isinstance(data, relax.Var):
                self.views[(data, tuple(perm))] = moved
            return self._transposed_back(result, [dims[a] for a in perm], inverse, "softmax")
        return _permuted(result, [dims[a] for a in perm], inverse)


def mixed_reductions(mod: IRModule, kept: frozenset[str] = frozenset(),
                     reduction_sinks: bool = True
                     ) -> tuple[IRModule, dict[str, str], frozenset[str]]:
    """``mod`` with every reduction over axes mixed with kept ones, and every softmax or
    log-softmax over a middle axis, in its Relax functions replaced by the same op over a
    transposed input, but for the bindings named in ``kept``; the *origin* of each
    binding the rewrite made or changed: the name of the binding it was rewritten for (a
    rewritten binding is its own); and the reductions that sank with their element-wise
    readers (``_sinks``; none without ``reduction_sinks``). The stitch flow keeps the
    bindings whose rewritten form does not stitch as they were imported
    (``stitch_fuse.stitch``)."""
    mutator = _MixedReduction(mod)
    mutator.kept = kept
    mutator.reduction_sinks = reduction_sinks
    mutator.origins = {}
    mutator.sunk = set()
    return (rewrite_functions(mutator, mod, relax.analysis.remove_all_unused),
            mutator.origins, frozenset(mutator.sunk))


__all__ = ["mixed_reductions", "reduction_permutation"]
