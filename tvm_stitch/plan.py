"""StitchPlan: what the stitch pass decided for a module, as plain data.

The grouping pass (``tvm_stitch.transform.StitchFuse``) builds a plan; the scheduler
(``tvm_stitch.schedule``) applies it; ``verify``/``bench``/reports print it. A plan says, for
every memory-intensive region of the model, which ops form one kernel (a group), which of them
are dominants (the ops whose thread mapping the group follows), how each producer -> consumer
edge is stitched (scheme), how threads map to rows, what is staged in shared memory, and what
fell back to TVM's own fusion and why.

Everything here is frozen and JSON-serialisable (``to_dict``/``from_dict``), so a plan can be
attached to a module (``attach``/``of_module``) and survive TVM's passes.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, fields
from enum import Enum, StrEnum
from typing import Any

from tvm.ir import IRModule

MODULE_ATTR = "stitch_plan"
"""Name of the IRModule attribute that carries the plan as JSON."""

GROUP_ATTR = "stitch.group"
"""Name of the PrimFunc attribute that marks a stitched kernel with its group id."""


class Scheme(StrEnum):
    """How a producer's result reaches its consumer inside one kernel (AStitch, Table 1)."""

    INDEPENDENT = "independent"  # no dependence: remote stitching of unconnected parts
    LOCAL = "local"  # one-to-one: the same thread, kept in registers (inlined)
    REGIONAL = "regional"  # one-to-many inside a thread block: shared memory + barrier
    GLOBAL = "global"  # across thread blocks: global memory + grid barrier


class MappingKind(StrEnum):
    """How the threads of a kernel are laid over its work."""

    BLOCK_PER_ROW = "block-per-row"  # more than a warp per long row, one row per block or packed
    WARP_PER_ROW = "warp-per-row"  # a warp (or sub-warp) per short row, rows packed per block
    STRIDED_ROWS = "strided-rows"  # rows a stride long, side by side: rows on threadIdx.x
    FLAT = "flat"  # no reduction: one element per thread
    ROW_WALK = "row-walk"  # no reduction: a thread owns a vector of columns and walks rows


class StorageLevel(StrEnum):
    """Where an intermediate or a staged input of a group lives."""

    REGISTER = "register"  # inlined into its consumer (Local)
    SHARED = "shared"  # staged in shared memory (Regional)
    GLOBAL = "global"  # read from / kept in global memory (demoted or not staged)


class BufferRole(StrEnum):
    """What a buffer of a stitched kernel is to it."""

    INPUT = "input"  # a kernel input (staged, held in registers, or re-read)
    INTERMEDIATE = "intermediate"  # produced and consumed inside the kernel
    OUTPUT = "output"  # written out and read inside the kernel too
    ACCUMULATOR = "accumulator"  # a column reduction's partial sum of a row tile
    PARTIAL = "partial"  # those partial sums written out, combined in the next phase
    PHASE_INPUT = "phase input"  # a column phase's result staged for a later row phase
    CROSSING = "crossing"  # a row reduction's result copied out for a later phase
    SUM = "sum"  # a column phase's sum of partials, one column per thread


class PhaseKind(StrEnum):
    """What a phase of a Global-stitched kernel walks."""

    ROWS = "rows"  # row tiles
    COLUMNS = "columns"  # columns: sums of partials and what depends on them alone


class DominantKind(StrEnum):
    """Why an op is a dominant (AStitch section 4.2)."""

    REDUCTION = "reduction"
    EXPENSIVE = "expensive"  # an expensive element-wise op feeding a broadcast
    OUTPUT = "output"  # its result leaves the group


class DemotionKind(StrEnum):
    """What a demotion gave up to fit a kernel's shared memory or registers."""

    HELD_IN_REGISTERS = "held in registers"  # an input staged per row, held by its threads
    REREAD = "re-read"  # an input staged per row, re-read from global memory
    BLOCK_INPUT_REREAD = "block input re-read"  # an input staged per block, re-read
    FEWER_ROWS_PER_BLOCK = "fewer rows per block"
    RECOMPUTED = "recomputed"  # a Regional intermediate recomputed by its readers
    PARTIAL_SUMS_IN_REGISTERS = "partial sums in registers"
    FEWER_ROW_TILES = "fewer row tiles"  # so that a thread's re-read inputs fit registers
    ROW_TILES_KEPT = "row tiles kept"  # fewer would not fit one wave
    ROLLED_REREADS = "rolled re-reads"  # re-read inputs read again in rolled loops
    ROWS_IN_COLUMN_TILES = "rows in column tiles"  # nothing staged per row: tasks take parts
    ONE_PERMUTED_ROW = "one permuted row"  # a block per row, for an input staged per row
    PERMUTED_REREAD = "permuted re-read"  # an input staged per permuted row, re-read
    HELD_REREAD = "held re-read"  # a held input re-read: its readers load from shared memory


