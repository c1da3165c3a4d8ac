"""Emit the schedule of one stitched group: the plan's decisions as TIR schedule primitives.

The result is one kernel. Every block is first rewritten to iterate over (row, element).
Sinks (blocks whose result leaves the kernel) are tiled as ``rows -> (blockIdx.x, serial
steps, threadIdx.y)`` and ``row elements -> (threadIdx.x, serial)``; their block and step
loops are merged, every other block is computed at the step loop with its own row loop on
threadIdx.y and element loop over threadIdx.x, and inputs shared by all rows of a block are
staged before the steps. So a thread block walks its rows phase by phase: Local producers
are inlined (registers), Regional ones live in shared memory (TVM's ThreadSync puts the
barriers between phases), reductions become cross-thread reductions over threadIdx.x.

A Global group (``Group.phases``) is scheduled phase by phase, each phase a launch nest of
its own: a row phase maps its row tiles as above and accumulates every column reduction it
feeds in a partial sum per tile (``rfactor`` over the tiles; in shared memory, or where the
plan says so in the registers of the thread that walks each column), written out at the
end of the tile (a row phase of column reductions alone takes a tile of the columns
per task, a column per thread or, narrower than the block, a column per thread of each of
its lanes, whose sums it adds up first); a column phase sums those partials, a thread per
column, and computes what depends on them. ``kernel`` then makes the nests one persistent
kernel with grid barriers between them (``persistent``) and applies the launch bounds of the
plan.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import tvm
import tvm_ffi
from tvm import s_tir, tirx
from tvm.s_tir.schedule import LoopRV, SBlockRV
from tvm.sym import Analyzer

from ..lowering import COOPERATIVE_TAG
from ..plan import (
    BufferRole,
    Group,
    MappingKind,
    Phase,
    PhaseKind,
    StorageLevel,
    ThreadMapping,
    Unrolled,
)
from ..symbolic import dim_value, is_symbolic
from ..transform.guarded_updates import (
    guards_in_updates,
    on_chip_writes_unconditional,
    stores_within_columns,
    tiles_with_rows,
)
from ..transform.settle_bounds import settle_bounds
from ..transform.uniform_conditions import uniform_conditions
from .blocks import (
    LOCAL,
    SCOPES,
    SHARED,
    add_unit_loops,
    cache_reused_outputs,
    child_blocks,
    inline,
    name_of,
    prepare_one_pass,
    readers,
    split_sinks,
    writer,
    written_params,
)
from .bounded import bound_on_chip, with_length_check
from .cluster import clustered
from .grid_barrier import grid_sync, state_buffer
from .lanes import lane_map, register_lanes
from .layout import flatten_rows
from .persistent import (
    KERNEL_LAUNCH_PARAMS,
    blocks_in,
    lift_workspaces,
    persistent,
    root_statements,
    with_launch_bounds,
    with_root,
)
from .phases import copy_across_barrier, normalise_column, register_sum
from .reduction_guards import keep_write_back_guards
from .registers import guard_last_steps, hold_inputs
from .results import results_in_registers
from .row_permutation import RowPermutation, permute_rows
from .rows import Unstitchable, iters_of, row_element_map
from .rows_first import rows_first
from .task_split import (
    combine_per_reader,
    split_input_copies,
    split_output_copies,
    split_rows,
)
from .unroll_bounds import bound_row_walk, bound_unrolling
from .vectors import aligned_vectors, flat_index, lanes_fit_booleans, spatial_block


@dataclass(frozen=True)
class Kernel:
    """A stitched kernel: its scheduled PrimFunc, and what its Relax call must add: the grid
    barrier's state (an input, zero-initialised) and workspaces (trailing outputs that only
    the kernel itself reads)."""

    func: tirx.PrimFunc
    state: tirx.Buffer | None = None
    workspaces: tuple[tirx.Buffer, ...] = ()


def kernel(func: tirx.PrimFunc, group: Group) -> Kernel:
    """The kernel of ``group``: ``emit``'s schedule, made persistent with grid barriers for a
    Global group (its grid asserted to fit one wave), with the plan's launch bounds. Rows
    of symbolic length staged for a declared bound (``Group.beyond_bound``) get the
    re-reading body as well, behind a run-time check of the bound (``bounded``)."""
    sch = emit(func, group)
    out = settle_bounds(sch.mod["main"])
    beyond = group.beyond_bound
    if beyond is not None:
        assert beyond.mapping == group.mapping, (beyond.mapping, group.mapping)
        out, relied = bound_on_chip(out)
        assert relied, f"group {group.id} stages nothing of a symbolic size"
        out = with_length_check(out, settle_bounds(emit(func, beyond).mod["main"]), relied)
    state, workspaces = None, ()
    if group.cluster > 1:
        launch = group.launch
        assert launch is not None and all(p.tasks == launch.grid for p in group.phases), \
            f"clusters take a task per block: {launch}, {group.phases}"
        out = clustered(out, launch.grid, group.cluster)
    elif group.phases:
        launch = group.launch
        if launch is None or launch.grid > launch.wave:
            raise Unstitchable(f"a persistent grid must fit one wave: {launch}")
        assert launch.grid >= max(p.tasks for p in group.phases) or not any(
            b.across_barriers for b in group.buffers), "kept on chip: a task per block"
        state = state_buffer()
        params = list(out.params)
        first_output = min(params.index(p) for p in written_params(out, sch))
        out = with_root(out, params=params[:first_output] + [state] + params[first_output:])
        out, lifted = lift_workspaces(persistent(out, launch.grid, grid_sync(state)))
        # launched cooperatively, a grid that cannot be resident at once (a GPU with fewer
        # SMs than the target's) is refused by the driver instead of waiting at a barrier
        out = out.with_attr(KERNEL_LAUNCH_PARAMS, [COOPERATIVE_TAG])
        workspaces = tuple(lifted)
    if group.launch is not None:
        out = with_launch_bounds(out, group.launch.blocks_per_sm)
    return Kernel(guard_last_steps(keep_write_back_guards(out), group), state, workspaces)


def emit(func: tirx.PrimFunc, group: Group) -> s_tir.Schedule:
    """Schedule ``func`` (the fused PrimFunc of ``group``) as the plan says: one kernel, or
    for a Global group one launch nest per phase (``kernel`` merges them); the blocks the
    plan computes lane by lane get their register vectors (``lanes``), and the readers of a
    reduction result a register copy of it (``results``; not under run-time row tiles,
    whose rewrite leaves no stage pipeline to place copies in)."""
    sch = _mapped(func, group)
    if group.lane_blocks:
        register_lanes(sch, group.lane_blocks, group.mapping.vector)
        # after the lanes' register copies, which a step of the whole vector moves
        bound_unrolling(sch, tuple(u for u in group.unrolled if u.block in group.lane_blocks))
    if not group.mapping.row_tiles:
        results_in_registers(sch)
    return sch


def _mapped(func: tirx.PrimFunc, group: Group) -> s_tir.Schedule:
    done = rewritten(func, group)
    sch = done.sch
    if group.phases:
        sch = _map_global(done, group)
        bound_unrolling(sch, _not_lanes(group))
        return sch
    if group.mapping.kind is MappingKind.FLAT:
        _map_flat(sch, group.mapping, group.scalar_blocks)
        return sch
    mapping = group.mapping
    if mapping.kind is MappingKind.ROW_WALK:
        _map_row_walk(sch, mapping, done.block_caches, group.scalar_blocks)
        return sch
    _map_rows(sch, mapping, done.block_caches, group.scalar_blocks, group.vector_reads)
    if mapping.rows_per_block > 1 and (  # a guarded last block
            mapping.rows_expr or mapping.rows % (mapping.rows_per_block * mapping.row_steps)):
        _index_rows_in_block(sch, mapping.rows_per_block, rows=mapping.rows,
                             block_caches=frozenset(done.block_caches))
    bound_unrolling(sch, _not_lanes(group))  # before the last steps are guarded apart
    return hold_inputs(sch, group)


def _not_lanes(group: Group) -> tuple[Unrolled, ...]:
    """The unroll bounds of ``group`` for blocks not computed lane by lane."""
    return tuple(u for u in group.unrolled if u.block not in group.lane_blocks)


@dataclass
class Rewritten:
    """A group's PrimFunc after the TIR rewrites of its plan, before any loop is mapped to
    threads, and what the mapping needs of them. ``block_caches`` are the inputs staged once
    per thread block. A Global group's rewrite also has each column reduction's partial sum
    and write-out blocks (``partials``), the partial sums kept in registers (``held``:
    accumulator -> slots per thread), the phase of every block (``phase_of``), each row
    phase's row blocks (``row_blocks``) and the caches staged for it once per tile and once
    per row (``tile_caches``, ``row_caches``), and the copies of inputs kept in shared memory
    across its grid barriers (``kept``: made in the first phase that reads them, as a task of
    their own, since later phases read them too)."""

    sch: s_tir.Schedule
    block_caches: list[str]
    partials: dict[str, tuple[str, tuple[str, ...]]] = field(default_factory=dict)
    held: dict[str, int] = field(default_factory=dict)
    phase_of: dict[str, int] = field(default_factory=dict)
    row_blocks: dict[int, set[str]] = field(default_factory=dict)
    tile_caches: dict[int, list[SBlockRV]] = field(default_factory=dict)
    row_caches: dict[int, list[SBlockRV]] = field(default_factory=dict)
    kept: frozenset[str] = frozenset()
    row_count: tvm.ir.PrimExpr | None = None  # of run-time row tiles (``row_tiles``)

    def write_outs(self) -> list[str]:
        """The write-out blocks of every column reduction's partial results."""
        return [w for _, outs in self.partials.values() for w in outs]

    def vectorisable(self) -> list[SBlockRV]:
        """The blocks whose accesses the mapping may take in vectors: every block of a row
        group; a Global group's blocks of row phases, and the caches staged for them (whose
        names may repeat: a column result staged for two phases)."""
        blocks = child_blocks(self.sch)
        if not self.phase_of:
            return blocks
        caches = [c for lists in (self.tile_caches, self.row_caches) for cs in lists.values()
                  for c in cs]
        names = {n for rows in self.row_blocks.values() for n in rows} \
            | set(self.write_outs()) | set(self.block_caches)
        return [b for b in blocks if name_of(self.sch, b) in names] + caches


