"""Relax passes that apply stitching: StitchFuse (grouping -> Primitive functions -> FuseTIR)
and the fusion pass list of the "stitch" flow."""

from .passes import fusion_passes
from .stitch_fuse import StitchFuse, stitch

__all__ = ["StitchFuse", "stitch", "fusion_passes"]
