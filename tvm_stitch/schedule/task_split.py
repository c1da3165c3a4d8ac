"""Task splitting (AStitch section 4.3): few long rows, each split over several thread blocks.

With fewer rows than the GPU has SMs, a block per row leaves most of the GPU idle. Task
splitting cuts every row into ``parts`` sub-rows of equal length and maps those as the rows
of the kernel, so ``rows x parts`` blocks share the work. A reduction over a row becomes a
reduction over each sub-row (a partial result per sub-row, ``rfactor`` over the parts) and a
combination of the ``parts`` partials of each row (a *combine* block, marked with
``COMBINE_ATTR``), which needs the partials of other blocks: Global stitching, a grid barrier
before the combination. So a split group is a Global group over ``rows x parts`` sub-rows
(``tvm_stitch.schedule.phases``). Where row blocks alone read a combination, every block
makes it for its own row after that barrier (``combine_per_reader``): a few partials read
again, rather than a column phase that makes it once and a second grid barrier before the
sub-rows read it.

``split_rows`` rewrites the blocks of a row group that is in (row, element) form
(``layout.flatten_rows``): element-wise blocks and the intermediates they write move to
(sub-row, element-in-part) layouts, reductions are factored, blocks with one value per row
stay as they are (they become column-space blocks of the combined results).
"""

from __future__ import annotations

from math import prod

import tvm
import tvm_ffi
from tvm import s_tir, tirx

from .blocks import child_blocks, name_of, readers, simplified_accesses, simplified_block
from .layout import flatten_rows
from .persistent import blocks_in, root_statements, with_root
from .rows import Unstitchable, block_rows

COMBINE_ATTR = "stitch.combine"
"""Block annotation of the combination of a split reduction's partials."""