@dataclass(frozen=True)
class Demotion:
    """One demotion of a group's plan: its ``kind``, the buffer it concerns (``subject``),
    the count it changed (``before`` -> ``after``: rows per block, row tiles, partial sums per
    thread), the bytes that did not fit ``budget`` (``used``), and ``detail`` (what was held
    in registers, for the row tiles)."""

    kind: DemotionKind
    subject: str = ""
    before: int = 0
    after: int = 0
    used: int = 0
    budget: int = 0
    detail: str = ""

    def __str__(self) -> str:
        over = f"({self.used} B of shared memory > {self.budget} B)"
        return _DEMOTION_TEXT[self.kind].format(over=over, **asdict(self))


_DEMOTION_TEXT = {
    DemotionKind.HELD_IN_REGISTERS: "input {subject} held in registers {over}",
    DemotionKind.REREAD: "input {subject} re-read from global memory {over}",
    DemotionKind.BLOCK_INPUT_REREAD:
        "input {subject} (shared by the block's rows) re-read from global memory {over}",
    DemotionKind.FEWER_ROWS_PER_BLOCK: "rows per block {before} -> {after} {over}",
    DemotionKind.RECOMPUTED: "intermediate {subject} recomputed by its readers {over}",
    DemotionKind.PARTIAL_SUMS_IN_REGISTERS:
        "partial sums of the column reductions in registers, {after} per thread ({used} B of "
        "shared memory > a quarter of {budget} B)",
    DemotionKind.FEWER_ROW_TILES: "row tiles {before} -> {after}: {detail}",
    DemotionKind.ROW_TILES_KEPT: "row tiles stay {before}: {detail}",
    DemotionKind.ROLLED_REREADS:
        "inputs {subject} read again from global memory (L2) in each loop over a thread's "
        "elements, the loops rolled: {before} elements kept in registers per thread -> "
        "{after} ({detail})",
    DemotionKind.ROWS_IN_COLUMN_TILES:
        "element-wise rows in column tiles beside the partial sums ({used} B of shared memory "
        "> a quarter of {budget} B, {before} row tile(s)): {subject} read again from global "
        "memory or recomputed, not staged per row",
    DemotionKind.ONE_PERMUTED_ROW:
        "rows per block {before} -> {after}: input {subject} is staged per row read at "
        "permuted rows, and the rows a block packs lie apart in it",
    DemotionKind.PERMUTED_REREAD:
        "input {subject} re-read from global memory: read at permuted rows, the {before} rows "
        "a block packs lie apart in it",
    DemotionKind.HELD_REREAD:
        "input {subject} re-read from global memory, not held: its {before} registers a "
        "thread and the loads from shared memory its readers have in flight beside them "
        "would take {after}, more than {budget}",
}


class ChoiceSource(StrEnum):
    """What fixed a group's choices."""

    HEURISTIC = "heuristic"  # the rules of ``schedule.decisions`` alone
    DATABASE = "database"  # the best measured record of a tuning database
    COST_MODEL = "cost model"  # the candidate a cost model ranked first


