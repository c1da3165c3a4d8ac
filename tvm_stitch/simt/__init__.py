"""CPU SIMT runner: GPU-scheduled TIR executed for real through OpenCL on PoCL."""

from .kernel import SimtFunction
from .module import SimtModule

__all__ = ["SimtFunction", "SimtModule"]
