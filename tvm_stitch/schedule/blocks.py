"""Queries and preparation steps on the blocks of a fused PrimFunc, shared by the decisions
(``decisions``) and the emission (``emit``) of a stitched kernel: who reads and writes which
buffer, how often, and the normalisations both run first so that they see the same blocks."""

from __future__ import annotations

from collections.abc import Callable

import tvm
import tvm_ffi
from tvm import s_tir, tirx
from tvm.s_tir.dlight.analysis import get_root_block
from tvm.s_tir.schedule import SBlockRV
from tvm.sym import Analyzer

from ..plan import StorageLevel
from ..transform.online_softmax import with_online_softmax
from ..transform.online_variance import with_online_variance
from .rows import Unstitchable

SHARED = "shared"
LOCAL = "local"
SCOPES = {StorageLevel.SHARED: SHARED, StorageLevel.REGISTER: LOCAL}
"""TIR storage scope of each on-chip level of the plan."""


def child_blocks(sch: s_tir.Schedule) -> list[SBlockRV]:
    """The blocks directly under the root block, in program order."""
    return list(sch.get_child_blocks(get_root_block(sch)))


def name_of(sch: s_tir.Schedule, block: SBlockRV) -> str:
    """The name of ``block``."""
    return sch.get(block).name_hint


def readers(sch: s_tir.Schedule, buffer: tirx.Buffer, exclude: SBlockRV | None = None,
            affine: bool = False) -> list[SBlockRV]:
    """Blocks under the root that read ``buffer``; with ``affine``, only those whose indices
    into it do not depend on loaded data (a gather's reads cannot be staged: the region it
    needs is unknown)."""
    out = []
    for b in child_blocks(sch):
        if exclude is not None and sch.get(b).same_as(sch.get(exclude)):
            continue
        regions = [r for r in sch.get(b).reads if r.source.same_as(buffer)]
        if regions and not (affine and any(data_dependent(r) for r in regions)):
            out.append(b)
    return out


def data_dependent(region: tvm.ir.TensorRegion) -> bool:
    """Whether the region's bounds depend on loaded data (a gather's access)."""
    found: list[tvm.ir.TensorLoad] = []
    for r in region.region:
        tvm_ffi.structural_walk(r.min, [(tvm.ir.TensorLoad, found.append)])
        tvm_ffi.structural_walk(r.extent, [(tvm.ir.TensorLoad, found.append)])
    return bool(found)


def writer(sch: s_tir.Schedule, buffer_name: str) -> tuple[SBlockRV, int]:
    """The block that writes the buffer named ``buffer_name`` and the index of that write."""
    for b in child_blocks(sch):
        for i, w in enumerate(sch.get(b).writes):
            if w.source.name == buffer_name:
                return b, i
    raise Unstitchable(f"no block writes {buffer_name}")


def buffer_params(func: tirx.PrimFunc) -> list[tirx.Buffer]:
    """The buffer parameters of ``func``, in order: not the shape values a kernel over a
    shape expression (``past + 1``) also takes."""
    return [p for p in func.params if isinstance(p.ty, tirx.BufferType)]


def written_params(func: tirx.PrimFunc, sch: s_tir.Schedule) -> list[tirx.Buffer]:
    """Parameters written by some block (the kernel's outputs), in parameter order."""
    written = [w.source for b in child_blocks(sch) for w in sch.get(b).writes]
    return [p for p in func.params if any(p.same_as(w) for w in written)]


def load_count(sch: s_tir.Schedule, block: SBlockRV, buffer: tirx.Buffer) -> int:
    """How many loads of ``buffer`` the body of ``block`` has (``loads_of``)."""
    return len(loads_of(sch, block, buffer))


def loads_of(sch: s_tir.Schedule, block: SBlockRV, buffer: tirx.Buffer
             ) -> list[tvm.ir.TensorLoad]:
    """The loads of ``buffer`` the body of ``block`` has once TVM's lowering has
    simplified it (each one is a memory access, and each one re-evaluates the producer if
    that producer is inlined). ``x - x`` and ``x * 0`` are 0 there: a buffer read only so
    is never read, and a copy of it staged in shared memory would be written and never
    read, which TVM's storage rewrite may then overlap with the next shared buffer without a
    barrier between the writes (fuzz graph 9001:85: max error 3.77)."""
    loads: list[tvm.ir.TensorLoad] = []

    def visit(load: tvm.ir.TensorLoad) -> None:
        if load.source.same_as(buffer):
            loads.append(load)

    body = sch.get(block).body
    if isinstance(body, tirx.BufferStore):
        body = Analyzer().simplify(body.value)
    tvm_ffi.structural_walk(body, [(tvm.ir.TensorLoad, visit)])
    return loads


