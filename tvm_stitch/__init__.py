"""tvm-stitch: operator stitching (AStitch) for the memory-intensive parts of models, on TVM.

``import tvm_stitch`` is enough to use the compile flows:
``tvm_stitch.pipeline.lower(mod, "cuda", flow)`` gives the scheduled module that
``tvm_stitch.pipeline.build`` turns into an executable and ``tvm_stitch.simt`` runs on the CPU.
"""

from .pipeline import available_flows, build, lower

__version__ = "0.1.0"
__all__ = ["available_flows", "build", "lower", "__version__"]
