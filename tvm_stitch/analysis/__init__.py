"""Traffic and launch accounting of compiled modules.

``analyze(tvm_stitch.pipeline.lower(mod, "cuda"))`` gives a ``ModuleReport``: kernels
launched per run, global bytes per kernel counted from the finalised device TIR, compulsory
bytes, traffic ratio and a roofline time per GPU; ``.to_dict()`` for JSON, ``.render()`` for
a text table. ``ptxas_resources`` reads registers and shared memory from ``ptxas -v``.
"""

from .classify import has_contraction
from .ptxas import KernelResources, PtxasError, lowered_resources, ptxas_resources
from .report import (
    KernelReport,
    ModuleReport,
    analyze,
    analyze_primfunc,
    lowered_reports,
    render,
    static_bytes,
)
from .roofline import (
    GPU,
    GPUS,
    KernelWork,
    effective_bandwidth,
    gpu_of_arch,
    kernel_time_us,
    waves,
)
from .traffic import AnalysisError, BufferTraffic, KernelTraffic, count_traffic

__all__ = [
    "GPU",
    "GPUS",
    "AnalysisError",
    "BufferTraffic",
    "KernelReport",
    "KernelResources",
    "KernelTraffic",
    "KernelWork",
    "lowered_reports",
    "static_bytes",
    "ModuleReport",
    "PtxasError",
    "analyze",
    "analyze_primfunc",
    "count_traffic",
    "effective_bandwidth",
    "gpu_of_arch",
    "has_contraction",
    "kernel_time_us",
    "lowered_resources",
    "ptxas_resources",
    "render",
    "waves",
]
