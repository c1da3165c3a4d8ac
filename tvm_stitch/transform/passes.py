"""The fusion and scheduling passes of the "stitch" flow.

SplitToSlices (each part of a split is a slice, which stitches with its readers),
IdentityViews (a same-type cast, an identity transpose or an expand to the same shape is a
view of its input, as TVM's flow makes it in the end), ExactPower
(``power`` by a small integer is multiplications: TVM's fast-math CUDA ``powf`` is NaN for
negative bases), UnitReduction (a sum, mean, max, min or prod over axes of extent 1 is a
reshape: TVM's fused schedule of such a reduction applies its epilogue to the accumulator),
StackReduction (a reduction over the axis a stack made, TVM's import of a variadic Max, Min,
Sum or Mean, is an element-wise fold of the stacked tensors), then StitchFuse in place of
FuseOps + FuseTIR (it rewrites reductions over axes mixed with kept ones, and softmaxes over
a middle axis, into the same op over a transposed input whose reduced axes trail,
``mixed_reduction``, where that stitches, and legalizes as TVM's default CUDA pipeline does,
``legalization``), then StitchSchedule in place of dlight's ApplyDefaultSchedule, then
SharedArguments (a kernel passed one tensor as two inputs reads it through one parameter).
"""

from __future__ import annotations

import tvm
from tvm.target import Target

from ..schedule.rule import StitchSchedule
from .exact_power import ExactPower
from .identity_views import IdentityViews
from .shared_arguments import SharedArguments
from .split_slices import SplitToSlices
from .stack_reduction import StackReduction
from .stitch_fuse import StitchFuse
from .unit_reduction import UnitReduction


def fusion_passes(target: Target) -> list[tvm.transform.Pass]:
    """Split rewriting, legalization, stitch fusion and scheduling for ``target``."""
    return [
        SplitToSlices(),
        IdentityViews(),
        ExactPower(),
        UnitReduction(),
        StackReduction(),
        StitchFuse(target),
        StitchSchedule(target),
        SharedArguments(),
    ]
