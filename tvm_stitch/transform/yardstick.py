"""The yardstick of a stitched group: TVM's own fusion of the same ops.

Stitching must never move more global bytes than TVM's fusion would for the same ops, nor need
more kernels (a stitched group is one kernel, and it replaces at least one of TVM's). A group
whose stitched kernel moves more falls back, both counts in its reason: a flat group whose
transposed output recomputes its producers at other elements, say, re-reads their inputs where
TVM writes the value once and reads it back.

A Global group (a persistent grid) is measured by what it reads of its inputs and its outputs
once: its partial sums make a round trip through global memory by design (``global_bytes``).
The check is cheap where it passes easily: TVM's kernels move at least their
compulsory bytes (inputs once, outputs once), so a stitched kernel within their sum needs
nothing more. Only above it are TVM's kernels for those ops scheduled (dlight's default
rules, as in the baseline flow) and counted, once per outlined function.
"""

from __future__ import annotations

from tvm import relax, tirx
from tvm.target import Target

from ..analysis.report import global_bytes
from ..graph.tvm_fusion import TVMFusion
from ..lowering import lower
from ..schedule.rule import default_rules, schedule_func
from ..symbolic import yardstick_sizes


class Yardstick:
    """TVM's fusion of a module (``tvm_fusion``) as the measure of its stitched groups."""

    def __init__(self, fusion: TVMFusion, target: Target) -> None:
        self._fusion = fusion
        self._target = target
        self._fused_tir = None
        self._bytes: dict[tuple, int | None] = {}

    def excess(self, members: frozenset[relax.Var], stitched: int,
               sizes: dict[str, int] | None = None) -> str | None:
        """Why a stitched kernel of the ops ``members`` moving ``stitched`` bytes is worse
        than TVM's fusion of the same ops, or None when it is not (or cannot be compared:
        TVM fuses some of them with other ops). ``sizes`` are the sizes the stitched kernel
        was counted at when its shapes are symbolic (``yardstick_sizes``); TVM's kernels are
        counted at the same."""
        covering = self._covering(members)
        if covering is None:
            return None
        least = [g.compulsory_bytes for g in covering]
        if None not in least and stitched <= sum(least):
            return None
        moved = [0 if g.compulsory_bytes == 0 else self._kernel_bytes(g.function, sizes)
                 for g in covering]  # 0: a reshape, which TVM makes a view
        if None in moved or stitched <= sum(moved):
            return None
        at = "" if not sizes else " at " + ", ".join(f"{k}={v}" for k, v in sizes.items())
        return (f"the stitched kernel moves {stitched} B of global memory{at}, TVM's fusion of "
                f"the same ops {sum(moved)} B in {len(covering)} kernel(s)")

    def kernels(self, members: frozenset[relax.Var]) -> int | None:
        """How many kernels TVM's fusion runs the ops ``members`` in; None when it fuses
        some of them with other ops."""
        covering = self._covering(members)
        return None if covering is None else len(covering)

    def _covering(self, members: frozenset[relax.Var]) -> list | None:
        """TVM's fusion groups of the ops ``members``; None when one also has other ops."""
        covering = [g for g in self._fusion.groups if g.members & members]
        if not covering or any(not g.members <= members for g in covering):
            return None
        return covering

    def _kernel_bytes(self, function: str, sizes: dict[str, int] | None) -> int | None:
        key = (function, tuple(sorted((sizes or {}).items())))
        if key not in self._bytes:
            if self._fused_tir is None:
                self._fused_tir = relax.transform.FuseTIR()(self._fusion.fused)
            func = self._fused_tir[function]
            scheduled = None
            if isinstance(func, tirx.PrimFunc):
                with self._target:
                    scheduled = schedule_func(func, self._target, default_rules())
            self._bytes[key] = None if scheduled is None else global_bytes(
                lower(scheduled, function, self._target), sizes=self._sizes_of(func, sizes))
        return self._bytes[key]

    @staticmethod
    def _sizes_of(func: object, sizes: dict[str, int] | None) -> dict[str, int] | None:
        """``sizes`` for the shape variables of TVM's kernel ``func``, each at
        ``YARDSTICK_SIZE`` where the stitched kernel has no such variable."""
        if not sizes or not isinstance(func, tirx.PrimFunc):
            return sizes
        return {**yardstick_sizes(func), **sizes}
