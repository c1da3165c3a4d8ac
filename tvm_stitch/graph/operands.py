"""Operand copies: the layout moves a compute kernel absorbs.

Attention splits heads out of the hidden axis after each projection, transposes the keys,
repeats shared key/value heads and merges the heads back before the output projection; a
windowed vision transformer partitions windows the same way. Each such copy is a kernel of
its own under TVM's fusion, reading and writing the whole tensor once more. dlight's matmul
rule reads an operand through copies inlined into its loads (prologue) and writes its result
through copies (epilogue), so absorbed copies cost neither a launch nor a DRAM round trip:

- epilogue: a chain of bijective copies that move whole rows (``Copy.VIEW``, ``Copy.ROWS``)
  reading the compute kernel's only result that leaves it; the matmul's stores stay
  contiguous along its innermost axis;
- prologue: copies read by the compute op alone, of any kind, and scalings (an element-wise
  op of one tensor and scalar constants, such as attention's query scale) between them; dlight
  stages operand tiles through shared memory in its own order, so a transposed, repeated or
  scaled operand costs it nothing more than a plain one.

A chain of reshapes only is left alone: TVM already makes a reshape a view.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from math import prod

import tvm

from .copies import Copy
from .dataflow import DataflowGraph, Node
from .ops import OpKind

_ROW_MOVES = (Copy.VIEW, Copy.ROWS)


@dataclass(frozen=True)
class Limits:
    """Compute ops (by label) whose kernel with copies found no schedule: ``read_only`` may
    still read through copies, ``alone`` absorbs none."""

    read_only: frozenset[str] = frozenset()
    alone: frozenset[str] = frozenset()


@dataclass(frozen=True)
class Absorbed:
    """The copies one compute kernel absorbs (node indices): it reads its operands through
    ``reads`` and writes its result through ``writes``."""

    reads: tuple[int, ...] = ()
    writes: tuple[int, ...] = ()


def absorbed_copies(graph: DataflowGraph, candidates: set[int],
                    kernels: Mapping[int, frozenset[int]], read_only: frozenset[int]
                    ) -> dict[int, Absorbed]:
    """The copies among ``candidates`` that each compute kernel absorbs: ``kernels`` maps a
    compute op's node index to the nodes of its kernel (it and its fused epilogue); the ops
    of ``read_only`` write through none. Epilogue chains are claimed before prologues."""
    taken: set[int] = set()
    writes: dict[int, list[int]] = {}
    for op, members in kernels.items():
        chain = [] if op in read_only else _epilogue(graph, members, candidates)
        if _worthwhile(graph, chain):
            writes[op] = chain
            taken.update(chain)
    reads: dict[int, list[int]] = {}
    for op in kernels:
        chain = _prologue(graph, op, candidates - taken)
        if _worthwhile(graph, chain):
            reads[op] = chain
            taken.update(chain)
    return {op: Absorbed(tuple(sorted(reads.get(op, ()))), tuple(writes.get(op, ())))
            for op in kernels if op in reads or op in writes}


def _epilogue(graph: DataflowGraph, members: frozenset[int], candidates: set[int]) -> list[int]:
    """Row-moving copies that follow, one after another, the kernel's only result."""
    inside = set(members)
    results = [i for i in inside if graph.nodes[i].escapes
               or any(c not in inside for c in graph.nodes[i].consumers)]
    if len(results) != 1:
        return []
    chain: list[int] = []
    last = graph.nodes[results[0]]
    while not last.escapes:
        readers = {c for c in last.consumers if c not in inside}
        if len(readers) != 1:
            break
        nxt = graph.nodes[readers.pop()]
        if nxt.index not in candidates or nxt.info.copy not in _ROW_MOVES \
                or set(nxt.producers) != {last.index}:
            break
        chain.append(nxt.index)
        inside.add(nxt.index)
        last = nxt
    return chain


def _prologue(graph: DataflowGraph, op: int, available: set[int]) -> list[int]:
    """Copies whose only reader is ``op`` or a copy already in its prologue. A repeating
    copy of what a memory-intensive op computes stays with that op: stitched there it is
    written once, and its (larger) result can share a kernel with other ops of its size."""
    chain: list[int] = []
    stack = [op]
    while stack:
        reader = stack.pop()
        for p in sorted(set(graph.nodes[reader].producers)):
            node = graph.nodes[p]
            if p in available and p not in chain and _moves_or_scales(node) \
                    and not node.escapes and set(node.consumers) == {reader}:
                chain.append(p)
                stack.append(p)
    for p in list(chain):
        node = graph.nodes[p]
        if p in chain and node.info.copy is Copy.REPEATED \
                and not _from_sources(graph, p, set(chain), available):
            chain = [i for i in chain if i not in _upstream(graph, p, set(chain))]
    return chain


def _moves_or_scales(node: Node) -> bool:
    """A copy, or a cheap element-wise op of one tensor and scalar constants."""
    if node.info.copy is not None:
        return True
    if node.info.kind not in (OpKind.ELEMWISE, OpKind.BROADCAST) or node.info.expensive:
        return False
    tensors = [a for a in node.inputs if not isinstance(a, tvm.ir.Constant)]
    return len(tensors) == 1 and all(
        prod(a.value.shape) == 1 for a in node.inputs if isinstance(a, tvm.ir.Constant))


def _from_sources(graph: DataflowGraph, node: int, chain: set[int], available: set[int]
                  ) -> bool:
    """Whether ``node`` reads, through copies of ``chain``, only values that no
    memory-intensive op computes (a compute op's result, an input, a constant)."""
    for p in graph.nodes[node].producers:
        if p in chain:
            if not _from_sources(graph, p, chain, available):
                return False
        elif p in available:
            return False
    return True


def _upstream(graph: DataflowGraph, node: int, chain: set[int]) -> set[int]:
    """``node`` and the members of ``chain`` it reads through."""
    found = {node}
    for p in graph.nodes[node].producers:
        if p in chain:
            found |= _upstream(graph, p, chain)
    return found


def _worthwhile(graph: DataflowGraph, chain: list[int]) -> bool:
    return any(graph.nodes[i].info.copy is not Copy.VIEW for i in chain)