@dataclass(frozen=True)
class Choices:
    """The choices of a kernel that a chooser (a cost model, the tuner, a database) fixes,
    each None when left to the heuristic: threads per row, rows packed per block and rows
    walked in sequence, elements per access, threads per block of an element-wise kernel,
    parts per row of task splitting (1: none), column tiles of a Global group's row phases
    (1: none), the inputs re-read from global memory rather than staged on chip, and the
    inputs held in their threads' registers rather than staged per row, whether a row
    group's reductions read their inputs a vector at a time (``vector_reads``), whether
    an element-wise group walks its rows (``walk_rows``: a ROW_WALK mapping, else FLAT), and
    whether a row group's maximum and sum of exponentials (a softmax's) are one online
    reduction (``online_softmax``, ``transform.online_softmax``), whether its sums and sums
    of squares about their means (a variance's) are one online reduction
    (``online_variance``, ``transform.online_variance``), and the blocks per
    thread-block cluster of a split row group (``cluster``, 1: none; sm_90), and whether a
    Global group's row tiles may leave the last one short (``ragged_tiles``, rows that no
    divisor splits into about a wave: ``tiles.ragged_tiles``), and whether a row group keeps
    as blocks the transposing copies of inputs that keep the innermost axis
    (``kept_transposes``, ``row_permutation.keepable_transposes``; the rules keep them where
    that moves fewer bytes).
    ``schedule.decisions`` applies them and raises Unstitchable for an illegal one; the
    candidate space (``tuning.space``) offers only legal ones."""

    threads_per_row: int | None = None
    rows_per_block: int | None = None
    row_steps: int | None = None
    vector: int | None = None
    block_threads: int | None = None
    split_parts: int | None = None
    column_tiles: int | None = None
    reread: tuple[str, ...] = ()
    held: tuple[str, ...] = ()
    vector_reads: bool | None = None
    walk_rows: bool | None = None
    online_softmax: bool | None = None
    online_variance: bool | None = None
    cluster: int | None = None
    ragged_tiles: bool | None = None
    kept_transposes: bool | None = None

    def __str__(self) -> str:
        fixed = [f"{f.name.replace('_', ' ')} {getattr(self, f.name)}" for f in fields(self)
                 if f.name not in ("reread", "held") and getattr(self, f.name) is not None]
        fixed += [f"re-read {', '.join(self.reread)}"] if self.reread else []
        fixed += [f"held in registers {', '.join(self.held)}"] if self.held else []
        return ", ".join(fixed) or "the heuristic's"


