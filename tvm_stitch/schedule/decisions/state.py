"""What deciding a group collects (staged buffers, Regional intermediates, demotions)
and the sizes and launch helpers every decision shares."""

from __future__ import annotations

from dataclasses import dataclass, field
from math import prod

from tvm import s_tir, tirx

from ...analysis.roofline import GPU
from ...plan import Buffer, BufferRole, Demotion, Launch, StorageLevel, ThreadMapping
from ...symbolic import shape_values
from ...target import WARP_SIZE
from ..blocks import buffer_params, child_blocks, name_of, split_sinks
from ..occupancy import aligned_shared, cached_elements_cap, launch_config
from ..rows import Unstitchable
from ..vectors import computed_bytes, moving_regions, spatial_block


@dataclass
class Staging:
    """A buffer kept in shared memory and its bytes for one row."""

    name: str
    role: BufferRole
    per_row: int
    note: str = ""
    block: str = ""  # writer block (for intermediates that may be recomputed)
    own: bool = False  # (an input) every reader reads only the element it is at
    kept: bool = False  # (an input of a split row) kept on chip across grid barriers
    permuted: bool = False  # (an input) read at permuted rows: one row of it per block

    def bytes_for(self, rows_per_block: int) -> int:
        """Shared bytes for ``rows_per_block`` rows at a time."""
        return self.per_row * rows_per_block


@dataclass
class BlockShared:
    """An input read alike by ``span`` consecutive rows: staged once per thread block."""

    name: str
    size: int  # bytes one block stages
    span: int


@dataclass
class Decisions:
    inlined: list[str] = field(default_factory=list)
    regional: list[Staging] = field(default_factory=list)
    results: list[Staging] = field(default_factory=list)  # reduction results (registers)
    staged: list[Staging] = field(default_factory=list)
    held: list[Staging] = field(default_factory=list)  # inputs held in registers
    block_shared: list[BlockShared] = field(default_factory=list)
    global_reads: list[Buffer] = field(default_factory=list)
    demotions: list[Demotion] = field(default_factory=list)
    reductions: int = 0


def writes_param(sch: s_tir.Schedule, func: tirx.PrimFunc, block) -> bool:
    return any(any(p.same_as(w.source) for p in func.params) for w in sch.get(block).writes)


def launch_of(gpu: GPU, threads: int, shared_bytes: int, grid: int = 0) -> Launch:
    try:
        return launch_config(gpu, threads, shared_bytes, grid)
    except ValueError as err:
        raise Unstitchable(str(err)) from err


def cap_text(launch: Launch) -> str:
    return (f"{cached_elements_cap(launch)} (half of the {launch.max_registers} registers a "
            f"thread of {launch.threads} may use)")


def grid_of(mapping: ThreadMapping) -> int:
    """The blocks a mapping launches; 0 when the row count is symbolic (known at run time)."""
    return 0 if mapping.rows_expr else mapping.blocks


def elements_of(buffer: tirx.Buffer) -> int:
    """Elements of ``buffer``; a symbolic dimension counts as its stand-in."""
    shape = shape_values(buffer.shape)
    if shape is None:
        raise Unstitchable(f"{buffer.name} has a dimension that is not a product of shape "
                           "variables")
    return prod(shape)


def bytes_of(buffer: tirx.Buffer) -> int:
    return max(buffer.dtype.bits * buffer.dtype.lanes // 8, 1)


def widest_element(sch: s_tir.Schedule, func: tirx.PrimFunc, by_lanes: bool = False) -> int:
    """Bytes of the widest element any block reads, writes or computes, parameters,
    intermediates and floating-point values cast inside a block alike (not the index casts
    of its accesses): a vector must fit ``VECTOR_BYTES``
    in every dtype it is applied to (a float16 kernel that normalises in float32 takes four
    lanes, not eight; so does one that casts to float32 and back in one inlined block, whose
    float32 vector of eight TVM's CUDA code generator prints as a ``ulonglong4`` made of
    eight floats, which nvcc rejects: fuzz graph 3120:47).

    ``by_lanes`` (a row group): its reductions and the sinks compute their lanes one by one
    (a reduction's lanes are a serial loop; a sink of a vector wider than its computed
    values allow is a lane block, ``vectors.lane_blocks``), so they count only the elements
    that move with their lanes, which they load and store in whole vectors: a float16
    LayerNorm that normalises in float32 then reads and writes eight halves per access; an
    embedding row gathered by an int64 token id moves four floats."""
    lane_wise = {name_of(sch, b) for b in split_sinks(sch)[0]} if by_lanes else set()
    # by lanes, a parameter counts where it moves with some block's lanes (a row's token id,
    # read once per row, does not narrow the vectors of the embedding row it selects)
    widths = [] if by_lanes else [bytes_of(p) for p in buffer_params(func)]
    for block in (sch.get(b) for b in child_blocks(sch)):
        if by_lanes and block.iter_vars and (
                block.name_hint in lane_wise or not spatial_block(block)):
            widths += [bytes_of(r.source) for r in moving_regions(block)]
        else:
            widths.append(computed_bytes(block))
    # no block moves lanes (a row group of scalar blocks only): the parameters decide
    return max(widths) if widths else widest_element(sch, func)


def shared_bytes_of(dec: Decisions, mapping: ThreadMapping) -> int:
    """Shared memory of the staged buffers and the reductions' scratch, each array aligned as
    TVM declares it: a cross-thread reduction stages one value per warp (``red_buf_staging``)
    and broadcasts its result (``red_result``)."""
    rpb = mapping.rows_per_block
    data = sum(aligned_shared(s.bytes_for(rpb)) for s in dec.regional + dec.staged)
    data += sum(aligned_shared(b.size) for b in dec.block_shared)
    warps = -(-mapping.threads_per_block // WARP_SIZE)
    return data + dec.reductions * (aligned_shared(warps * 4) + aligned_shared(4))


def plan_buffers(dec: Decisions, mapping: ThreadMapping, reused: list[str]) -> tuple[Buffer, ...]:
    rpb = mapping.rows_per_block
    out: list[Buffer] = []
    for name in reused:
        cached = f"{name}_shared"
        kept = any(s.name == cached for s in dec.regional)
        level = StorageLevel.SHARED if kept else StorageLevel.REGISTER
        out.append(Buffer(name, BufferRole.OUTPUT, level, 0,
                          "written out and read inside the kernel"))
    for s in dec.regional + dec.staged:
        out.append(Buffer(s.name, s.role, StorageLevel.SHARED, s.bytes_for(rpb), s.note,
                          s.block, across_barriers=s.kept))
    for s in dec.results + dec.held:
        out.append(Buffer(s.name, s.role, StorageLevel.REGISTER, 0, s.note, s.block))
    rows = mapping.rows_per_block * mapping.row_steps
    for b in dec.block_shared:
        runs = "every row" if b.span == mapping.rows else f"runs of {b.span} rows"
        out.append(Buffer(b.name, BufferRole.INPUT, StorageLevel.SHARED, b.size,
                          f"read alike by {runs}: once per block of {rows} rows",
                          per_block=True))
    out.extend(dec.global_reads)
    return tuple(out)
