"""The row space of a stitched PrimFunc: which iterators of each block walk the rows.

A group shares one row space: ``rows`` tasks that each thread block (or warp) handles on its
own. Every block of the group iterates first over the rows (one or several leading spatial
iterators whose extents multiply to ``rows``), then over the elements of a row. An access
is *row-aligned* when it touches only the block's own row, however the buffer splits its
row dimensions (a reshape from ``(B*S, D)`` to ``(B, S, D)`` is still aligned): that is what
lets one thread block keep the row in shared memory and never look at another block's data.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from math import prod

import tvm
import tvm_ffi
from tvm import s_tir, tirx
from tvm.s_tir.schedule import SBlockRV
from tvm.sym import Analyzer

from ..symbolic import dim_value, is_symbolic, shape_values, substitute


class Unstitchable(Exception):
    """A group (or part of one) that the stitch schedule cannot handle; the message is the
    reason reported in the plan."""


class CrossRowRead(Unstitchable):
    """A block reads a value its kernel computes, at other rows than its own (a row
    minimum broadcast along the rows' own axis): no block has that value when it needs it.
    A kernel boundary between the two is the remedy (``stitch_fuse._broadcast_cut``)."""


def error_summary(err: Exception) -> str:
    """The line of a (TVM) error message that says what went wrong, for a plan's reason."""
    lines = [ln.strip() for ln in str(err).splitlines() if ln.strip()]
    message = next((ln for ln in reversed(lines) if "Error" in ln or "error" in ln),
                   lines[-1] if lines else type(err).__name__)
    return message[:300]


@dataclass(frozen=True)
class Iter:
    """A block iterator: its variable, kind (``S`` spatial or ``R`` reduction) and extent
    (a symbolic one's stand-in, see ``tvm_stitch.symbolic``; ``size`` is the real one)."""

    var: tvm.ir.Var
    kind: str
    extent: int
    size: tvm.ir.PrimExpr


@dataclass(frozen=True)
class BlockRows:
    """A block split into row iterators (the first ``num_row_iters``) and element iterators."""

    name: str
    iters: tuple[Iter, ...]
    num_row_iters: int

    @property
    def row_iters(self) -> tuple[Iter, ...]:
        """The iterators over rows."""
        return self.iters[: self.num_row_iters]

    @property
    def element_iters(self) -> tuple[Iter, ...]:
        """The iterators inside a row."""
        return self.iters[self.num_row_iters:]

    @property
    def elements(self) -> int:
        """Elements of one row this block visits."""
        return prod(i.extent for i in self.element_iters)

    @property
    def is_reduction(self) -> bool:
        """Whether the block reduces (a reduction block)."""
        return any(i.kind == "R" for i in self.iters)


def iters_of(sch: s_tir.Schedule, block: SBlockRV) -> tuple[Iter, ...]:
    """The iterators of ``block``; raises Unstitchable on an extent without a value
    (``dim_value``) or an opaque kind."""
    stmt = sch.get(block)
    out = []
    for iv in stmt.iter_vars:
        extent = dim_value(iv.dom.extent)
        if extent is None:
            raise Unstitchable(f"block {stmt.name_hint} has an extent that is not a product "
                               "of shape variables")
        if iv.iter_type == tirx.IterVar.DataPar:
            kind = "S"
        elif iv.iter_type == tirx.IterVar.CommReduce:
            kind = "R"
        else:
            raise Unstitchable(f"block {stmt.name_hint} has an opaque iterator")
        out.append(Iter(iv.var, kind, extent, iv.dom.extent))
    return tuple(out)


def prefix_split(extents: list[int], rows: int) -> int | None:
    """Largest ``k`` with ``prod(extents[:k]) == rows`` (trailing unit extents included)."""
    best = None
    size = 1
    if rows == 1:
        best = 0
    for k, e in enumerate(extents, start=1):
        size *= e
        if size == rows:
            best = k
        elif size > rows:
            break
    return best


def block_rows(sch: s_tir.Schedule, block: SBlockRV, rows: int) -> BlockRows:
    """Split ``block``'s iterators into rows and elements, or raise Unstitchable."""
    name = sch.get(block).name_hint
    iters = iters_of(sch, block)
    k = prefix_split([i.extent for i in iters], rows)
    if k is None or any(i.kind != "S" for i in iters[:k]):
        raise Unstitchable(f"block {name} does not iterate over the {rows} rows first")
    info = BlockRows(name, iters, k)
    if info.is_reduction and any(i.kind == "S" and i.extent > 1 for i in info.element_iters):
        raise Unstitchable(f"block {name} keeps a spatial axis inside its reduction")
    return info


def _range(it: Iter) -> tvm.ir.Range:
    """An iterator's domain, from 0."""
    return tvm.ir.Range(tirx.IntImm(it.var.ty.dtype, 0), it.size.astype(it.var.ty.dtype))


def _bound(info: BlockRows) -> Analyzer:
    """An analyzer that knows the domains of ``info``'s iterators."""
    ana = Analyzer()
    for it in info.iters:
        ana.bind(it.var, _range(it))
    return ana


def _row_index(exprs: list[tvm.ir.PrimExpr], extents: list[tvm.ir.PrimExpr]
               ) -> tvm.ir.PrimExpr | None:
    if not exprs:
        return None
    index = exprs[0]
    for e, n in zip(exprs[1:], extents[1:], strict=True):
        index = index * n.astype(index.ty.dtype) + e
    return index


def _has_load(expr: tvm.ir.PrimExpr) -> bool:
    found = []
    tvm_ffi.structural_walk(expr, [(tvm.ir.TensorLoad, found.append)])
    return bool(found)


class RowAccess(StrEnum):
    """How an access of a row block touches the rows of its buffer."""

    ALIGNED = "aligned"  # its own row only
    INDEPENDENT = "independent"  # the same data for every row (a bias)
    OTHER = "other"  # other rows, or rows it cannot tell


def access_rows(info: BlockRows, region: tvm.ir.TensorRegion, rows: int) -> RowAccess:
    """How an access of ``info``'s block touches rows (``RowAccess``).

    Data-dependent indices (a gather) are allowed inside the row, not in the row dimensions.
    """
    shape = shape_values(region.source.shape)
    if shape is None:
        return RowAccess.OTHER
    row_vars = [i.var for i in info.row_iters]
    dims = list(region.region)
    dependent = [_has_load(r.min) or _has_load(r.extent) for r in dims]
    uses_rows = any(_uses_any(r.min, row_vars) or _uses_any(r.extent, row_vars) for r in dims)
    if not uses_rows and not any(dependent):
        return RowAccess.ALIGNED if rows == 1 else RowAccess.INDEPENDENT
    kb = prefix_split(shape, rows)
    if not kb and not any(dependent):
        return _flat_row_access(info, dims, shape, rows)
    if not kb or any(dependent[:kb]):
        return RowAccess.OTHER
    ana = _bound(info)
    if not all(ana.can_prove_equal(r.extent, 1) for r in dims[:kb]):
        return RowAccess.OTHER
    mine = _row_index(row_vars, [i.size for i in info.row_iters])
    theirs = _row_index([r.min for r in dims[:kb]], list(region.source.shape)[:kb])
    if mine is None or not ana.can_prove_equal(theirs, mine):
        return RowAccess.OTHER
    # a row iterator of extent 1 is 0 wherever it appears (a transpose that moves unit axes);
    # simplified, ``(g * 8 + c) % 8`` is ``c`` (a channel iterator split into rows, ``rows_first``)
    moving = [i.var for i in info.row_iters if i.extent != 1]
    if any(not dep and _uses_any(ana.simplify(r.min), moving)
           for r, dep in zip(dims[kb:], dependent[kb:], strict=True)):
        return RowAccess.OTHER
    return RowAccess.ALIGNED


def _flat_row_access(info: BlockRows, dims: list[tvm.ir.Range], shape: list[int],
                     rows: int) -> RowAccess:
    """``access_rows`` of point accesses to a buffer whose shape splits into no prefix of
    ``rows`` rows (a group normalisation's (B, C, H, W) output in rows of (B, G)): aligned
    when, counted row-major, every element it touches lies in the block's own row of
    ``size / rows`` elements."""
    size = prod(shape)
    ana = _bound(info)
    if is_symbolic(size) or is_symbolic(rows) or size % rows \
            or not all(ana.can_prove_equal(r.extent, 1) for r in dims):
        return RowAccess.OTHER
    mine = _row_index([i.var for i in info.row_iters], [i.size for i in info.row_iters])
    flat = _row_index([r.min for r in dims], [tirx.IntImm("int64", n) for n in shape])
    if mine is None or flat is None:
        return RowAccess.OTHER
    length = tirx.IntImm(flat.ty.dtype, size // rows)
    if ana.can_prove_equal(tirx.floordiv(flat, length), mine.astype(flat.ty.dtype)):
        return RowAccess.ALIGNED
    return RowAccess.OTHER


def permuted_row(info: BlockRows, region: tvm.ir.TensorRegion, rows: int) -> bool:
    """Whether the access touches one row of its buffer that is a one-to-one function of the
    block's row (a layout move of whole rows, ``row_permutation``): the row indices use the
    row iterators only and map them onto the buffer's rows bijectively, and the element
    indices do not use them. Each row of the buffer is then its own row's alone."""
    shape = shape_values(region.source.shape)
    kb = prefix_split(shape, rows) if shape is not None else None
    dims = list(region.region)
    row_vars = [i.var for i in info.row_iters]
    if not kb or any(_has_load(r.min) for r in dims) \
            or any(_uses_any(r.min, row_vars) or _uses_any(r.extent, row_vars)
                   for r in dims[kb:]):
        return False
    domain = {i.var: _range(i) for i in info.row_iters}
    ana = _bound(info)
    if not all(ana.can_prove_equal(r.extent, 1) for r in dims[:kb]):
        return False
    index = _row_index([r.min for r in dims[:kb]], list(region.source.shape)[:kb])
    mapped = tvm.sym.detect_iter_map([index], domain, check_level="bijective",
                                     analyzer=Analyzer())
    return len(mapped.indices) == 1


def same_permuted_rows(accesses: list[tuple[BlockRows, tvm.ir.TensorRegion]], rows: int
                       ) -> bool:
    """Whether the accesses (each ``permuted_row``) all read, at each row of the group, the
    same row of their buffer: a staged copy of one row serves them all. An input read
    transposed by one block and as it is by another (fuzz graph 10007:419, ``x[j, i]`` and
    ``x[i, j]`` at row ``(i, j)``) is read at two rows. Each block's row is its row
    iterators counted row-major, the group's row ``r``; unproven counts as different."""
    group_row = tvm.ir.Var("r", "int64")
    found: list[tvm.ir.PrimExpr] = []
    for info, region in accesses:
        shape = shape_values(region.source.shape)
        kb = prefix_split(shape, rows) if shape is not None else None
        if not kb:
            return False
        index = _row_index([r.min for r in list(region.region)[:kb]],
                           list(region.source.shape)[:kb])
        stride, at = 1, {}
        for it in reversed(info.row_iters):
            at[it.var] = (group_row // stride % it.extent).astype(it.var.ty.dtype)
            stride *= it.extent
        found.append(substitute(index, at).astype("int64"))
    ana = Analyzer()
    ana.bind(group_row, tvm.ir.Range(tirx.IntImm("int64", 0), tirx.IntImm("int64", rows)))
    return all(ana.can_prove_equal(found[0], other) for other in found[1:])


def permuted_elements(info: BlockRows, region: tvm.ir.TensorRegion) -> bool:
    """Whether the access touches one element of its buffer per point of the block, a
    one-to-one function of all the block's iterators (a transpose back written from the
    rows it transposes: ``y[b, t, e]`` from the rows ``(b, e)`` of elements ``t``). Each
    element of the buffer is then its own point's alone, wherever its row lies."""
    dims = list(region.region)
    ana = _bound(info)
    if not dims or any(_has_load(r.min) for r in dims) \
            or not all(ana.can_prove_equal(r.extent, 1) for r in dims):
        return False
    domain = {i.var: _range(i) for i in info.iters}
    index = _row_index([r.min for r in dims], list(region.source.shape))
    mapped = tvm.sym.detect_iter_map([index], domain, check_level="bijective",
                                     analyzer=Analyzer())
    return len(mapped.indices) == 1


def reads_own_element(info: BlockRows, region: tvm.ir.TensorRegion, rows: int) -> bool:
    """Whether the access reads, in its own row, exactly the element the block is at (both
    counted row-major), as ``x[i, k]`` in a block over ``(i, k)`` does: a thread that walks
    the block's elements then reads only those."""
    shape = shape_values(region.source.shape)
    kb = prefix_split(shape, rows) if shape is not None else None
    if not kb or access_rows(info, region, rows) is not RowAccess.ALIGNED \
            or prod(shape[kb:]) != info.elements:
        return False
    dims = list(region.region)[kb:]
    ana = _bound(info)
    if not all(ana.can_prove_equal(r.extent, 1) for r in dims):
        return False
    theirs = _row_index([r.min for r in dims], list(region.source.shape)[kb:])
    mine = _row_index([i.var for i in info.element_iters],
                      [i.size for i in info.element_iters])
    if theirs is None or mine is None:
        return theirs is mine
    if theirs.ty.dtype != mine.ty.dtype:
        theirs = tirx.Cast(str(mine.ty.dtype), theirs)
    return ana.can_prove_equal(theirs, mine)


def reads_one_per_row(info: BlockRows, region: tvm.ir.TensorRegion, rows: int) -> bool:
    """Whether the access reads one element at a place that depends on no element of the
    row (a row's mean or scale, ``rstd[i]`` in a block over ``(i, k)``, or a scalar): a
    thread's steps along the row all read that element, which it keeps in one register."""
    dims = list(region.region)
    elements = [i.var for i in info.element_iters]
    return access_rows(info, region, rows) is not RowAccess.OTHER \
        and all(_bound(info).can_prove_equal(r.extent, 1) and not _has_load(r.min)
                and not _uses_any(r.min, elements) for r in dims)


def reads_own_position(info: BlockRows, region: tvm.ir.TensorRegion) -> bool:
    """Whether the access reads one element at the block's own position, both counted
    row-major over the whole buffer and the whole iteration space: ``x[r // 4, r % 4 * 600
    + e]`` in a block over the 600-element sub-rows ``(r, e)`` of rows of 2400 does. The
    block then reads the buffer as a view of its own rows, whatever the buffer's shape."""
    dims = list(region.region)
    shape = list(region.source.shape)
    ana = _bound(info)
    if not dims or any(_has_load(r.min) for r in dims) \
            or not all(ana.can_prove_equal(r.extent, 1) for r in dims):
        return False
    theirs = _row_index([r.min for r in dims], shape)
    mine = _row_index([i.var for i in info.iters], [i.size for i in info.iters])
    if theirs.ty.dtype != mine.ty.dtype:
        theirs = tirx.Cast(str(mine.ty.dtype), theirs)
    return ana.can_prove_equal(theirs, mine)


def address_strides(info: BlockRows, region: tvm.ir.TensorRegion
                    ) -> tuple[int | None, int | None]:
    """How far apart, in elements of its buffer (counted row-major), a point access of
    ``info``'s block lands when the block's innermost row iterator of more than one value
    steps by one, and when its innermost such element iterator does: (row stride, element
    stride), 0 where the access does not move with that iterator (or there is none), None
    where the stride is no constant or the access is not a point. ``x[b, t, e]`` read by a
    block over the rows ``(b, e)`` and the elements ``t`` of ``(B, T, E)`` moves by 1 with
    the row and by ``E`` with the element: a strided row."""
    dims = list(region.region)
    ana = _bound(info)
    shape = list(region.source.shape)
    if not dims or any(_has_load(r.min) for r in dims) \
            or not all(ana.can_prove_equal(r.extent, 1) for r in dims):
        return None, None
    address = _row_index([r.min for r in dims], shape)

    def stride(iters: tuple[Iter, ...]) -> int | None:
        moving = [i.var for i in iters if i.extent != 1]
        if not moving:
            return 0
        var = moving[-1]
        step = ana.simplify(substitute(address, {var: var + 1}) - address)
        return int(step) if isinstance(step, tirx.IntImm) else None

    return stride(info.row_iters), stride(info.element_iters)


def rows_sharing(info: BlockRows, region: tvm.ir.TensorRegion) -> int:
    """How many consecutive rows (in aligned runs) read the same data through this access:
    all of them for data that does not depend on the row (a bias), the product of the inner
    row dimensions for data indexed by outer ones only (a mask per batch), 1 otherwise."""
    dims = list(region.region)
    if any(_has_load(r.min) or _has_load(r.extent) for r in dims):
        return 1
    used = [p for p, it in enumerate(info.row_iters)
            if any(_uses_any(r.min, [it.var]) or _uses_any(r.extent, [it.var]) for r in dims)]
    inner = info.row_iters[max(used) + 1:] if used else info.row_iters
    return prod(i.extent for i in inner)


def _uses_any(expr: tvm.ir.PrimExpr, variables: list[tvm.ir.Var]) -> bool:
    found: list[tvm.ir.Var] = []
    tvm_ffi.structural_walk(expr, [(tvm.ir.Var, found.append)])
    return any(f.same_as(v) for f in found for v in variables)


def row_elements(buffer: tirx.Buffer, rows: int) -> int:
    """Elements per row of a buffer laid out as ``rows`` rows (its size if it has no rows)."""
    shape = list(shape_values(buffer.shape) or [])
    kb = prefix_split(shape, rows)
    return prod(shape[kb:]) if kb else prod(shape)


def row_element_map(row_pos: list[int], row_extents: list[tvm.ir.PrimExpr | int],
                     elem_pos: list[int], elem_extents: list[tvm.ir.PrimExpr | int]):
    """Index map from a block's iterators to (linear row, linear element): the iterators at
    ``row_pos`` (extents ``row_extents``) form the row, those at ``elem_pos`` the element; a
    missing part becomes the constant 0."""

    def index_map(*vs):
        zero = tirx.IntImm(vs[0].ty.dtype, 0) if vs else 0
        row = _linear([vs[p] for p in row_pos], row_extents) if row_pos else zero
        elem = _linear([vs[p] for p in elem_pos], elem_extents) if elem_pos else zero
        return [row, elem]

    return index_map


def _linear(vs: list, extents: list[tvm.ir.PrimExpr | int]):
    index = vs[0]
    for v, n in zip(vs[1:], extents[1:], strict=True):
        index = index * n + v
    return index