def narrow_indices(func: tirx.PrimFunc) -> tirx.PrimFunc:
    """``func`` with 32-bit loops and indices when TVM can narrow them (no 64-bit integer
    buffers), else unchanged. The unit loops a schedule adds are 32-bit, and TVM's lowering
    rejects a kernel whose thread loops mix 32- and 64-bit variables."""
    try:
        mod = tirx.transform.ForceNarrowIndexToInt32()(tvm.IRModule({"main": func}))
    except Exception:  # noqa: BLE001 - 64-bit data buffers: keep 64-bit indices
        return func
    return mod["main"]


def unique_buffer_names(func: tirx.PrimFunc) -> tirx.PrimFunc:
    """``func`` with every buffer it allocates named differently from the others and from the
    parameters (FuseTIR can leave two intermediates with one name; the blocks a schedule adds
    are named after their buffers, and blocks are looked up by name)."""
    root = func.body.block
    seen = {p.name for p in func.params}
    renamed: list[tuple[tirx.Buffer, tirx.Buffer]] = []
    for buf in root.alloc_buffers:
        name = buf.name
        k = 0
        while name in seen:
            k += 1
            name = f"{buf.name}_{k}"
        seen.add(name)
        if name != buf.name:
            renamed.append((buf, tirx.decl_buffer(buf.shape, buf.dtype, name=name,
                                                  scope=buf.scope(), layout=buf.layout)))
    if not renamed:
        return func

    def on_var(var: tvm.ir.Var) -> tvm.ir.Var:
        return next((new for old, new in renamed if var.same_as(old)), var)

    return tvm_ffi.structural_map(func, [(tvm.ir.Var, on_var)])


def _every_read(block: s_tir.stmt.SBlock, buffer: tirx.Buffer) -> bool:
    return True


def simplified_block(block: s_tir.stmt.SBlock,
                     reads: Callable[[s_tir.stmt.SBlock, tirx.Buffer], bool] = _every_read,
                     writes: bool = True) -> s_tir.stmt.SBlock:
    """``block`` with the indices of its accesses simplified with its domain: the loads and
    read regions of the buffers ``reads`` picks, and with ``writes`` every store and write
    region (the update and the init of a reduction alike, so that they still load where
    they store). Inlining a reshape into blocks whose layouts were transformed composes
    index maps into nests such as ``(v0 % 4 * 10240 + v1) % 10240``, which is ``v1`` within
    the domain; uncut, they grow with every composition (a group normalisation's split
    kernel reached 28 MB of TIR and a minute in ``compute_inline`` and TVM's lowering)."""
    ana = Analyzer()
    for iv in block.iter_vars:
        ana.bind(iv.var, iv.dom)

    def indices(exprs: list[tvm.ir.PrimExpr]) -> list[tvm.ir.PrimExpr]:
        return [ana.simplify(e) for e in exprs]

    def on_load(load: tvm.ir.TensorLoad) -> tvm.ir.TensorLoad:
        if not reads(block, load.source):
            return load
        return tirx.BufferLoad(load.source, indices(load.indices))

    def on_store(store: tirx.BufferStore) -> tirx.BufferStore:
        return tirx.BufferStore(store.buffer, store.value, indices(store.indices))

    def regions(found: list[tvm.ir.TensorRegion], chosen: Callable[[tirx.Buffer], bool]
                ) -> list[tvm.ir.TensorRegion]:
        return [tirx.BufferRegion(r.source, [tvm.ir.Range.from_min_extent(
            ana.simplify(d.min), d.extent) for d in r.region]) if chosen(r.source) else r
            for r in found]

    rules: list = [(tvm.ir.TensorLoad, on_load)]
    if writes:
        rules.append((tirx.BufferStore, on_store))

    def mapped(body: tirx.Stmt | None) -> tirx.Stmt | None:
        return None if body is None else tvm_ffi.structural_map(body, rules)

    return s_tir.stmt.SBlock(
        block.iter_vars, regions(block.reads, lambda b: reads(block, b)),
        regions(block.writes, lambda b: writes), block.name_hint, mapped(block.body),
        mapped(block.init), block.alloc_buffers, block.match_buffers, block.annotations)