def split_rows(sch: s_tir.Schedule, func: tirx.PrimFunc, rows: int, parts: int) -> None:
    """Rewrite the row group scheduled by ``sch`` (over ``rows`` rows) to ``rows x parts``
    sub-rows; raises Unstitchable when a block's row does not split into ``parts``."""
    flatten_rows(sch, rows, [])
    params = {p.name for p in func.params}
    plans = []
    for block in child_blocks(sch):
        info = block_rows(sch, block, rows)
        length = info.elements
        if length == 1:
            continue
        if length % parts:
            raise Unstitchable(f"block {info.name}: rows of {length} elements do not split "
                               f"into {parts} parts")
        plans.append((info.name, info.is_reduction, length // parts))
    for name, reduction, chunk in plans:
        if not reduction:
            _split_writes(sch, sch.get_sblock(name), params, rows, parts, chunk)
    for name, reduction, chunk in plans:
        block = sch.get_sblock(name)
        if reduction:
            _split_reduction(sch, block, parts, chunk)
        else:
            sch.transform_block_layout(block, _sub_rows(parts, chunk, block, sch))
    for block in child_blocks(sch):
        _simplify(sch, block)


def _simplify(sch: s_tir.Schedule, block: s_tir.schedule.SBlockRV) -> None:
    """``block``'s accesses simplified with its domain (``blocks.simplified_block``): the
    composed sub-row layouts leave ``x[(v0 * 600 + v1) // 600, (v0 * 600 + v1) % 600]``,
    whose region TVM cannot bound to the sub-row, and it then kept the whole row of ``x``
    in each block's shared memory (fuzz graph 8111:1241, 60000 B for a planned 1200); nor
    does a block storing there inline (8111:467)."""
    old = sch.get(block)
    new = simplified_block(old)
    if not new.same_as(old):
        sch.state.replace(sch.get_sref(block), new, {old: new})


def split_output_copies(sch: s_tir.Schedule, outputs: list[str], rows: int,
                        parts: int) -> None:
    """Lay out as sub-rows the on-chip copies of the split group's ``outputs`` that blocks
    inside read (``blocks.cache_reused_outputs`` after ``split_rows``): the copy written by
    the output's producer, and the block writing it out, which iterates the output's shape.
    The producer's accesses are simplified with its domain (the composed layouts store a
    sub-row's element at ``(v0 * 3136 + v1) // 301056 * 96 + (v1 // 3136 + v0) % 96``, which
    is ``v0``): a producer read after a grid barrier is recomputed there, and only a block
    storing at its own iterators can be (fuzz graph 8111:467 was not split)."""
    for name in outputs:
        (copy_out,) = [b for b in child_blocks(sch)
                       if any(w.source.name == name for w in sch.get(b).writes)]
        cached = sch.get(copy_out).reads[0].source
        (producer,) = [b for b in child_blocks(sch)
                       if any(w.source.same_as(cached) for w in sch.get(b).writes)]
        shape = [int(d) for d in cached.shape]
        length = prod(shape) // rows
        if length % parts:
            raise Unstitchable(f"output {name}: rows of {length} elements do not split into "
                               f"{parts} parts")
        _split_writes(sch, producer, set(), rows, parts, length // parts)
        _simplify(sch, producer)
        _as_sub_rows(sch, copy_out, shape, rows, parts)


def split_input_copies(sch: s_tir.Schedule, inputs: list[str], rows: int, parts: int
                       ) -> list[str]:
    """Lay out as sub-rows the shared copies of the split group's ``inputs`` (staged after
    ``split_rows``, each read by its copy block alone): the copy, and the copy block, which
    iterates the input's shape; returns the copy blocks' names. Every access to a copy is
    simplified with its block's domain: the composed layouts of a row of several dims (a
    group normalisation's channels) are otherwise too tangled for TVM to see that a reader
    reads its own sub-row, and ``compute_at`` refuses the scope as no stage pipeline."""
    names = []
    for name in inputs:
        (copy,) = [b for b in child_blocks(sch)
                   if any(r.source.name == name for r in sch.get(b).reads)]
        shape = [int(d) for d in sch.get(copy).reads[0].source.shape]
        length = prod(shape) // rows
        _split_writes(sch, copy, set(), rows, parts, length // parts)
        _as_sub_rows(sch, copy, shape, rows, parts)
        names.append(name_of(sch, copy))
    copies = {w.source.name for n in names for w in sch.get(sch.get_sblock(n)).writes}
    for block in child_blocks(sch):  # the composed layouts, plain again within each domain
        old = sch.get(block)
        if any(r.source.name in copies for r in old.reads) or name_of(sch, block) in names:
            new = simplified_block(old, lambda _, buffer: buffer.name in copies,
                                   writes=name_of(sch, block) in names)
            sch.state.replace(sch.get_sref(block), new, {old: new})
    return names


def _as_sub_rows(sch: s_tir.Schedule, block: s_tir.schedule.SBlockRV, shape: list[int],
                 rows: int, parts: int) -> None:
    """``block``, which iterates a buffer of ``shape`` (``rows`` rows), over its sub-rows."""
    length = prod(shape) // rows
    if shape != [rows, length]:
        sch.transform_block_layout(block, _as_rows(shape, length, block, sch))
    sch.transform_block_layout(block, _sub_rows(parts, length // parts, block, sch))


def _index_dtype(sch: s_tir.Schedule, block: s_tir.schedule.SBlockRV) -> str:
    return str(sch.get(block).iter_vars[0].var.ty.dtype)


def _sub_rows(parts: int, chunk: int, block: s_tir.schedule.SBlockRV,
              sch: s_tir.Schedule) -> tirx.IndexMap:
    """(row, element) -> (row x parts + element // chunk, element % chunk)."""
    return tirx.IndexMap.from_func(lambda r, e: [r * parts + e // chunk, e % chunk], ndim=2,
                                   index_dtype=_index_dtype(sch, block))


def _split_writes(sch: s_tir.Schedule, block: s_tir.schedule.SBlockRV, params: set[str],
                  rows: int, parts: int, chunk: int) -> None:
    """Lay the intermediates ``block`` writes (``rows`` rows of ``chunk x parts`` elements,
    row-major in whatever shape) out as sub-rows."""
    for index, region in enumerate(sch.get(block).writes):
        buf = region.source
        if buf.name in params:
            continue
        shape = [int(d) for d in buf.shape]
        if prod(shape) != rows * chunk * parts:
            raise Unstitchable(f"intermediate {buf.name} {shape} is not laid out as "
                               f"{rows} rows of {chunk * parts}")
        if shape != [rows, chunk * parts]:  # row-major as (row, element) first: tight regions
            sch.transform_layout(block, ("write", index),
                                 _as_rows(shape, chunk * parts, block, sch))
        sch.transform_layout(block, ("write", index), _sub_rows(parts, chunk, block, sch))


def _as_rows(shape: list[int], length: int, block: s_tir.schedule.SBlockRV,
             sch: s_tir.Schedule) -> tirx.IndexMap:
    """An index of ``shape`` -> (row, element) of its row-major position in rows of
    ``length``."""
    def as_rows(*index):
        flat = index[0]
        for i, n in zip(index[1:], shape[1:], strict=True):
            flat = flat * n + i
        return [flat // length, flat % length]
    return tirx.IndexMap.from_func(as_rows, ndim=len(shape), index_dtype=_index_dtype(sch, block))


def _split_reduction(sch: s_tir.Schedule, block: s_tir.schedule.SBlockRV, parts: int,
                     chunk: int) -> None:
    """A row reduction as a reduction per sub-row (its partial, laid out rows x parts) and
    the combination of each row's partials, marked with ``COMBINE_ATTR``."""
    _, elem = sch.get_loops(block)
    part, _ = sch.split(elem, [parts, chunk])
    result = sch.get(block).writes[0].source
    partial = sch.rfactor(part, min(1, len(result.shape)))  # partials: rows x parts
    # rfactor puts the factored iterator first: partial (part, row | element), and the
    # combination (part | row), which is already (reduced, kept) as a column combination
    kinds = [(int(iv.iter_type), int(iv.dom.extent)) for iv in sch.get(partial).iter_vars]
    if [k for k, _ in kinds] != [tirx.IterVar.DataPar, tirx.IterVar.DataPar,
                                 tirx.IterVar.CommReduce] or kinds[0][1] != parts:
        raise Unstitchable(f"unexpected iterators {kinds} after factoring "
                           f"{sch.get(block).name_hint}")
    row_loop, part_loop, _ = sch.get_loops(partial)
    sch.reorder(part_loop, row_loop)  # loops in the order of the iterators they bind
    sch.transform_block_layout(partial, tirx.IndexMap.from_func(
        lambda p, r, e: [r * parts + p, e], ndim=3, index_dtype=_index_dtype(sch, partial)))
    row_loop, part_loop = sch.get_loops(block)
    sch.reorder(part_loop, row_loop)  # (part, row): the loops of a column combination
    sch.annotate(block, COMBINE_ATTR, 1)


def combine_per_reader(sch: s_tir.Schedule, func: tirx.PrimFunc) -> s_tir.Schedule:
    """A schedule of ``sch``'s function (scheduling ``func``) where every block that reads a
    combination of partials reads a copy of its own: the combine block recomputed into a
    buffer of that reader's (the original kept for its first reader, or as the output it
    writes); ``sch`` itself when there is no combination.

    Meant after inlining, which can give a combination more readers (softmax's maximum, read
    by the exponential inlined into both the sum and the division). A combination read by
    row blocks alone is then made where they run (the row phase after the partials',
    ``phases.assign_roles``), and no phase of its own has to write it for the others: a few
    partials read again instead of a phase and a grid barrier. Every reader's index into a
    combination is simplified with its block's domain (``_plain_reads``).
    """
    combines = [b for b in child_blocks(sch) if is_combine(sch, b)]
    if not combines:
        return sch
    params = {p.name for p in func.params}
    func = sch.mod["main"]
    nests = root_statements(func)
    allocs = list(func.body.block.alloc_buffers)
    names = set()  # of the combinations and their copies
    for block in combines:
        results = [w.source for w in sch.get(block).writes]  # two for an online softmax
        names.update(r.name for r in results)
        users = list(dict.fromkeys(name_of(sch, u) for r in results
                                   for u in readers(sch, r, exclude=block)))
        (nest,) = [n for n in nests if name_of(sch, block) in blocks_in(n)]
        for user in users if any(r.name in params for r in results) else users[1:]:
            # layout=None as TVM's own buffers: decl_buffer's default TileLayout makes a
            # one-element buffer a scalar, which TVMScript prints as ``X.source[0]`` and cannot
            # parse back (the SIMT runner's float16 retyping; fuzz graph 4242:1236)
            copies = {r: tirx.decl_buffer(r.shape, r.dtype, f"{r.name}_{user}",
                                          scope=r.scope(), layout=None) for r in results}
            allocs.extend(copies.values())
            names.update(c.name for c in copies.values())
            nests.insert(nests.index(nest), _renamed(_with_buffers(nest, copies), f"_{user}"))
            at = next(i for i, n in enumerate(nests) if user in blocks_in(n))
            nests[at] = _with_buffers(nests[at], copies)
    nests = [_plain_reads(n, names) for n in nests]
    return s_tir.Schedule(with_root(func, body=tirx.stmt_seq(*nests), alloc_buffers=allocs))


def _plain_reads(stmt: tirx.Stmt, buffers: set[str]) -> tirx.Stmt:
    """``stmt`` with the indices its blocks read ``buffers`` (by name) at simplified with the
    blocks' domains: an inlined producer's composition of layouts, such as
    ``(e // 600 + s % 5) // 5 + s // 5``, is the plain row ``s // 5`` again, so that a
    combination computed at the reader's row (``compute_at``) is that one row. Not what the
    block writes itself: a combination's update must load where it stores (a row of one
    element: ``sum[v] = sum[0] + ...`` matched no reducer, fuzz 4242:1223)."""
    return simplified_accesses(
        stmt, lambda block, buffer: buffer.name in buffers
        and all(w.source.name != buffer.name for w in block.writes), writes=False)


def _with_buffers(stmt: tirx.Stmt, new: dict[tirx.Buffer, tirx.Buffer]) -> tirx.Stmt:
    """``stmt`` with every use of a buffer of ``new`` replaced by its value there."""
    return tvm_ffi.structural_map(stmt, [(tirx.Buffer, lambda b: next(
        (n for o, n in new.items() if b.same_as(o)), b))])


def _renamed(stmt: tirx.Stmt, suffix: str) -> tirx.Stmt:
    """A copy of ``stmt`` (a loop nest) with fresh loop and block variables and ``suffix``
    added to the names of its blocks, so that it can sit next to the original."""
    fresh: dict[tvm.ir.Var, tvm.ir.Var] = {}

    def define(var: tvm.ir.Var) -> None:
        fresh.setdefault(var, tvm.ir.Var(var.name, var.ty))

    def on_block(block: s_tir.stmt.SBlock) -> s_tir.stmt.SBlock:
        return s_tir.stmt.SBlock(block.iter_vars, block.reads, block.writes,
                                 block.name_hint + suffix, block.body, block.init,
                                 block.alloc_buffers, block.match_buffers, block.annotations)

    tvm_ffi.structural_walk(stmt, [(tirx.For, lambda f: define(f.loop_var)),
                                   (tirx.IterVar, lambda iv: define(iv.var))])
    stmt = tvm_ffi.structural_map(stmt, [(tvm.ir.Var, lambda v: fresh.get(v, v))])
    return tvm_ffi.structural_map(stmt, [(s_tir.stmt.SBlock, on_block)])


def is_combine(sch: s_tir.Schedule, block: s_tir.schedule.SBlockRV) -> bool:
    """Whether ``block`` combines the partials of a split reduction."""
    annotations = sch.get(block).annotations
    return annotations is not None and COMBINE_ATTR in annotations


def split_options(rows: int, length: int, wave: int, threads: int,
                  shapes: tuple[tuple[int, ...], ...] = ()) -> list[int]:
    """Every number of parts per row task splitting may take, ascending: sub-rows that fit
    one ``wave`` of blocks, each at least ``threads`` elements long (a divisor of
    ``length``) and a box of every row shape of ``shapes`` (``aligned_part``), as
    ``split_rows`` needs each to split."""
    return [parts for parts in range(2, length // threads + 1)
            if length % parts == 0 and rows * parts <= wave
            and all(prod(shape) % parts == 0 and aligned_part(prod(shape) // parts, shape)
                    for shape in shapes)]


def aligned_part(chunk: int, shape: tuple[int, ...]) -> bool:
    """Whether consecutive ``chunk`` elements of a row of ``shape`` (row-major) make a box:
    whole trailing dims times a divisor of the dim before them. Only then do a sub-row's
    accesses cover a box TVM's region analysis can bound; a sub-row of two and a half
    channels of a group normalisation's (C / G, H, W) is staged as the whole row."""
    inner = 1
    for extent in reversed(shape):
        if chunk <= inner * extent:
            return chunk % inner == 0 and extent % (chunk // inner) == 0
        inner *= extent
    return chunk % inner == 0


__all__ = ["COMBINE_ATTR", "split_rows", "combine_per_reader", "is_combine", "split_options",
           "aligned_part"]
