"""The yardstick of a stitched group: TVM's own fusion of the same ops.

Stitching must never move more global bytes than TVM's fusion would for the same ops, nor need
more kernels (a stitched group is one kernel, and it replaces at least one of TVM's). A group
whose stitched kernel moves more falls back, both counts in its reason: a flat group whose
transposed output recomputes its producers at other elements, say, re-reads their inputs where
TVM writes the value once and reads it back.

A Global group (a persistent grid) is measured by what it reads of its inputs and its outputs
once: its partial sums make a round trip through global memory by design (``global_bytes``),
bought for parallelism or for the launches it saves. Moving more with its partial sums, it
must also pass ``slower`` (``stitch_fuse._worse``): where TVM runs its ops in one kernel,
none is saved, and it must be estimated faster (``ONE_KERNEL_MARGIN``).
The check is cheap where it passes easily: TVM's kernels move at least their
compulsory bytes (inputs once, outputs once), so a stitched kernel within their sum needs
nothing more. Only above it are TVM's kernels for those ops scheduled (dlight's default
rules, as in the baseline flow) and counted, once per outlined function.

A group that remote stitching gave element-wise parts (``OpGroup.joined``) must also pay
for itself in time: estimated (the roofline model, ``analysis.roofline``) more than
``TIME_MARGIN`` times slower than TVM's kernels for the same ops, its element-wise parts are
grouped on their own. Such a part given to the blocks of a few short reduced rows (exp(y) of
(4, 1M) beside the sums of (4, 8) on 4 blocks, 223 us, where TVM's two kernels take 15.5 us)
saves a launch and leaves the GPU idle. The same floor makes the check cheap: TVM's kernels
take at least a launch each and their compulsory bytes at peak bandwidth.
"""

from __future__ import annotations

from tvm import relax, tirx
from tvm.target import Target

from ..analysis.report import estimated_us, global_bytes
from ..analysis.roofline import GPU, TIME_MARGIN
from ..graph.tvm_fusion import TVMFusion
from ..lowering import LoweredFunc, lower
from ..schedule.rule import default_rules, schedule_func
from ..symbolic import yardstick_sizes

ONE_KERNEL_MARGIN = 1.0
"""``TIME_MARGIN`` for a Global kernel whose partial sums move more than TVM's fusion runs
the same ops in one kernel: it saves no launch, and is taken only where estimated faster.
A softmax down the 1000 rows of (1000, 8) moved 144 KB, estimated at 6.6 us, where TVM's
kernel moves 128 KB in 5.3 (fuzz graph 12046:152)."""


