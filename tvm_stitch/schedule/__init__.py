"""TIR scheduling of stitched groups: decisions per kernel, thread mapping, emission.

``decide`` completes a group's plan entry for its fused PrimFunc (Local/Regional per block,
shared-memory staging within budget, thread mapping); ``emit`` applies it; ``StitchSchedule``
is the module pass that schedules every PrimFunc (stitched ones by their plan, the others by
dlight's default rules).
"""

from .decisions import decide
from .emit import emit
from .mapping import flat_mapping, row_mapping
from .rows import Unstitchable
from .rule import StitchRule, StitchSchedule, default_rules

__all__ = ["decide", "emit", "flat_mapping", "row_mapping", "Unstitchable", "StitchRule",
           "StitchSchedule", "default_rules"]
