"""TIR scheduling of stitched groups: decisions per kernel, thread mapping, emission.

``decide`` completes a group's plan entry for its fused PrimFunc (Local/Regional/Global per
block, shared-memory staging within budget, thread mapping, phases, launch configuration);
``emit`` applies it and ``kernel`` finishes the kernel (persistent grid, launch bounds);
``StitchSchedule`` is the module pass that schedules every PrimFunc (stitched ones by their
plan, the others by dlight's default rules).
"""

from .decisions import decide
from .emit import Kernel, emit, kernel
from .mapping import flat_mapping, row_mapping
from .rows import Unstitchable
from .rule import StitchSchedule, default_rules

__all__ = ["decide", "emit", "kernel", "Kernel", "flat_mapping", "row_mapping", "Unstitchable",
           "StitchSchedule", "default_rules"]
