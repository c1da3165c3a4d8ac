"""Element-wise groups: one element (or vector) per thread, producers in registers."""

from __future__ import annotations

from dataclasses import replace

import tvm
import tvm_ffi
from tvm import s_tir, tirx

from ...analysis.roofline import GPU
from ...plan import Buffer, BufferRole, Choices, Group, StorageLevel, ThreadMapping
from ...symbolic import is_symbolic, symbolic_extent
from ..blocks import (
    LOCAL,
    buffer_params,
    child_blocks,
    inline,
    load_count,
    name_of,
    readers,
    split_sinks,
    written_params,
)
from ..mapping import VECTOR_BYTES, flat_mapping
from ..rows import RowAccess, Unstitchable, access_rows, block_rows, error_summary
from ..vectors import lanes_fit_booleans
from .chosen import FLAT_CHOICES, check_applicable, chosen_threads
from .state import elements_of, grid_of, launch_of, widest_element, writes_param

HELD_LANES = 4
"""Most elements per access of an element-wise kernel whose threads keep a computed
intermediate in registers for several readers: ptxas spilled a float16 sigmoid kept for two
readers in vectors of 8 at every launch bound tried (16-72 B, fuzz graph 2612:22) and not in
vectors of 4; float32 never takes more than 4. A kept copy of an input (read at two places)
costs no arithmetic and keeps its 8 lanes. So do blocks computed lane by lane
(``Group.scalar_blocks``), each lane with indices and a conditional load of its own: a
float16 ``Where`` of a broadcast mask in vectors of 8 spilled 8 B on sm_90 at 48 registers
(fuzz graph 2612:1566), in vectors of 4 it took 40."""


def decide_flat(sch: s_tir.Schedule, func: tirx.PrimFunc, group: Group, reused: list[str],
                max_threads: int, gpu: GPU) -> Group:
    """Element-wise group: each thread owns one element. A producer read once is inlined; one
    read more often is computed once into a register of the thread, if every reader reads the
    thread's own element (else it is recomputed); inputs read at several places likewise."""
    check_applicable(group.choices, FLAT_CHOICES, "an element-wise")
    outputs = written_params(func, sch)
    sizes = {elements_of(p) for p in outputs}
    if len(sizes) != 1:
        raise Unstitchable(f"outputs of different sizes {sorted(sizes)}")
    size = sizes.pop()
    size_expr = symbolic_extent(list(outputs[0].shape)) if is_symbolic(size) else ""
    inlined: list[str] = []
    kept: list[Buffer] = []
    for block in reversed(child_blocks(sch)):
        if writes_param(sch, func, block):
            continue
        name = name_of(sch, block)
        buffer = sch.get(block).writes[0].source
        users = readers(sch, buffer, exclude=block)
        sites = sum(load_count(sch, u, buffer) for u in users)
        if (len(users) > 1 or sites > 1) and _element_aligned(sch, [block, *users], buffer, size):
            note = f"read by {len(users)} block(s) at {sites} place(s)"
            kept.append(Buffer(buffer.name, BufferRole.INTERMEDIATE, StorageLevel.REGISTER, 0, note,
                               name))
            continue
        try:
            inline(sch, block)
        except Exception as err:  # noqa: BLE001
            raise Unstitchable(f"element-wise block {name} cannot be inlined: "
                               f"{error_summary(err)}") from err
        inlined.append(name)
    staged = []
    written = {p.name for p in written_params(func, sch)}
    for param in buffer_params(func):
        if param.name in written:
            continue
        users = readers(sch, param)
        sites = sum(load_count(sch, u, param) for u in users)
        if sites > 1 and _element_aligned(sch, users, param, size):
            staged.append(Buffer(param.name, BufferRole.INPUT, StorageLevel.REGISTER, 0,
                                 f"read at {sites} places"))
    buffers = tuple(Buffer(n, BufferRole.OUTPUT, StorageLevel.REGISTER, 0,
                           "written out and read inside the kernel") for n in reused)
    widest = widest_element(sch, func)
    mapping = _chosen_flat(replace(
        flat_mapping(size, max_threads, widest, gpu,
                     chosen_threads(0, group.choices.block_threads, max_threads,
                                    "threads per block") or None),
        rows_expr=size_expr), group.choices, widest)
    if kept and mapping.vector > HELD_LANES:
        if group.choices.vector is not None:
            raise Unstitchable(f"vectors of {mapping.vector}: threads that keep intermediates "
                               f"in registers take at most {HELD_LANES} elements per access")
        mapping = replace(mapping, vector=HELD_LANES)
    regions = [r for b in child_blocks(sch) for r in (*sch.get(b).reads, *sch.get(b).writes)]
    if (kept or staged or reused) and (
            any(_reshaped(r) or _splits_vectors(r, mapping.vector) for r in regions)
            or _read_in_other_shapes(sch, {b.name for b in (*kept, *staged)})):
        # a register copy of a reshaped access, or of a vector that runs over the end of the
        # innermost axis (fuzz graph 4242:320, (4, 256, 14, 14) in vectors of 4: wrong
        # numbers), would be a bounding box around the vector
        mapping = replace(mapping, vector=1)
    sinks, _ = split_sinks(sch)
    scalar = tuple(name_of(sch, b) for b in sinks
                   if not lanes_fit_booleans(sch.get(b), mapping.vector))
    if scalar and mapping.vector > HELD_LANES:
        if group.choices.vector is not None:
            raise Unstitchable(f"vectors of {mapping.vector}: blocks computed lane by lane "
                               f"({', '.join(scalar)}) take at most {HELD_LANES} elements "
                               "per access")
        mapping = replace(mapping, vector=HELD_LANES)
        scalar = tuple(name_of(sch, b) for b in sinks
                       if not lanes_fit_booleans(sch.get(b), mapping.vector))
    if len(scalar) == len(sinks) and mapping.vector > 1 and group.choices.vector is None:
        # no access of the kernel is a vector: a thread's consecutive elements lane by lane
        # leave a warp's accesses strided, 4 sectors for each one a thread per element
        # touches (the Where of BERT's attention mask, booleans in, at (8, 1, 128, 128):
        # 2.7 MB of L2 sectors where TVM's kernel takes 1.9)
        mapping, scalar = replace(mapping, vector=1), ()
    return replace(group, mapping=mapping, inlined=tuple(inlined),
                   buffers=buffers + tuple(kept) + tuple(staged), shared_bytes=0,
                   shared_budget=0, scalar_blocks=scalar,
                   launch=launch_of(gpu, mapping.threads_per_block, 0, grid_of(mapping)))


