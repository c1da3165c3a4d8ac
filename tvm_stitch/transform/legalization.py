"""The stitch flow's legalization: the same passes as TVM's default CUDA legalization
(LegalizeOps, AnnotateTIROpPattern, FoldConstant), with LayerNorm's corrected two-pass mean
and variance, and a float16 sum, mean or softmax accumulating in float32 where TVM's
legalization accumulates in float16."""

from __future__ import annotations

import tvm
from tvm import relax
from tvm.ir import IRModule

from .corrected_layer_norm import LEGALIZATIONS
from .float32_reductions import FLOAT32_LEGALIZATIONS


def legalize(mod: IRModule) -> IRModule:
    """``mod`` with its Relax ops legalized to PrimFuncs (those already legalized kept),
    their op patterns annotated and constants folded."""
    return tvm.transform.Sequential([
        relax.transform.LegalizeOps({**LEGALIZATIONS, **FLOAT32_LEGALIZATIONS}),
        relax.transform.AnnotateTIROpPattern(),
        relax.transform.FoldConstant(),
    ])(mod)