@dataclass(frozen=True)
class ThreadMapping:
    """Thread mapping of a group: ``rows`` tasks of ``row_length`` elements each.

    A thread block holds ``rows_per_block`` rows at a time (threadIdx.y, horizontal packing)
    with ``threads_per_row`` threads on each (threadIdx.x), and walks ``row_steps`` such
    groups of rows in sequence (vertical packing). A STRIDED_ROWS mapping swaps the two:
    consecutive rows on threadIdx.x, a row's threads on threadIdx.y (rows whose elements lie
    a stride apart and whose consecutive rows lie side by side, so that a warp's accesses at
    one element of its rows are contiguous). Element-wise blocks access ``vector``
    consecutive elements at once (vectorised loads and stores). For a FLAT mapping a row is
    one element and ``rows_per_block`` threads run on threadIdx.x, each on ``vector``
    elements. For a ROW_WALK mapping (an element-wise group) each thread owns ``vector``
    columns of a row (a row takes ``column_blocks`` blocks of ``threads_per_row`` threads) and
    the block's threads walk ``row_steps`` groups of ``rows_per_block`` rows, each thread
    keeping in registers what it reads alike for every row (a bias). ``rows_expr`` is set
    when the row (element) count is symbolic: the expression
    the kernel computes its grid from at run time; ``rows`` is then its stand-in
    (``tvm_stitch.symbolic``), and ``blocks`` means nothing. ``length_expr`` is set when
    the row length is symbolic: each thread then walks the row in a loop of run-time extent,
    ``row_length`` is its stand-in, and ``mapped_length`` the length the threads were
    chosen for (a declared upper bound, or ``SYMBOLIC_ROW_LENGTH``). ``length_bound`` is that
    declared bound of the symbolic length (0: none declared): the group's kernel stages its
    rows on chip sized for it, and checks the real length at run time (``Group.beyond_bound``).
    ``row_tiles`` is set for a Global group of a symbolic row count: its row phases take
    that many row tiles (a persistent grid is one wave, whatever the rows), each walking
    ``max(ceil(rows / row_tiles), row_steps)`` rows at run time (at least ``row_steps``, so
    that few rows leave few tiles of partial sums), past the last row guarded, and a tile
    past the rows doing nothing. It is set alike for a static row count that no divisor
    splits into about a wave (``tiles.ragged_tiles``): ``row_steps`` is then
    ``ceil(rows / row_tiles)``, and the last tile's rows past the end are guarded.
    """

    kind: MappingKind
    rows: int
    row_length: int
    rows_per_block: int
    threads_per_row: int
    row_steps: int = 1
    vector: int = 1
    rows_expr: str = ""
    length_expr: str = ""
    mapped_length: int = 0
    length_bound: int = 0
    row_tiles: int = 0

    @property
    def tiles(self) -> int:
        """Row tiles of a Global group's row phases: ``row_tiles``, else the rows over the
        steps each tile walks."""
        return self.row_tiles or self.rows // self.row_steps

    @property
    def threads_per_block(self) -> int:
        """Threads in one thread block."""
        if self.kind is MappingKind.FLAT:
            return self.rows_per_block
        return self.rows_per_block * self.threads_per_row

    @property
    def rows_per_grid_block(self) -> int:
        """Rows (elements, for a FLAT mapping) one thread block handles in all."""
        per_thread = self.vector if self.kind is MappingKind.FLAT else 1
        return self.rows_per_block * self.row_steps * per_thread

    @property
    def column_blocks(self) -> int:
        """Thread blocks side by side on one row: a ROW_WALK mapping's row may take more
        threads than one block has; 1 for every other kind."""
        if self.kind is not MappingKind.ROW_WALK:
            return 1
        return self.row_length // (self.threads_per_row * self.vector)

    @property
    def blocks(self) -> int:
        """Thread blocks in the grid."""
        return -(-self.rows // self.rows_per_grid_block) * self.column_blocks

    def __str__(self) -> str:
        rows = f"{self.rows_expr} (symbolic)" if self.rows_expr else str(self.rows)
        blocks = (f"{self.row_tiles} blocks" if self.row_tiles
                  else f"ceil({self.rows_expr} / {self.rows_per_grid_block}) blocks at run time"
                  if self.rows_expr else f"{self.blocks} blocks")
        vector = f", {self.vector} elements per access" if self.vector > 1 else ""
        if self.kind is MappingKind.FLAT:
            return (f"flat: {rows} elements, {self.rows_per_block} threads per block"
                    f"{vector}, {blocks}")
        steps = f", {self.row_steps} rows in sequence" if self.row_steps > 1 else ""
        if self.row_tiles and self.rows_expr:
            steps = f", {self.row_tiles} row tiles of max(ceil({self.rows_expr} / " \
                    f"{self.row_tiles}), {self.row_steps}) rows in sequence"
        elif self.row_tiles:
            last = self.rows - (self.row_tiles - 1) * self.row_steps
            steps = f", {self.row_tiles} row tiles of {self.row_steps} rows in sequence" \
                    + (f" (the last {last})" if last != self.row_steps else "")
        if self.column_blocks > 1:
            steps += f", {self.column_blocks} blocks per row"
        bound = f"at most {self.length_bound} declared, " if self.length_bound else ""
        length = (f"{self.length_expr} (symbolic, {bound}mapped for {self.mapped_length})"
                  if self.length_expr else str(self.row_length))
        return (f"{self.kind.value}: {rows} rows x {length}, "
                f"{self.rows_per_block} row(s) x {self.threads_per_row} threads per block"
                f"{steps}{vector}, {blocks}")


@dataclass(frozen=True)
class Edge:
    """A producer -> consumer dependence between two ops of a group, and its scheme."""

    producer: str
    consumer: str
    scheme: Scheme


@dataclass(frozen=True)
class Dominant:
    """A dominant op, the ops it absorbs through Local edges, and its sub-dominants.

    ``kind`` is why the op is a dominant.
    """

    op: str
    kind: DominantKind
    members: tuple[str, ...]
    sub_dominants: tuple[str, ...] = ()


@dataclass(frozen=True)
class Unrolled:
    """A block whose loop over a thread's row elements nvcc unrolls in runs of ``steps``
    steps of ``lanes`` elements, and no more (each run's loads issued before its first use):
    it streams ``elements`` elements of inputs from global memory a step, and a fully
    unrolled loop would have more of them in flight than the thread's registers leave, or
    keep re-read inputs in registers that do not fit them (``schedule.decisions.unrolling``).
    A block the plan keeps scalar (``Group.scalar_blocks``) unrolls runs of as many
    elements, ``steps * lanes`` steps of one."""

    block: str
    steps: int
    lanes: int
    elements: int

    def __str__(self) -> str:
        return (f"{self.block}: runs of {self.steps} step(s) of {self.lanes} unrolled, "
                f"{self.elements} element(s) of streamed inputs in flight a step")


@dataclass(frozen=True)
class Buffer:
    """A buffer of a stitched kernel: where it lives, its shared bytes per block, and why.

    ``block`` names the TIR block that writes an intermediate (buffer names may repeat in a
    fused PrimFunc, block names do not). ``per_block`` marks an input staged once per thread
    block and shared by all the rows the block handles (a bias, a scale, a mask row).
    ``registers`` is the elements each thread holds of a buffer whose register size the plan
    fixes (the partial sums of a column reduction kept in registers), 0 otherwise;
    ``held_results`` how many of such a reduction's results are held there (its first, or
    every one: an online softmax's pair, an online variance's triple), the others
    accumulating in place in global memory.
    ``readers`` are the blocks of later phases that read a crossing buffer's copy.
    ``across_barriers`` marks an input of a split row group staged per sub-row by the first
    phase that reads it and kept in shared memory across the grid barriers, for the later
    phases: right only while every block keeps its sub-row, that is, while the grid holds
    every task at once.
    """

    name: str
    role: BufferRole
    level: StorageLevel
    shared_bytes: int = 0
    note: str = ""
    block: str = ""
    per_block: bool = False
    registers: int = 0
    held_results: int = 0
    readers: tuple[str, ...] = ()
    across_barriers: bool = False


@dataclass(frozen=True)
class Launch:
    """A kernel's launch configuration on one GPU (assume-relax-apply, DESIGN.md section 4).

    ``blocks_per_sm`` blocks of ``threads`` threads with ``shared_bytes`` of shared memory
    are resident per SM when no thread uses more than ``max_registers`` registers, which the
    kernel's ``__launch_bounds__(threads, blocks_per_sm)`` makes ptxas keep to. ``grid`` is
    the blocks launched, 0 when the grid is computed at run time (a symbolic row count).
    """

    gpu: str
    threads: int
    shared_bytes: int
    blocks_per_sm: int
    max_registers: int
    sms: int
    grid: int = 0

    @property
    def wave(self) -> int:
        """Blocks resident at once on the whole GPU: the most a persistent grid may launch."""
        return self.sms * self.blocks_per_sm

    @property
    def waves(self) -> float:
        """How many waves the grid takes."""
        return self.grid / self.wave

    def __str__(self) -> str:
        grid = (f"{self.grid} blocks" if self.grid else "a grid computed at run time") + \
            f" x {self.threads} threads on {self.gpu}"
        waves = f", {self.waves:.2f} waves" if self.grid else ""
        return (f"{grid}: {self.blocks_per_sm} block(s) per SM ({self.wave} per wave{waves}), "
                f"at most {self.max_registers} registers per thread, "
                f"{self.shared_bytes} B of shared memory per block")


@dataclass(frozen=True)
class Phase:
    """The work of a Global-stitched kernel between two grid barriers.

    A ``rows`` phase walks row tiles (the row mapping) computing row-wise blocks and the
    partial sums of the column reductions it feeds (``partials``); a ``columns`` phase sums
    partials (``combines``: of column reductions, or of row reductions split over several
    blocks) and computes what depends on those sums alone; a ``rows`` phase may combine the
    partials of its own rows' split reductions too (``combines``), each block for its row.
    ``tasks`` is its number of
    virtual blocks, looped over the persistent grid. A rows phase of column reductions alone
    may give each task one of ``column_tiles`` tiles of the columns of its row tile (its
    tasks are then row tiles x column tiles); a tile narrower than the block gives each of
    its columns ``lanes`` threads, each on a part of the tile's rows. ``row_steps`` is set
    for a rows phase whose tasks walk fewer rows than the mapping's row tiles
    (``ThreadMapping.row_steps``): one after the column phases that accumulates nothing takes
    tasks of fewer rows where the tiles sized for the partial sums of the first would leave
    blocks of the grid idle (``global_stitch._rows_after_columns``).
    """

    kind: PhaseKind
    blocks: tuple[str, ...]
    tasks: int
    partials: tuple[str, ...] = ()
    combines: tuple[str, ...] = ()
    column_tiles: int = 1
    lanes: int = 1
    row_steps: int = 0


@dataclass(frozen=True)
class Group:
    """One stitched kernel: a set of Relax ops fused into one PrimFunc and its schedule.

    ``function`` is the fused PrimFunc's name once the plan is applied. ``inlined`` lists the
    TIR blocks computed in registers inside their consumers (Local); ``buffers`` lists every
    intermediate kept in shared memory and every input staged there (Regional), plus what was
    demoted to global memory to fit ``shared_budget``. A group with Global edges runs as a
    persistent grid in ``phases`` separated by grid barriers; ``row_split`` > 1 splits each of
    its rows over that many blocks (task splitting; the mapping's rows are then the sub-rows);
    ``cluster`` > 1 launches them as thread-block clusters of that many blocks, which combine
    their partials through distributed shared memory (``schedule.cluster``).
    ``permuted_copies`` are the copy blocks of layout moves of whole rows inlined into their
    readers, and ``permuted_outputs`` the outputs such a move writes at permuted rows
    (``schedule.row_permutation``); ``transposed_copies`` the copies that transpose an
    input's row elements which that rewrite leaves as blocks, decided as any other (Regional:
    they read the input once for all their readers; or inlined). ``launch`` is its kernel's
    launch configuration.
    ``scalar_blocks`` are the blocks that access memory one element at a time although the
    mapping's vector is wider: accesses not provably whole aligned vectors
    (``schedule.vectors``), or a boolean value in more lanes than TVM's CUDA code generator
    takes; reductions do, except those of ``vector_reads``, which read their inputs a
    vector at a time into registers (consecutive threads on consecutive vectors) and reduce
    those. ``lane_blocks`` compute their lanes one by one into a register vector (they call
    an intrinsic TVM cannot vectorise, such as ``erf``) and load their global inputs and
    store their outputs a whole vector at a time (``schedule.lanes``). ``beyond_bound`` is
    the plan of the kernel's second body when its rows, of symbolic length, are staged on
    chip sized for the declared bound (``mapping.length_bound``): the kernel runs this one
    when the run-time length exceeds the bound, with the same threads, re-reading what the
    first body stages and recomputing its Regional intermediates. ``online`` names the
    maximum blocks that also sum the exponentials of their row in the same pass (an online
    softmax, ``transform.online_softmax``): the blocks of those sums are gone from the
    kernel, and the row is read once for both. ``online_variance`` names the sum blocks that
    also sum the squares about their row's mean in the same pass, and keep the mean and a
    count (an online variance, ``transform.online_variance``). ``unrolled`` bounds how far
    nvcc unrolls the element loops of blocks that stream many loads, and ``walk_unrolled``
    (when not 0) the row walk of a Global group's row tiles: runs of that many rows
    unrolled, in a loop nvcc must not unroll (``schedule.decisions.unrolling.bound_row_walk``).
    """

    id: int
    ops: tuple[str, ...]
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    dominants: tuple[Dominant, ...]
    edges: tuple[Edge, ...]
    function: str = ""
    mapping: ThreadMapping | None = None
    inlined: tuple[str, ...] = ()
    buffers: tuple[Buffer, ...] = ()
    shared_bytes: int = 0
    shared_budget: int = 0
    demotions: tuple[Demotion, ...] = ()
    launch: Launch | None = None
    phases: tuple[Phase, ...] = ()
    row_split: int = 1
    cluster: int = 1
    permuted_copies: tuple[str, ...] = ()
    permuted_outputs: tuple[str, ...] = ()
    transposed_copies: tuple[str, ...] = ()
    scalar_blocks: tuple[str, ...] = ()
    vector_reads: tuple[str, ...] = ()
    lane_blocks: tuple[str, ...] = ()
    online: tuple[str, ...] = ()
    online_variance: tuple[str, ...] = ()
    unrolled: tuple[Unrolled, ...] = ()
    walk_unrolled: int = 0
    choices: Choices = field(default_factory=Choices)
    source: ChoiceSource = ChoiceSource.HEURISTIC
    beyond_bound: Group | None = None

    @property
    def grid_barriers(self) -> int:
        """Grid barriers of the kernel: one between consecutive phases, none in a kernel of
        clusters (its phases meet at cluster barriers)."""
        return 0 if self.cluster > 1 else max(0, len(self.phases) - 1)

    @property
    def staged(self) -> tuple[Buffer, ...]:
        """Buffers kept in shared memory."""
        return tuple(b for b in self.buffers if b.level is StorageLevel.SHARED)


@dataclass(frozen=True)
class Fallback:
    """Ops left to TVM's own FuseOps/FuseTIR and dlight rules, with the reason."""

    ops: tuple[str, ...]
    reason: str


@dataclass(frozen=True)
class ComputeOp:
    """A compute-intensive op on TVM's default path, with the epilogue TVM fuses into it and
    the copies its kernel absorbs (``graph.operands``): it reads its operands through
    ``reads_through`` and writes its result through ``writes_through``."""

    op: str
    kind: str
    epilogue: tuple[str, ...] = ()
    reads_through: tuple[str, ...] = ()
    writes_through: tuple[str, ...] = ()

    @property
    def absorbed(self) -> tuple[str, ...]:
        """Every copy the kernel absorbs."""
        return self.reads_through + self.writes_through


@dataclass(frozen=True)
class Refusal:
    """A merge of two groups that the grouping refused, and why."""

    first: str
    second: str
    reason: str


@dataclass(frozen=True)
class StitchPlan:
    """All decisions of the stitch pass for one module."""

    groups: tuple[Group, ...] = ()
    fallbacks: tuple[Fallback, ...] = ()
    compute: tuple[ComputeOp, ...] = ()
    refusals: tuple[Refusal, ...] = ()
    notes: tuple[str, ...] = field(default=())

    def group(self, group_id: int) -> Group:
        """The group with id ``group_id``."""
        for g in self.groups:
            if g.id == group_id:
                return g
        raise KeyError(f"no group {group_id} in the plan")

    def group_of(self, op: str) -> Group | None:
        """The group that contains ``op``, or None."""
        return next((g for g in self.groups if op in g.ops), None)

    def fallback_of(self, op: str) -> Fallback | None:
        """The fallback entry that contains ``op``, or None."""
        return next((f for f in self.fallbacks if op in f.ops), None)

    def to_dict(self) -> dict[str, Any]:
        """A JSON-compatible dict (enums as their values)."""
        return _jsonable(asdict(self))

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> StitchPlan:
        """Inverse of ``to_dict``."""
        return _build(cls, data)

    def to_json(self) -> str:
        """The plan as a JSON string."""
        return json.dumps(self.to_dict(), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> StitchPlan:
        """Inverse of ``to_json``."""
        return cls.from_dict(json.loads(text))

    def attach(self, mod: IRModule) -> IRModule:
        """``mod`` with this plan stored as its ``stitch_plan`` attribute."""
        return mod.with_attr(MODULE_ATTR, self.to_json())

    @classmethod
    def of_module(cls, mod: IRModule) -> StitchPlan | None:
        """The plan attached to ``mod`` by the stitch pass, or None."""
        attrs = mod.attrs
        if attrs is None or MODULE_ATTR not in attrs:
            return None
        return cls.from_json(str(attrs[MODULE_ATTR]))

    def __str__(self) -> str:
        return format_plan(self)


def format_plan(plan: StitchPlan) -> str:
    """A human-readable report of ``plan``."""
    lines = [f"StitchPlan: {len(plan.groups)} stitched group(s), "
             f"{len(plan.fallbacks)} fallback(s), {len(plan.compute)} compute op(s)"]
    for g in plan.groups:
        lines.append(f"group {g.id} -> {g.function or '?'}: {', '.join(g.ops)}")
        lines.append(f"  inputs: {', '.join(g.inputs)}; outputs: {', '.join(g.outputs)}")
        for d in g.dominants:
            sub = f"; sub-dominants {', '.join(d.sub_dominants)}" if d.sub_dominants else ""
            lines.append(f"  dominant {d.op} ({d.kind.value}): {', '.join(d.members)}{sub}")
        for e in g.edges:
            lines.append(f"  edge {e.producer} -> {e.consumer}: {e.scheme.value}")
        if g.mapping is not None:
            lines.append(f"  mapping {g.mapping}")
        if g.online:
            lines.append(f"  online softmax: {', '.join(g.online)} also sum the exponentials "
                         "of their row, in the same pass")
        if g.online_variance:
            lines.append(f"  online variance: {', '.join(g.online_variance)} also sum the "
                         "squares about their row's mean, in the same pass")
        if g.inlined:
            lines.append(f"  in registers (inlined): {', '.join(g.inlined)}")
        for b in g.buffers:
            size = f", {b.shared_bytes} B" if b.shared_bytes else ""
            size += f", {b.registers} per thread" if b.registers else ""
            note = f" ({b.note})" if b.note else ""
            lines.append(f"  {b.role.value} {b.name}: {b.level.value}{size}{note}")
        if g.shared_budget:
            lines.append(f"  shared memory {g.shared_bytes} of {g.shared_budget} B per block")
        if g.row_split > 1:
            lines.append(f"  task splitting: each row over {g.row_split} blocks")
        if g.cluster > 1:
            lines.append(f"  thread-block clusters of {g.cluster} blocks: partials combined "
                         "through distributed shared memory, a cluster barrier per phase")
        if g.permuted_copies:
            lines.append(f"  layout moves stitched in: {', '.join(g.permuted_copies)} inlined"
                         + (f"; {', '.join(g.permuted_outputs)} written at permuted rows"
                            if g.permuted_outputs else ""))
        if on_chip := [c for c in g.transposed_copies if c not in g.inlined]:
            lines.append(f"  transposes of inputs read once, their rows on chip: "
                         f"{', '.join(on_chip)}")
        if g.scalar_blocks:
            lines.append(f"  scalar accesses: {', '.join(g.scalar_blocks)}")
        if g.vector_reads:
            lines.append(f"  reductions reading vectors: {', '.join(g.vector_reads)}")
        if g.lane_blocks:
            lines.append(f"  lanes computed one by one, moved in vectors: "
                         f"{', '.join(g.lane_blocks)}")
        lines.extend(f"  unrolled {u}" for u in g.unrolled)
        if g.walk_unrolled:
            lines.append(f"  row walk unrolled in runs of {g.walk_unrolled} row(s)")
        if g.source is not ChoiceSource.HEURISTIC:
            lines.append(f"  chosen by the {g.source.value}: {g.choices}")
        if g.launch is not None:
            lines.append(f"  launch {g.launch}")
        for i, ph in enumerate(g.phases):
            kind = "cluster" if g.cluster > 1 else "grid"
            barrier = f"; {kind} barrier" if i + 1 < len(g.phases) else ""
            tiles = (f": {ph.tasks // ph.column_tiles} row tiles x {ph.column_tiles} column "
                     "tiles" if ph.column_tiles > 1 else "")
            tiles += f", {ph.lanes} threads per column" if ph.lanes > 1 else ""
            tiles += f" of {ph.row_steps} row(s)" if ph.row_steps else ""
            lines.append(f"  phase {i} ({ph.kind.value}, {ph.tasks} tasks{tiles}): "
                         f"{', '.join(ph.blocks)}{barrier}")
        for d in g.demotions:
            lines.append(f"  demoted: {d}")
        if g.beyond_bound is not None and g.mapping is not None:
            lines.append(f"  beyond {g.mapping.length_expr} > {g.mapping.length_bound}, the "
                         "kernel's second body:")
            lines.extend(f"    {b.role.value} {b.name}: {b.level.value} ({b.note})"
                         for b in g.beyond_bound.buffers if b.level is not StorageLevel.SHARED)
            if g.beyond_bound.inlined != g.inlined:
                lines.append(f"    in registers (inlined): {', '.join(g.beyond_bound.inlined)}")
    for f in plan.fallbacks:
        lines.append(f"fallback {', '.join(f.ops)}: {f.reason}")
    for c in plan.compute:
        epi = f" + epilogue {', '.join(c.epilogue)}" if c.epilogue else ""
        moves = "".join(f" + {what} {', '.join(ops)}" for what, ops in (
            ("reads through", c.reads_through), ("writes through", c.writes_through)) if ops)
        lines.append(f"compute {c.op} ({c.kind}){epi}{moves}: TVM default path")
    for r in plan.refusals:
        lines.append(f"refused merge {r.first} + {r.second}: {r.reason}")
    lines.extend(f"note: {n}" for n in plan.notes)
    return "\n".join(lines)


def _jsonable(value: Any) -> Any:
    if isinstance(value, Enum):
        return value.value
    if isinstance(value, dict):
        return {k: _jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_jsonable(v) for v in value]
    return value


_NESTED: dict[str, type] = {}


def _build(cls: type, data: dict[str, Any]) -> Any:
    """Rebuild dataclass ``cls`` from ``data``, following the field annotations."""
    kwargs = {}
    for f in fields(cls):
        if f.name not in data:
            continue
        kwargs[f.name] = _convert(str(f.type), data[f.name])
    return cls(**kwargs)


def _convert(annotation: str, value: Any) -> Any:
    if value is None:
        return None
    if annotation.startswith("tuple["):
        inner = annotation[len("tuple["):-1].split(",")[0].strip()
        return tuple(_convert(inner, v) for v in value)
    base = annotation.split("|")[0].strip()
    target = _NESTED.get(base)
    if target is None:
        return value
    if issubclass(target, Enum):
        return target(value)
    return _build(target, value)


_NESTED.update({
    cls.__name__: cls
    for cls in (Scheme, MappingKind, ChoiceSource, Choices, StorageLevel, BufferRole,
                PhaseKind, DominantKind, DemotionKind, Demotion, ThreadMapping, Edge,
                Dominant, Unrolled, Buffer, Launch, Phase, Group, Fallback, ComputeOp, Refusal)
})