def simplified_accesses(stmt: tirx.Stmt, reads: Callable[[s_tir.stmt.SBlock, tirx.Buffer],
                                                         bool] = _every_read,
                        writes: bool = True) -> tirx.Stmt:
    """``stmt`` with every block in it ``simplified_block``."""
    return tvm_ffi.structural_map(stmt, [(s_tir.stmt.SBlock,
                                          lambda b: simplified_block(b, reads, writes))])


def inline(sch: s_tir.Schedule, block: SBlockRV) -> None:
    """``compute_inline`` of ``block``, its readers' accesses simplified after it
    (``simplified_block``): a chain of inlined index maps otherwise grows with each one."""
    written = {w.source.name for w in sch.get(block).writes}
    users = [b for b in child_blocks(sch)
             if any(r.source.name in written for r in sch.get(b).reads)
             and not sch.get(b).same_as(sch.get(block))]
    sch.compute_inline(block)
    for user in users:
        old = sch.get(user)
        new = simplified_block(old)
        sch.state.replace(sch.get_sref(user), new, {old: new})


def prepare(func: tirx.PrimFunc) -> tirx.PrimFunc:
    """The form of a fused PrimFunc that decisions and emission both start from: unique
    buffer names, 32-bit indices where possible."""
    return narrow_indices(unique_buffer_names(func))


def prepare_one_pass(func: tirx.PrimFunc, softmax: tuple[str, ...],
                     variance: tuple[str, ...]) -> tirx.PrimFunc:
    """``prepare(func)`` with the reduction pairs a plan takes in one pass merged: the
    maximum blocks ``softmax`` with their sums of exponentials (``online_softmax``), the sum
    blocks ``variance`` with their squares about the mean (``online_variance``). Deciding
    and emission both start from it."""
    return with_online_variance(with_online_softmax(prepare(func), softmax), variance)


def add_unit_loops(sch: s_tir.Schedule) -> None:
    """Give a block without loops (a scalar, all iterators of extent 1) one unit loop per
    iterator, so every block has the loop-per-iterator form the mapping expects."""
    for block in child_blocks(sch):
        iters = sch.get(block).iter_vars
        missing = len(iters) - len(sch.get_loops(block))
        if missing > 0 and all(isinstance(iv.dom.extent, tirx.IntImm)
                               and int(iv.dom.extent) == 1 for iv in iters):
            for _ in range(missing):
                sch.add_unit_loop(block)


def cache_reused_outputs(sch: s_tir.Schedule, func: tirx.PrimFunc, scope: str,
                         writers: set[str] | None = None,
                         outputs: set[str] | None = None) -> list[str]:
    """Give every output that is also read inside the kernel an on-chip copy (``scope``) that
    the readers use, so the block computing it stops being an output block; returns their
    names. With ``writers``, only outputs written by those blocks (the others are read back
    from global memory); with ``outputs``, only those (emission: the plan's)."""
    names = []
    for param in written_params(func, sch):
        block, index = writer(sch, param.name)
        if writers is not None and name_of(sch, block) not in writers:
            continue
        if outputs is not None and param.name not in outputs:
            continue
        users = readers(sch, param, exclude=block)
        if users:
            sch.cache_write(block, index, scope, consumer_blocks=users)
            names.append(param.name)
    return names


def split_sinks(sch: s_tir.Schedule, among: set[str] | None = None
                ) -> tuple[list[SBlockRV], list[SBlockRV]]:
    """Blocks whose results no other block reads, and the others (with ``among``: only
    those blocks, and only reads by them count)."""
    blocks = [b for b in child_blocks(sch) if among is None or name_of(sch, b) in among]
    found, others = [], []
    for b in blocks:
        written = [w.source for w in sch.get(b).writes]
        used = any(among is None or name_of(sch, r) in among
                   for buf in written for r in readers(sch, buf, exclude=b))
        (others if used else found).append(b)
    return found, others