def _chosen_flat(mapping: ThreadMapping, choices: Choices, element_bytes: int
                 ) -> ThreadMapping:
    """``mapping`` with the elements per access ``choices`` fixes: whole aligned vectors
    of at most ``VECTOR_BYTES`` (elements of ``element_bytes``) that the blocks divide, of
    a static count."""
    vector = choices.vector
    if vector is None or vector == mapping.vector:
        return mapping
    elements, threads = mapping.rows, mapping.threads_per_block
    if vector & (vector - 1) or vector * element_bytes > VECTOR_BYTES or (vector > 1 and (
            is_symbolic(elements) or elements % (threads * vector))):
        raise Unstitchable(f"vectors of {vector}: {elements} elements do not split into "
                           f"blocks of {threads} threads on whole vectors")
    return replace(mapping, vector=vector)


def _element_aligned(sch: s_tir.Schedule, blocks: list, buffer: tirx.Buffer, size: int
                     ) -> bool:
    """Whether every access of ``blocks`` to ``buffer`` touches the element the block is at,
    counting elements of the ``size``-element iteration space in row-major order, without
    wrapping around it: an index such as ``i % size`` is the element itself for every real
    element, but a thread past the last one (a partial block) would stage the range between
    its wrapped and unwrapped index in its registers."""
    for block in blocks:
        try:
            info = block_rows(sch, block, size)
        except Unstitchable:
            return False
        stmt = sch.get(block)
        for region in (*stmt.reads, *stmt.writes):
            if not region.source.same_as(buffer):
                continue
            if access_rows(info, region, size) is not RowAccess.ALIGNED \
                    or _wraps_around(region):
                return False
    return True


def _splits_vectors(region: tvm.ir.TensorRegion, vector: int) -> bool:
    """Whether vectors of ``vector`` consecutive elements of ``region``'s buffer may run over
    the end of its innermost axis (its extent is not a multiple of the width)."""
    shape = list(region.source.shape)
    if vector == 1 or not shape:
        return False
    last = shape[-1]
    return not isinstance(last, tirx.IntImm) or int(last) % vector != 0


def _read_in_other_shapes(sch: s_tir.Schedule, names: set[str]) -> bool:
    """Whether a block reads a buffer of ``names`` or a register copy of an output (kept in
    registers) in a shape other than
    its own (a reshape's reader, its indices unwrapped by ``transform.unwrap_indices``): the
    same elements, but once the sinks' loops are fused, compute-at bounds a vector's region
    of the register through the reader's divisions of the fused index only by an expression
    nvcc cannot evaluate, and the register goes to local memory (fuzz graph 4242:1746:
    Reshape and Sigmoid of a transpose of (2, 784, 384), a 112 B stack frame)."""
    for block in child_blocks(sch):
        stmt = sch.get(block)
        shapes = [list(w.source.shape) for w in stmt.writes]
        for region in stmt.reads:
            kept = region.source.name in names or region.source.scope() == LOCAL
            if kept and not any(
                    tvm_ffi.structural_equal(list(region.source.shape), shape)
                    for shape in shapes):
                return True
    return False


def _wraps_around(region: tvm.ir.TensorRegion) -> bool:
    """Whether the region's indices wrap around (``i % n``)."""
    found: list[tvm.ir.PrimExpr] = []
    for r in region.region:
        tvm_ffi.structural_walk(r.min, [((tirx.FloorMod, tirx.Mod), found.append)])
    return bool(found)


def _reshaped(region: tvm.ir.TensorRegion) -> bool:
    """Whether the region's indices divide or wrap the iteration space (a reshape)."""
    found: list[tvm.ir.PrimExpr] = []
    kinds = (tirx.FloorMod, tirx.Mod, tirx.FloorDiv, tirx.Div)
    for r in region.region:
        tvm_ffi.structural_walk(r.min, [(kinds, found.append)])
    return bool(found)