class Yardstick:
    """TVM's fusion of a module (``tvm_fusion``) as the measure of its stitched groups.

    ``origins``, when given, says that the stitched module was rewritten from the measured
    one: its bindings named there were made for the op of the measured module's binding
    of the name given (``mixed_reduction.mixed_reductions``); the others have the same
    names in both."""

    def __init__(self, fusion: TVMFusion, target: Target,
                 origins: dict[str, str] | None = None) -> None:
        self._fusion = fusion
        self._origins = origins
        self._named = {v.name: v for g in fusion.groups for v in g.members} \
            if origins is not None else {}
        self._target = target
        self._fused_tir = None
        self._lowered: dict[str, LoweredFunc | None] = {}

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

    def slower(self, members: frozenset[relax.Var], stitched_us: float, gpu: GPU,
               sizes: dict[str, int] | None = None, partial_sums: bool = False
               ) -> str | None:
        """Why a stitched kernel of the ops ``members`` estimated at ``stitched_us`` on
        ``gpu`` is too slow beside TVM's fusion of the same ops (more than ``TIME_MARGIN``
        times slower; with ``partial_sums`` that make it move more, ``ONE_KERNEL_MARGIN``
        where TVM runs the ops in one kernel), or None when it is not or cannot be compared;
        ``sizes`` as for ``excess``."""
        covering = self._covering(members)
        if covering is None:
            return None
        launches = sum(g.compulsory_bytes != 0 for g in covering)  # a view launches nothing
        margin = ONE_KERNEL_MARGIN if partial_sums and launches == 1 else TIME_MARGIN
        least = [g.compulsory_bytes for g in covering]
        if None not in least:
            floor = sum(gpu.launch_overhead_us + b / gpu.bandwidth * 1e6 for b in least if b)
            if stitched_us <= margin * floor:
                return None
        times = [0.0 if g.compulsory_bytes == 0 else self._kernel_us(g.function, sizes, gpu)
                 for g in covering]
        if None in times or stitched_us <= margin * sum(times):
            return None
        return (f"the stitched kernel is estimated at {stitched_us:.1f} us on the {gpu.name}, "
                f"TVM's fusion of the same ops at {sum(times):.1f} us in {len(covering)} "
                "kernel(s)")

    def extra_kernels(self, groups: list[frozenset[relax.Var]],
                      launching: frozenset[relax.Var]) -> list[tuple[list[int], str]]:
        """The stitched groups (the ops of each, one kernel each) that run ops TVM's fusion
        runs in fewer kernels: over each set of stitched groups and TVM's kernels linked by
        the ops they share, more kernels of ours than TVM's kernels that are not views. Ours
        are the stitched groups and, for each of those kernels of TVM's that also runs an op
        of ``launching`` (ops left out of every group that launch a kernel: fallbacks,
        compute ops), at least one more: that op runs apart from the stitched groups. The
        indices in ``groups`` of each such set, and why. A per-group yardstick cannot see
        this: each group alone shares a kernel of TVM's with ops outside it (an expand
        grouped apart from the reduction that TVM fuses it with, fuzz graph 10007:230; a
        transpose left alone beside the comparison and where that TVM fuses it with,
        12032:231)."""
        groups = [self._measured(members) for members in groups]
        launching = self._measured(launching)
        root = list(range(len(groups) + len(self._fusion.groups)))

        def find(i: int) -> int:
            while root[i] != i:
                root[i] = root[root[i]]
                i = root[i]
            return i

        for j, tvm_group in enumerate(self._fusion.groups, len(groups)):
            for i, members in enumerate(groups):
                if members & tvm_group.members:
                    root[find(i)] = find(j)
        found: dict[int, tuple[list[int], list[int], list[int]]] = {}
        for i in range(len(groups)):
            found.setdefault(find(i), ([], [], []))[0].append(i)
        for j, tvm_group in enumerate(self._fusion.groups, len(groups)):
            if find(j) in found and tvm_group.compulsory_bytes != 0:
                found[find(j)][1].append(j)
                if tvm_group.members & launching:
                    found[find(j)][2].append(j)
        return [(ours, f"{len(ours)} stitched kernels"
                 + (f", and at least {len(apart)} more for ops left out of them," if apart
                    else "") + f" for ops that TVM's fusion runs in {len(kernels)}")
                for ours, kernels, apart in found.values()
                if kernels and len(ours) + len(apart) > len(kernels)]

    def kernels(self, members: frozenset[relax.Var]) -> int | None:
        """How many kernels TVM's fusion runs the ops ``members`` in; None when it fuses
        some of them with other ops."""
        covering = self._covering(members)
        return None if covering is None else len(covering)

    def _covering(self, members: frozenset[relax.Var]) -> list | None:
        """TVM's fusion groups of the ops ``members``; None when one also has other ops."""
        members = self._measured(members)
        covering = [g for g in self._fusion.groups if g.members & members]
        if not covering or any(not g.members <= members for g in covering):
            return None
        return covering

    def _measured(self, members: frozenset[relax.Var]) -> frozenset[relax.Var]:
        """The bindings of the measured module that ``members`` stand for."""
        if self._origins is None:
            return members
        return frozenset(self._named.get(self._origins.get(v.name, v.name), v)
                         for v in members)

    def _kernel_bytes(self, function: str, sizes: dict[str, int] | None) -> int | None:
        lowered, at = self._lowered_kernel(function, sizes)
        return None if lowered is None else global_bytes(lowered, sizes=at)

    def _kernel_us(self, function: str, sizes: dict[str, int] | None, gpu: GPU
                   ) -> float | None:
        lowered, at = self._lowered_kernel(function, sizes)
        return None if lowered is None else estimated_us(lowered, gpu, at)

    def _lowered_kernel(self, function: str, sizes: dict[str, int] | None
                        ) -> tuple[LoweredFunc | None, dict[str, int] | None]:
        """TVM's kernel ``function`` scheduled by dlight and lowered (None when dlight does
        not schedule it), lowered once, and the sizes to count it at."""
        if self._fused_tir is None:
            self._fused_tir = relax.transform.FuseTIR()(self._fusion.fused)
        func = self._fused_tir[function]
        if function not in self._lowered:
            scheduled = None
            if isinstance(func, tirx.PrimFunc):
                with self._target:
                    scheduled = schedule_func(func, self._target, default_rules())
            self._lowered[function] = None if scheduled is None else lower(
                scheduled, function, self._target)
        return self._lowered[function], self._sizes_of(func, sizes)

    @staticmethod
    def _sizes_of(func: object, sizes: dict[str, int] | None) -> dict[str, int] | None:
        """``sizes`` for the shape variables of TVM's kernel ``func``, each at
        ``YARDSTICK_SIZE`` where the stitched kernel has no such variable."""
        if not sizes or not isinstance(func, tirx.PrimFunc):
            return sizes
        return {**yardstick_sizes(func), **sizes}
