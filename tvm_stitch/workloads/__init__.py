"""The workload zoo: micro patterns and real-architecture blocks as ONNX models.

Each :class:`Workload` has a ``ci`` size (small enough for the CPU SIMT runner) and a ``real``
size. Micro patterns are built with ``onnx.helper``; model blocks are exported from
``transformers``/``torch`` into a cache directory on first use (the ``models`` extra)::

    from tvm_stitch import workloads
    model = workloads.get("layer_norm").model("ci")
    feeds = workloads.inputs(model, seed=0)
"""

from . import micro, models  # noqa: F401  (importing them registers their workloads)
from .inputs import Dist, inputs, integers, normal, prefix, uniform
from .models import ModelsExtraMissing, cache_dir, cached_path, export_model
from .registry import KINDS, SIZES, Workload, all_workloads, get, names

__all__ = [
    "KINDS",
    "SIZES",
    "Dist",
    "ModelsExtraMissing",
    "Workload",
    "all_workloads",
    "cache_dir",
    "cached_path",
    "export_model",
    "get",
    "inputs",
    "integers",
    "names",
    "normal",
    "prefix",
    "uniform",
]
