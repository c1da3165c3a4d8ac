"""TVM's default CUDA fusion and scheduling, kept as one call for side-by-side comparisons."""

from __future__ import annotations

import tvm
from tvm.relax.backend.cuda import pipeline as cuda_pipeline
from tvm.target import Target


def fusion_passes(target: Target) -> list[tvm.transform.Pass]:
    """LegalizeOps, FuseOps, FuseTIR and dlight's default GPU rules, exactly as TVM runs them."""
    return cuda_pipeline.legalize_passes(target)