def rewritten(func: tirx.PrimFunc, group: Group) -> Rewritten:
    """The TIR rewrites the plan of ``group`` makes to ``func``, one step that deciding (to
    see the blocks it maps) and emission both take: prepared, layout moves permuted, the
    outputs read inside cached, Local blocks inlined, Regional ones given their scope,
    inputs staged; every row block in (row, element) form; for a Global group also rows
    split, partial sums made and the blocks ordered by phase; the conditions that are the
    same for every lane of a vector stated once per vector (``uniform_conditions``)."""
    if group.mapping is None:
        raise Unstitchable(f"group {group.id} has no thread mapping")
    func = prepare_one_pass(func, group.online, group.online_variance)
    if group.mapping.kind not in (MappingKind.FLAT, MappingKind.ROW_WALK) \
            and not group.mapping.rows_expr:
        func = rows_first(func, group.mapping.rows // (group.row_split or 1))
    if group.permuted_copies or group.permuted_outputs:
        func, moves = permute_rows(func, group.transposed_copies)
        planned = RowPermutation(group.permuted_copies, group.permuted_outputs,
                                 group.transposed_copies)
        assert moves == planned, (moves, planned)
    sch = s_tir.Schedule(func)
    add_unit_loops(sch)
    if group.phases:
        return _rewritten_global(sch, func, group)
    _cache_planned_outputs(sch, func, group, on_chip_scope(group.mapping))
    block_caches = _apply_storage(sch, func, group)
    if group.mapping.kind is not MappingKind.FLAT:
        flatten_rows(sch, group.mapping.rows, block_caches)
    if group.mapping.vector > 1:  # a concatenation's condition once per vector
        sch = s_tir.Schedule(uniform_conditions(sch.mod["main"], group.mapping.vector))
    return Rewritten(sch, block_caches)


def _cache_planned_outputs(sch: s_tir.Schedule, func: tirx.PrimFunc, group: Group,
                           scope: str) -> list[str]:
    """The on-chip copies of the outputs the plan says are read inside the kernel; returns
    those outputs."""
    planned = {b.name for b in group.buffers if b.role is BufferRole.OUTPUT}
    cached = cache_reused_outputs(sch, func, scope, outputs=planned)
    assert set(cached) == planned, (cached, planned)
    return cached


def _apply_storage(sch: s_tir.Schedule, func: tirx.PrimFunc, group: Group) -> list[str]:
    """Inline the Local blocks, copy the reduction results later phases read to global
    memory, give Regional intermediates their on-chip scope and stage inputs; returns the
    caches staged once per thread block."""
    for name in group.inlined:
        inline(sch, sch.get_sblock(name))
    _copy_across_barriers(sch, group)
    block_caches: list[str] = []
    for buf in group.buffers:
        scope = SCOPES.get(buf.level)
        if scope is None:
            continue
        if buf.role is BufferRole.INTERMEDIATE:
            block = sch.get_sblock(buf.block)
            index = next(i for i, w in enumerate(sch.get(block).writes)
                         if w.source.name == buf.name)
            sch.set_scope(block, index, scope)
        elif buf.role is BufferRole.INPUT:
            cache = stage_input(sch, func, buf.name, scope)
            if buf.per_block:
                block_caches.append(name_of(sch, cache))
    return block_caches


def on_chip_scope(mapping: ThreadMapping) -> str:
    """Where a kernel keeps what it reuses: registers when each thread owns its elements
    (flat and row-walk mappings), shared memory when the threads of a row share them."""
    return LOCAL if mapping.kind in (MappingKind.FLAT, MappingKind.ROW_WALK) else SHARED


def stage_input(sch: s_tir.Schedule, func: tirx.PrimFunc, name: str, scope: str) -> SBlockRV:
    """Stage input parameter ``name`` on chip (``scope``) for every block that reads it."""
    param = next((p for p in func.params if p.name == name), None)
    if param is None:
        raise Unstitchable(f"no input {name}")
    users = readers(sch, param, affine=True)
    if not users:
        raise Unstitchable(f"nothing reads {name} at known places")
    index = next(i for i, r in enumerate(sch.get(users[0]).reads) if r.source.same_as(param))
    return sch.cache_read(users[0], index, scope, consumer_blocks=users)


def _map_flat(sch: s_tir.Schedule, mapping: ThreadMapping, scalar_blocks: tuple[str, ...]
              ) -> None:
    """``vector`` consecutive elements per thread: every sink's loops fused and split into
    the thread's vectors and their lanes, the sinks' vector loops merged, the kept producers
    and register copies computed at that loop, and only then split over (blockIdx.x,
    threadIdx.x); the lanes vectorised, except in ``scalar_blocks``. TVM bounds a
    producer's region from its consumers' indices: as divisions of a remainder of one
    variable (the vector's index) it simplifies them; computed at the thread, as those of
    ``blockIdx.x * n + threadIdx.x``, it did not see that two indices were one element, and
    a transposed copy of (8, 64, 56, 56) read as (64, 56, 56, 8) (fuzz graph 12017:395), or
    a value read by a (3, 100) and a (3, 25, 4) reshape of it (12018:283), ran a loop of
    ``max(a, b) + 1 - min(a, b)`` steps, one in fact, that the traffic counter cannot
    count."""
    sinks, others = split_sinks(sch)
    heads, lanes = [], mapping.vector > 1
    for block in sinks:
        loops = sch.get_loops(block) or [sch.add_unit_loop(block)]
        fused = sch.fuse(*loops) if len(loops) > 1 else loops[0]
        heads.append(sch.split(fused, [None, mapping.vector])[0] if lanes else fused)
    vectors = sch.merge(*heads) if len(heads) > 1 else heads[0]
    for block in reversed(others):
        sch.compute_at(block, vectors, preserve_unit_loops=True)
    bx, tx = sch.split(vectors, [None, mapping.rows_per_block])
    sch.bind(bx, "blockIdx.x")
    sch.bind(tx, "threadIdx.x")
    for block in others:
        _register_per_thread(sch, block, sinks, mapping.vector)
    if lanes:
        for block in sinks:
            if name_of(sch, block) in scalar_blocks:
                continue
            assert lanes_fit_booleans(sch.get(block), mapping.vector), name_of(sch, block)
            sch.vectorize(sch.get_loops(block)[-1])
        for block in others:  # a kept producer or a register copy: the thread's one vector
            _vectorise_own_vector(sch, block, mapping.vector, scalar_blocks)


def _register_per_thread(sch: s_tir.Schedule, block: SBlockRV, sinks: list[SBlockRV],
                         vector: int) -> None:
    """Lay out each register (local buffer) ``block`` writes in the shape of a sink, or read
    by the sinks in place (``_read_in_place``), as the ``vector`` elements of one thread: the
    thread's elements are ``vector`` consecutive, aligned elements of the flattened shape, so
    ``flat % vector`` tells them apart. TVM would size the register from the region it can
    bound, and on 3-D shapes the fused index's divisions and remainders hide that bound: a
    (2, 784, 384) bias + GELU kept its whole intermediate per thread (a 9408-float array on
    PoCL's stack: segfault)."""
    shapes = [list(w.source.shape) for b in sinks for w in sch.get(b).writes]
    for index, region in enumerate(sch.get(block).writes):
        buffer = region.source
        if buffer.scope() != LOCAL or not buffer.shape or not (any(
                len(s) == len(buffer.shape) and all(tvm_ffi.structural_equal(a, b)
                                                    for a, b in zip(s, buffer.shape,
                                                                    strict=True))
                for s in shapes) or _read_in_place(sch, buffer, sinks)):
            continue
        sch.transform_layout(block, ("write", index), lane_map(buffer, vector),
                             assume_injective_transform=True)


def _read_in_place(sch: s_tir.Schedule, buffer: tirx.Buffer, sinks: list[SBlockRV]) -> bool:
    """Whether only ``sinks`` read ``buffer``, each one element of it at the flat position of
    the element it writes (a reshape: x of (8, 1000) held in a register for a select and
    read as (8, 250, 4), which TVM sized to all of x per thread, 4 KB of stack, fuzz graph
    12040:100): a thread's elements of it are then its elements of the sink."""
    names = {name_of(sch, s) for s in sinks}
    users = readers(sch, buffer)
    if not users or any(name_of(sch, u) not in names for u in users):
        return False
    for user in users:
        stmt = sch.get(user)
        if len(stmt.writes) != 1:
            return False
        ana = Analyzer()
        for iv in stmt.iter_vars:
            ana.bind(iv.var, iv.dom)
        at = flat_index(stmt.writes[0])
        for region in stmt.reads:
            if region.source.same_as(buffer) and not (
                    all(ana.can_prove_equal(r.extent, 1) for r in region.region)
                    and ana.can_prove_equal(flat_index(region), at)):
                return False
    return True


def _map_rows(sch: s_tir.Schedule, mapping: ThreadMapping, block_caches: list[str],
              scalar: tuple[str, ...], vector_reads: tuple[str, ...] = ()) -> None:
    """Row mapping over blocks in (row, element) form (``layout.flatten_rows``): a thread
    block walks ``row_steps`` groups of ``rows_per_block`` rows; the phases of each group are
    computed in that loop, inputs staged for the whole block (``block_caches``) before it;
    the blocks of ``scalar`` without vectors."""
    sinks, others = split_sinks(sch)
    caches = [b for b in others if name_of(sch, b) in block_caches]
    others = [b for b in others if name_of(sch, b) not in block_caches]
    heads, steps, bindings = [], [], []
    for block in sinks:
        row, elem = _two_loops(sch, block)
        outer, step, row_in_block = sch.split(
            row, [None, mapping.row_steps, mapping.rows_per_block])
        heads.append(outer)
        steps.append(step)
        bindings.append((row_in_block, _element_loop(sch, block, elem, mapping, scalar,
                                                     vector_reads)))
    bx, step = _merge_tasks(sch, heads, steps)
    _bind_at_step(sch, mapping, bindings, others, step, scalar, vector_reads)
    for block in caches:
        sch.compute_at(block, bx, preserve_unit_loops=True)
        loops = sch.get_loops(block)[1:]
        fused = sch.fuse(*loops) if len(loops) > 1 else loops[0]
        _, row_in_block, thread = _split_vectors(
            sch, block, fused, [None, mapping.rows_per_block, mapping.threads_per_row],
            mapping.vector, scalar)
        _bind_threads(sch, mapping, row_in_block, thread)


def _map_row_walk(sch: s_tir.Schedule, mapping: ThreadMapping, block_caches: list[str],
                  scalar: tuple[str, ...]) -> None:
    """Row walk over blocks in (row, element) form: every sink's rows split over
    (blockIdx.x, row steps, threadIdx.y) and its row over (blockIdx.x, threadIdx.x, vector
    lanes), the steps inside the threads; every other block computed at the step (its registers: the
    thread's vector of one row), the inputs staged once per block (``block_caches``) at the
    thread, above the steps (its vector, for every row it walks); lanes vectorised, except
    in the blocks of ``scalar``."""
    sinks, others = split_sinks(sch)
    caches = [b for b in others if name_of(sch, b) in block_caches]
    others = [b for b in others if name_of(sch, b) not in block_caches]
    nests: list[list[LoopRV]] = []
    for block in sinks:
        row, elem = _two_loops(sch, block)
        bx, step, ty = sch.split(row, [None, mapping.row_steps, mapping.rows_per_block])
        columns, tx, _ = _split_vectors(
            sch, block, elem, [mapping.column_blocks, mapping.threads_per_row, None],
            mapping.vector, scalar)
        sch.reorder(bx, columns, ty, tx, step)
        nests.append([sch.fuse(bx, columns), ty, tx, step])
    bx, ty, tx, step = [sch.merge(*loops) if len(loops) > 1 else loops[0]
                        for loops in zip(*nests, strict=True)]
    sch.bind(bx, "blockIdx.x")
    _bind_threads(sch, mapping, ty, tx)
    for block, at in [*((b, step) for b in reversed(others)), *((c, tx) for c in caches)]:
        sch.compute_at(block, at, preserve_unit_loops=True)
        _vectorise_own_vector(sch, block, mapping.vector, scalar)


def _vectorise_own_vector(sch: s_tir.Schedule, block: SBlockRV, vector: int,
                          scalar: tuple[str, ...]) -> None:
    """Vectorise the innermost loop of ``block``, computed at a thread's loop, when it walks
    the thread's one vector of ``vector`` lanes, the block is spatial and not in
    ``scalar``."""
    lanes = sch.get_loops(block)[-1]
    extent = sch.get(lanes).extent
    if vector > 1 and spatial_block(sch.get(block)) and name_of(sch, block) not in scalar \
            and isinstance(extent, tirx.IntImm) and int(extent) == vector:
        sch.vectorize(lanes)


def _index_rows_in_block(sch: s_tir.Schedule, rows_per_block: int,
                         per_row: frozenset[str] | None = None, rows: int | None = None,
                         block_caches: frozenset[str] = frozenset()) -> None:
    """Index every on-chip buffer over a symbolic row count or the ``rows`` rows (or, given
    ``per_row``, those buffers: the ones a Global group's plan keeps one row of while its
    blocks walk several rows in sequence) by the row's place in its thread block
    (``row % rows_per_block``; a
    block holds consecutive rows, one group at a time). TVM sizes such a buffer from the
    region a thread block touches: all its rows in sequence (fuzz graph 4242:228: three rows
    of a tile in 90 KB where the plan has one in 33 KB), and the guard of a partial last
    block (``row < n``) hides that region's bound. The ``block_caches`` (inputs staged once
    per block) hold no rows, even one as long as the row count (a T5 RMSNorm weight of 64
    over 64 rows: indexed by row, 6 slots held the 64 weights)."""
    for block in child_blocks(sch):
        if name_of(sch, block) in block_caches:
            continue
        for index, region in enumerate(sch.get(block).writes):
            buffer = region.source
            if buffer.scope() == "global" or not buffer.shape:
                continue
            if per_row is None:
                first = dim_value(buffer.shape[0]) or 0
                if not is_symbolic(first) and first != rows:
                    continue
            elif buffer.name not in per_row:
                continue
            sch.transform_layout(
                block, ("write", index),
                lambda row, *rest: (row % rows_per_block, *rest),
                assume_injective_transform=True)


def _merge_tasks(sch: s_tir.Schedule, heads: list[LoopRV], steps: list[LoopRV]
                 ) -> tuple[LoopRV, LoopRV]:
    """Merge the sinks' task loops into one bound to ``blockIdx.x`` and their step loops into
    one; returns both merged loops."""
    bx = sch.merge(*heads) if len(heads) > 1 else heads[0]
    step = sch.merge(*steps) if len(steps) > 1 else steps[0]
    sch.bind(bx, "blockIdx.x")
    return bx, step


def _bind_at_step(sch: s_tir.Schedule, mapping: ThreadMapping,
                  bindings: list[tuple[LoopRV | None, LoopRV]], others: list[SBlockRV],
                  step: LoopRV, scalar: tuple[str, ...], vector_reads: tuple[str, ...] = ()
                  ) -> None:
    """Bind the sinks' (row in block, thread) loops (``bindings``), then compute every other
    block at ``step`` (last first) with its (row, element) loops bound alike."""
    for row_in_block, thread in bindings:
        _bind_threads(sch, mapping, row_in_block, thread)
    for block in reversed(others):
        sch.compute_at(block, step, preserve_unit_loops=True)
        loops = sch.get_loops(block)[2:]
        if len(loops) != 2:
            raise Unstitchable(f"block {name_of(sch, block)}: compute-at made {len(loops)} "
                               "loops for (row, element)")
        covered = sch.get(loops[0]).extent
        if isinstance(covered, tirx.IntImm) and int(covered) > mapping.rows_per_block:
            # its rows lie apart (an input staged at permuted rows): bound to threadIdx.y,
            # the rows past the block's would never be computed
            raise Unstitchable(f"block {name_of(sch, block)} covers {int(covered)} rows at a "
                               f"step of {mapping.rows_per_block}")
        if mapping.rows_per_block > 1 and _is_unit(sch.get(loops[1]).extent):
            # One element per packed row (a token id staged for its row): every thread of
            # the row computes it, so each reads what it wrote itself. Written by the row's
            # first thread, the others read it unsynchronised: TVM inserts no barrier
            # between accesses of one index that varies with a thread (threadIdx.y), so
            # t5_block's embedding rows packed 6 per block read stale ids and faulted on an
            # H200. (With a row per block the index is constant, and TVM syncs.)
            sch.bind(loops[0], _row_thread(mapping))
            continue
        _bind_threads(sch, mapping, loops[0],
                      _element_loop(sch, block, loops[1], mapping, scalar, vector_reads))


def _two_loops(sch: s_tir.Schedule, block: SBlockRV) -> tuple[LoopRV, LoopRV]:
    loops = sch.get_loops(block)
    if len(loops) != 2:
        raise Unstitchable(f"block {name_of(sch, block)} is not in (row, element) form")
    return loops[0], loops[1]


def _element_loop(sch: s_tir.Schedule, block: SBlockRV, elem: LoopRV,
                  mapping: ThreadMapping, scalar: tuple[str, ...],
                  vector_reads: tuple[str, ...] = ()) -> LoopRV:
    """The thread loop of a row block's element loop, the thread loop outside (consecutive
    threads take consecutive elements, or vectors of ``mapping.vector`` elements unless the
    block reduces or is in ``scalar``; a reduction of ``vector_reads`` reads its inputs a
    vector at a time, ``_read_vectors``); returns the thread loop."""
    if name_of(sch, block) in vector_reads:
        return _read_vectors(sch, block, elem, mapping)
    serial, thread = _split_vectors(sch, block, elem, [None, mapping.threads_per_row],
                                    mapping.vector, scalar)
    sch.reorder(thread, serial)
    return thread


def _read_vectors(sch: s_tir.Schedule, block: SBlockRV, elem: LoopRV,
                  mapping: ThreadMapping) -> LoopRV:
    """A reduction's element loop as (thread, step, lane): each thread reduces vectors of
    ``mapping.vector`` consecutive elements, consecutive threads on consecutive vectors, and
    each global input's vector is loaded at once into registers (a vectorised copy at each
    step; the plan asserted the accesses aligned). Returns the thread loop."""
    stmt = sch.get(block)
    assert aligned_vectors(stmt, mapping.vector), (stmt.name_hint, mapping.vector)
    serial, thread, lane = sch.split(elem, [None, mapping.threads_per_row, mapping.vector])
    sch.reorder(thread, serial, lane)
    names = [r.source.name for r in stmt.reads if r.source.scope() == "global"]
    for name in dict.fromkeys(names):
        index = next(i for i, r in enumerate(sch.get(block).reads) if r.source.name == name)
        cache = sch.cache_read(block, index, LOCAL)
        sch.compute_at(cache, serial, preserve_unit_loops=True)
        sch.vectorize(sch.get_loops(cache)[-1])
    return thread


def _split_vectors(sch: s_tir.Schedule, block: SBlockRV, loop: LoopRV,
                   factors: list[int | None], vector: int, scalar: tuple[str, ...]
                   ) -> list[LoopRV]:
    """Split ``loop`` of ``block`` by ``factors`` and, unless the block reduces, the plan
    keeps it ``scalar`` or ``loop`` does not divide into vectors, by ``vector`` lanes more
    (vectorised: one access per vector; asserted aligned); returns the loops of
    ``factors``. The loop's extent is the one thing the plan does not record: compute-at
    derives it, and a cache of one value per row has a loop of 1 where its block spans
    every row."""
    extent = sch.get(loop).extent
    if vector == 1 or not spatial_block(sch.get(block)) or name_of(sch, block) in scalar \
            or not isinstance(extent, tirx.IntImm) or int(extent) % vector:
        return sch.split(loop, factors)
    assert aligned_vectors(sch.get(block), vector), (name_of(sch, block), vector)
    *loops, lane = sch.split(loop, [*factors, vector])
    sch.vectorize(lane)
    return loops


def _thread_loop(sch: s_tir.Schedule, elem: LoopRV, mapping: ThreadMapping) -> LoopRV:
    """Split the element loop over ``threads_per_row`` threads, the thread loop outside
    (consecutive threads read consecutive elements); returns the thread loop."""
    serial, thread = sch.split(elem, [None, mapping.threads_per_row])
    sch.reorder(thread, serial)
    return thread


def _row_thread(mapping: ThreadMapping) -> str:
    """The thread index over the rows of a block: threadIdx.x for strided rows (consecutive
    rows on consecutive lanes), else threadIdx.y."""
    return "threadIdx.x" if mapping.kind is MappingKind.STRIDED_ROWS else "threadIdx.y"


def _bind_threads(sch: s_tir.Schedule, mapping: ThreadMapping, row_in_block: LoopRV | None,
                  thread: LoopRV) -> None:
    strided = mapping.kind is MappingKind.STRIDED_ROWS
    if (mapping.rows_per_block > 1 or strided) and row_in_block is not None:
        sch.bind(row_in_block, _row_thread(mapping))
    sch.bind(thread, "threadIdx.y" if strided else "threadIdx.x")


def _rewritten_global(sch: s_tir.Schedule, func: tirx.PrimFunc, group: Group) -> Rewritten:
    """``rewritten`` for a Global group (see the module docstring): rows split, columns
    normalised, partial sums per row tile, the nests ordered by phase, the column results
    of later row phases staged and the row blocks of every row phase in (row, element)
    form."""
    mapping = group.mapping
    if group.row_split > 1:
        split_rows(sch, func, mapping.rows // group.row_split, group.row_split)
    columns = [n for p in group.phases for n in p.partials]
    for name in columns:
        normalise_column(sch, sch.get_sblock(name))
    cached = _cache_planned_outputs(sch, func, group, SHARED)
    if group.row_split > 1:
        split_output_copies(sch, cached, mapping.rows // group.row_split, group.row_split)
    block_caches = _apply_storage(sch, func, group)
    kept = split_input_copies(sch, [b.name for b in group.buffers if b.across_barriers],
                              mapping.rows // group.row_split, group.row_split)
    sch = combine_per_reader(sch, func)
    sums = {b.block: b for b in group.buffers if b.role is BufferRole.ACCUMULATOR}
    done = Rewritten(sch, block_caches, kept=frozenset(kept))
    for name in columns:
        row, _ = sch.get_loops(sch.get_sblock(name))
        done.row_count = sch.get(row).extent
        tile, _ = sch.split(row, [mapping.tiles, None if mapping.row_tiles
                                  else mapping.row_steps])
        accumulate = sch.rfactor(tile, 0)
        # every result on chip (an online variance's three), in registers those the plan
        # holds there; the others accumulate in global memory
        held = sums[name].level is StorageLevel.REGISTER
        results = range(sums[name].held_results if held
                        else len(sch.get(accumulate).writes))
        for index in results:
            _flatten_partials(sch, accumulate, index)
        write_outs = [sch.cache_write(accumulate, i, SCOPES[sums[name].level])
                      for i in results]
        done.partials[name] = (name_of(sch, accumulate),
                               tuple(name_of(sch, w) for w in write_outs))
        if sums[name].level is StorageLevel.REGISTER:
            done.held[name_of(sch, accumulate)] = sums[name].registers
    done.phase_of = _phase_of_blocks(sch, group.phases, done.partials)
    if mapping.row_tiles:  # run-time tiles: the partial sums' last rows are guarded
        sch = s_tir.Schedule(guards_in_updates(sch.mod["main"],
                                               {a for a, _ in done.partials.values()}))
    done.sch = sch = _reorder_by_phase(sch, done.phase_of,
                                       set(done.write_outs()))
    for index, phase in enumerate(group.phases):
        if phase.kind is not PhaseKind.ROWS:
            continue
        names = {n for n, i in done.phase_of.items() if i == index}
        caches = [sch.get_sblock(c) for c in block_caches if c in names]
        per_row = []
        for buf in group.buffers:  # the column results this phase reads
            if buf.role is BufferRole.PHASE_INPUT and buf.block in phase.blocks:
                cache = _stage_phase_input(sch, names, buf.name)
                (caches if buf.per_block else per_row).append(cache)
        mine = [c for c in columns if c in phase.blocks]
        rows = names - {n for c in mine for n in (done.partials[c][0], *done.partials[c][1])} \
            - set(block_caches) \
            - set(phase.combines)
        flatten_rows(sch, mapping.rows, [], only=rows)
        done.row_blocks[index] = rows
        done.tile_caches[index] = caches
        done.row_caches[index] = per_row
    return done


def _map_global(done: Rewritten, group: Group) -> s_tir.Schedule:
    """One launch nest per phase of a Global group (see the module docstring)."""
    sch, mapping = done.sch, group.mapping
    columns = [n for p in group.phases for n in p.partials]
    stores: dict[str, str] = {}  # a column sum's store out of its register -> the sum
    for index, phase in enumerate(group.phases):
        if phase.kind is PhaseKind.ROWS:
            mine = [c for c in columns if c in phase.blocks]
            _map_row_phase(sch, mapping, done.row_blocks[index],
                           [done.partials[c][0] for c in mine],
                           [done.partials[c][1] for c in mine], done.tile_caches[index],
                           done.row_caches[index], phase, done.held, group.scalar_blocks,
                           done.kept, group.walk_unrolled)
        else:
            stores.update(_map_column_phase(
                sch, mapping.threads_per_block, list(phase.combines),
                [n for n in phase.blocks if n not in phase.combines],
                {b.block for b in group.buffers if b.role is BufferRole.SUM
                 and b.level is StorageLevel.REGISTER}))
    if mapping.row_steps > 1 or mapping.row_tiles:
        _index_rows_in_block(sch, mapping.rows_per_block, _row_buffers(group))
    sch = hold_inputs(sch, group)
    if mapping.row_tiles:
        per_tile = {name_of(sch, c) for caches in done.tile_caches.values() for c in caches}
        sch = s_tir.Schedule(on_chip_writes_unconditional(tiles_with_rows(
            sch.mod["main"], set(done.write_outs()), set(done.partials),
            per_tile, done.row_count, mapping.row_tiles, mapping.row_steps), done.row_count))
    if stores:
        sch = s_tir.Schedule(stores_within_columns(sch.mod["main"], stores))
    return sch


def _row_buffers(group: Group) -> frozenset[str]:
    """Names of the on-chip buffers of a Global group that hold rows, one row per block at a
    time: its Regional intermediates, the copies of outputs read inside and the inputs staged
    per row (``_shared`` the name of a staged copy), and the row reductions' results in
    registers (``_local``: sized for every row of a tile, a walk of 257 rows declared
    arrays of 257 elements a thread, fuzz graph 12035:233), not what is staged once per
    block, nor column results and partial sums."""
    names = {b.name for b in group.buffers if b.level is StorageLevel.SHARED
             and not b.per_block
             and b.role in (BufferRole.INTERMEDIATE, BufferRole.OUTPUT, BufferRole.INPUT)}
    results = {f"{b.name}_local" for b in group.buffers if b.level is StorageLevel.REGISTER
               and b.role is BufferRole.INTERMEDIATE}
    return frozenset(names | {f"{n}_shared" for n in names} | results)


def _copy_across_barriers(sch: s_tir.Schedule, group: Group) -> None:
    """The global copies of the reduction results the plan says later phases read, for the
    readers it names (asserted: every reader of the result outside its phase)."""
    for buf in group.buffers:
        if buf.role is not BufferRole.CROSSING:
            continue
        phase = next(p for p in group.phases if buf.block in p.blocks)
        block = sch.get_sblock(buf.block)
        result = sch.get(block).writes[0].source
        later = {name_of(sch, r) for r in readers(sch, result, exclude=block)} \
            - set(phase.blocks)
        assert later == set(buf.readers), (later, buf.readers)
        copy = copy_across_barrier(sch, buf.block, set(buf.readers))
        assert copy in phase.blocks, (copy, phase.blocks)


def _flatten_partials(sch: s_tir.Schedule, accumulate: SBlockRV, index: int) -> None:
    """Lay the ``index``-th partial results of ``accumulate`` (tile, columns...) out as
    (tile, column): a
    tile of consecutive columns is then one interval of the buffer, so the region that
    compute-at derives for it (the write-out of a column tile) is exact rather than the box
    around it, whose other columns belong to other tasks."""
    shape = list(sch.get(accumulate).writes[index].source.shape)
    if len(shape) <= 2:
        return
    layout = row_element_map([0], shape[:1], list(range(1, len(shape))), shape[1:])
    sch.transform_layout(accumulate, ("write", index), tirx.IndexMap.from_func(
        layout, ndim=len(shape), index_dtype=str(shape[0].ty.dtype)))


def _stage_phase_input(sch: s_tir.Schedule, names: set[str], buffer_name: str) -> SBlockRV:
    """Stage a column phase's result in shared memory for its readers among ``names`` (a
    row phase); returns the staging block (its name may repeat another phase's)."""
    block, index = writer(sch, buffer_name)
    buffer = sch.get(block).writes[index].source
    users = [u for u in readers(sch, buffer, exclude=block, affine=True)
             if name_of(sch, u) in names]
    read = next(i for i, r in enumerate(sch.get(users[0]).reads) if r.source.same_as(buffer))
    return sch.cache_read(users[0], read, SHARED, consumer_blocks=users)


def _phase_of_blocks(sch: s_tir.Schedule, phases: tuple[Phase, ...],
                     partials: dict[str, tuple[str, tuple[str, ...]]]) -> dict[str, int]:
    """The phase of every block: as planned; a column reduction's partial sum and write-out
    in the row phase that feeds it, its combination in the column phase; blocks added by
    the schedule (staging caches, copies of outputs) with the blocks they feed, else with
    those that feed them."""
    phase_of: dict[str, int] = {}
    for index, phase in enumerate(phases):
        for name in phase.blocks:
            if name in partials and phase.kind is PhaseKind.ROWS:
                accumulate, write_outs = partials[name]
                phase_of.update({n: index for n in (accumulate, *write_outs)})
            else:
                phase_of[name] = index
    for block in reversed(child_blocks(sch)):
        name = name_of(sch, block)
        if name in phase_of:
            continue
        written = [w.source for w in sch.get(block).writes]
        users = [phase_of.get(name_of(sch, r)) for buf in written
                 for r in readers(sch, buf, exclude=block)]
        if any(u is not None for u in users):
            phase_of[name] = min(u for u in users if u is not None)
    for block in child_blocks(sch):
        name = name_of(sch, block)
        if name not in phase_of:
            sources = [phase_of.get(p) for r in sch.get(block).reads
                       for p in _writers(sch, r.source)]
            phase_of[name] = max((s for s in sources if s is not None), default=0)
    return phase_of


def _writers(sch: s_tir.Schedule, buffer: tirx.Buffer) -> list[str]:
    return [name_of(sch, b) for b in child_blocks(sch)
            if any(w.source.same_as(buffer) for w in sch.get(b).writes)]


def _reorder_by_phase(sch: s_tir.Schedule, phase_of: dict[str, int], last: set[str]
                      ) -> s_tir.Schedule:
    """A new schedule of ``sch``'s function with the loop nests under the root ordered by
    phase (and, inside a phase, the blocks of ``last`` after the others), keeping program
    order otherwise; each nest holds one block at this point."""
    func = sch.mod["main"]
    nests = root_statements(func)

    def rank(item: tuple[int, tirx.Stmt]) -> tuple[int, int, int]:
        index, nest = item
        (name,) = blocks_in(nest)
        return phase_of[name], int(name in last), index

    ordered = [n for _, n in sorted(enumerate(nests), key=rank)]
    return s_tir.Schedule(with_root(func, body=tirx.stmt_seq(*ordered)))


def _map_row_phase(sch: s_tir.Schedule, mapping: ThreadMapping, names: set[str],
                   accumulators: list[str], write_outs: list[tuple[str, ...]],
                   caches: list[SBlockRV],
                   row_caches: list[SBlockRV], phase: Phase, held: dict[str, int],
                   scalar: tuple[str, ...], kept: frozenset[str] = frozenset(),
                   walk: int = 0) -> None:
    """A row phase: its row blocks (``names``, in (row, element) form) mapped as
    ``_map_rows`` does (the blocks of ``scalar`` without vectors) with one row per
    block at a time, inputs staged once per tile (``caches``) before its rows and once per
    row (``row_caches``) at each row; each column reduction's partial sum (``accumulators``,
    loops: tile, step, column) accumulated at the step loop and written out after the
    tile. With ``phase.column_tiles``, a task is a row tile's column tile, a column per
    thread, or ``phase.lanes`` threads per column (``_map_lanes``). Each of
    ``phase.combines`` (the combination of a split row's partials) is made at each row,
    in shared memory, a thread per partial. The partial sums of ``held`` (accumulators ->
    the plan's slots per thread) are in registers, each thread on its columns
    (``_hold_partial_sums``). With ``walk``, a tile walks its rows in unrolled runs of
    that many rows (``unroll_bounds.bound_row_walk``)."""
    column_tiles, combines = phase.column_tiles, phase.combines
    if phase.lanes > 1:
        assert len(accumulators) == 1 and len(write_outs[0]) == 1 and not (
            names or caches or row_caches or held or walk), phase
        assert _lanes(sch, accumulators[0], column_tiles, mapping) == phase.lanes, phase
        _map_lanes(sch, mapping, accumulators[0], write_outs[0][0], column_tiles, scalar)
        return
    sinks, others = split_sinks(sch, names | set(accumulators))
    moved = [b for b in others if name_of(sch, b) in kept]  # later phases read them too
    sinks, others = moved + sinks, [b for b in others if b not in moved]
    heads, steps, bindings = [], [], []
    for block in sinks:
        if name_of(sch, block) in accumulators:
            tile, step, column = sch.get_loops(block)
            if column_tiles > 1:
                assert not held, "the plan holds no column tile's partial sums in registers"
                column_tile, thread = sch.split(column, [column_tiles, None])
                sch.reorder(column_tile, step)
                heads.append(sch.fuse(tile, column_tile))
                bindings.append((None, thread))
            else:
                heads.append(tile)
                bindings.append((None, _thread_loop(sch, column, mapping)))
            steps.append(step)
            continue
        row, elem = _two_loops(sch, block)
        outer, step, row_in_block = sch.split(
            row, [mapping.row_tiles, None, 1] if mapping.row_tiles
            else [None, phase.row_steps or mapping.row_steps, 1])
        if column_tiles > 1:  # element-wise rows beside the partial sums, their tiles alike
            assert not (caches or row_caches or held), phase
            column_tile, elem = sch.split(elem, [column_tiles, None])
            sch.reorder(column_tile, step, row_in_block)
            outer = sch.fuse(outer, column_tile)
        heads.append(outer)
        steps.append(step)
        bindings.append((row_in_block, _element_loop(sch, block, elem, mapping, scalar)))
    bx, step = _merge_tasks(sch, heads, steps)
    _bind_at_step(sch, mapping, bindings, others, step, scalar)
    for block in row_caches:
        sch.compute_at(block, step, preserve_unit_loops=True)
        _bind_inner_loops(sch, block, 2, mapping, scalar)
    for name in combines:
        block = sch.get_sblock(name)
        for index in range(len(sch.get(block).writes)):  # an online softmax's pair: two
            sch.set_scope(block, index, SHARED)
        sch.compute_at(block, step, preserve_unit_loops=True)
        part, row = sch.get_loops(block)[2:]  # the loops of a column combination
        sch.reorder(row, part)
        sch.bind(_thread_loop(sch, part, mapping), "threadIdx.x")
    for name in accumulators:  # zeroed before the tile's rows, not under a row's guard
        sch.decompose_reduction(sch.get_sblock(name), step)
    for block in caches:
        sch.compute_at(block, bx, preserve_unit_loops=True)
        _bind_tile_loops(sch, block, mapping, scalar)
    for name, outs in zip(accumulators, write_outs, strict=True):
        for index, write_out in enumerate(outs):
            block = sch.get_sblock(write_out)
            sch.reverse_compute_at(block, bx, preserve_unit_loops=True)
            if name in held:
                _hold_partial_sums(sch, name, block, index, held[name], mapping)
            else:
                _bind_tile_loops(sch, block, mapping, scalar)
    if walk:
        bound_row_walk(sch, step, walk)


def _hold_partial_sums(sch: s_tir.Schedule, accumulator: str, write_out: SBlockRV,
                       index: int, slots: int, mapping: ThreadMapping) -> None:
    """Keep the ``index``-th partial results of ``accumulator`` (a local buffer over (tile,
    column), its
    update at thread ``c % P`` of column ``c``, zeroed before the tile's rows) in ``slots``
    registers per thread: ``write_out`` (placed after the tile) takes the columns of the
    same threads, the buffer is laid out by ``column // P`` (a local buffer is private to
    its thread, and a block walks one tile at a time), and the loops over a thread's
    columns are unrolled so that every slot is indexed by a constant. TVM would otherwise
    keep the bounding box of a thread's strided columns: about the whole row, in local
    memory."""
    column = sch.get_loops(write_out)[-1]
    sch.bind(_thread_loop(sch, column, mapping), "threadIdx.x")
    block = sch.get_sblock(f"{accumulator}_update")  # the names decompose_reduction gives
    init = sch.get_sblock(f"{accumulator}_init")
    for each in (block, init, write_out) if index == 0 else (write_out,):
        serial = sch.get_loops(each)[-1]
        assert int(sch.get(serial).extent) == slots, (accumulator, slots)
        sch.unroll(serial)
    threads = mapping.threads_per_row
    buffer = sch.get(block).writes[index].source
    assert len(buffer.shape) == 2, buffer.shape  # (tile, column): ``_flatten_partials``
    sch.transform_layout(block, ("write", index), tirx.IndexMap.from_func(
        lambda _tile, c: (c // threads,), ndim=2, index_dtype=str(buffer.shape[0].ty.dtype)),
        assume_injective_transform=True)


def _lanes(sch: s_tir.Schedule, accumulator: str, column_tiles: int,
           mapping: ThreadMapping) -> int:
    """Threads per column of a column tile of ``accumulator`` (loops: tile, step, column)."""
    column = sch.get_loops(sch.get_sblock(accumulator))[2]
    return mapping.threads_per_block * column_tiles // int(sch.get(column).extent)


def _map_lanes(sch: s_tir.Schedule, mapping: ThreadMapping, accumulator: str,
               write_out: str, column_tiles: int, scalar: tuple[str, ...]) -> None:
    """A row phase that only accumulates one column reduction (loops: tile, step, column)
    over column tiles narrower than the block: a task per (row tile, column tile), each
    thread on a column of the tile and a part of the tile's rows (its lane); the lanes' sums
    (in shared memory) are then added up per column before the tile's partial sums are
    written out."""
    lanes = _lanes(sch, accumulator, column_tiles, mapping)
    block = sch.get_sblock(accumulator)
    _, step, column = sch.get_loops(block)
    sch.split(column, [column_tiles, None])
    lane, _ = sch.split(step, [lanes, None])
    per_lane = sch.rfactor(lane, 0)
    sch.set_scope(per_lane, 0, SHARED)
    tile, lane, step, column_tile, thread = sch.get_loops(per_lane)
    sch.reorder(column_tile, lane, thread, step)
    bx = sch.fuse(tile, column_tile)
    sch.bind(bx, "blockIdx.x")
    sch.bind(sch.fuse(lane, thread), "threadIdx.x")
    # the sums of the lanes and their write-out placed before any split over the threads:
    # each then covers exactly the tile's columns (a split's guard is not part of a region)
    out = sch.get_sblock(write_out)
    sch.reverse_compute_at(block, bx, preserve_unit_loops=True)
    sch.reverse_compute_at(out, bx, preserve_unit_loops=True)
    *_, lane, column = sch.get_loops(block)
    sch.reorder(column, lane)
    sch.bind(_thread_loop(sch, column, mapping), "threadIdx.x")
    _bind_tile_loops(sch, out, mapping, scalar)
    sch.decompose_reduction(per_lane, step)


def _bind_tile_loops(sch: s_tir.Schedule, block: SBlockRV, mapping: ThreadMapping,
                     scalar: tuple[str, ...]) -> None:
    """The loops of a block computed once per tile, fused and spread over the threads."""
    _bind_inner_loops(sch, block, 1, mapping, scalar)


def _bind_inner_loops(sch: s_tir.Schedule, block: SBlockRV, outer: int,
                      mapping: ThreadMapping, scalar: tuple[str, ...]) -> None:
    """The loops of ``block`` below its ``outer`` ones fused and spread over the threads, in
    vectors where ``_element_loop`` allows them (a unit loop first when there are none: a
    scalar is copied by one thread)."""
    if len(sch.get_loops(block)) == outer:
        sch.add_unit_loop(block)
    loops = sch.get_loops(block)[outer:]
    fused = sch.fuse(*loops) if len(loops) > 1 else loops[0]
    sch.bind(_element_loop(sch, block, fused, mapping, scalar), "threadIdx.x")


def _map_column_phase(sch: s_tir.Schedule, threads: int, combines: list[str],
                      column_space: list[str], in_registers: set[str]) -> dict[str, str]:
    """A column phase: a thread per column sums the partials of each column reduction
    (``combines``, loops: tile, column) in tile order, in a register where the plan says so
    (``in_registers``), else in place; each column-space
    block, walked as one flat loop over its columns, runs in the same task and thread as
    the sums of those columns, after them (it reads only what that thread wrote). Blocks of
    other widths get nests of their own (a grid barrier apart). Returns the blocks that
    store a register's sum, each with its sum's block: guarded as that block's columns
    (``stores_within_columns``)."""
    stores = {}
    heads: dict[int, list[LoopRV]] = {}
    for name in combines:
        block = sch.get_sblock(name)
        tile, column = sch.get_loops(block)
        sch.reorder(column, tile)
        outer, thread = sch.split(column, [None, threads])
        sch.bind(thread, "threadIdx.x")
        heads.setdefault(int(sch.get(outer).extent), []).append(outer)
    for name in column_space:
        block = sch.get_sblock(name)
        iters = iters_of(sch, block)
        if len(iters) > 1:
            sch.transform_block_layout(block, tirx.IndexMap.from_func(
                row_element_map([], [], list(range(len(iters))), [i.extent for i in iters]),
                ndim=len(iters), index_dtype=str(iters[0].var.ty.dtype)))
        loops = sch.get_loops(block)
        column = sch.fuse(*loops) if len(loops) > 1 else loops[0]
        outer, thread = sch.split(column, [None, threads])
        sch.bind(thread, "threadIdx.x")
        heads.setdefault(int(sch.get(outer).extent), []).append(outer)
    for loops in heads.values():
        outer = sch.merge(*loops) if len(loops) > 1 else loops[0]
        sch.bind(outer, "blockIdx.x")
    for name in combines:  # after the merge, which loses the block index of later blocks
        if name not in in_registers:
            continue
        block = sch.get_sblock(name)
        for index, written in enumerate(sch.get(block).writes):  # an online variance: 3
            result = written.source
            assert register_sum(result), (name, list(result.shape))
            total = sch.cache_write(block, index, LOCAL)  # the sum in a register, stored
            column = sch.get(sch.get_loops(block)[1])  # once, after the column's sum
            if not any(sch.get(loop).same_as(column) for loop in sch.get_loops(total)):
                sch.reverse_compute_at(total, sch.get_loops(block)[1],
                                       preserve_unit_loops=True)
            _one_register(sch, block, index, result)
            stores[name_of(sch, total)] = name
    return stores


def _one_register(sch: s_tir.Schedule, block: SBlockRV, index: int, result: tirx.Buffer
                  ) -> None:
    """Lay out the register ``block`` writes (a copy of ``result``, placed) as one element:
    each thread sums one column at a time. TVM would size it from the columns the thread may
    touch, and a guard on the block index (a persistent grid that does not divide the tasks)
    hides that bound from it (a 4 KB array per thread: fuzz case g1657 overflowed PoCL's
    stack)."""
    dtype = str(result.shape[0].ty.dtype)
    zero = tirx.IntImm(dtype, 0)
    sch.transform_layout(block, ("write", index), tirx.IndexMap.from_func(
        lambda *_: [zero], ndim=len(result.shape), index_dtype=dtype),
        assume_injective_transform=True)


def _is_unit(extent: tirx.PrimExpr) -> bool:
    return isinstance(extent, tirx.IntImm) and int(extent) == 1
