"""tvm-stitch: operator stitching (AStitch) for the memory-intensive parts of models, on TVM.

``import tvm_stitch`` is enough to use the compile flows:
``tvm_stitch.pipeline.lower(mod, "cuda", flow)`` gives the scheduled module that
``tvm_stitch.pipeline.build`` turns into an executable and ``tvm_stitch.simt`` runs on the CPU.
It also registers the Relax pipeline ``"stitch"``, so that
``tvm.compile(mod, target, relax_pipeline="stitch")`` compiles with stitching.
``tvm_stitch.compile_onnx(path, target)`` (``tvm_stitch.deploy``, imported on first use)
compiles an ONNX model into a library to deploy and its sidecar.
"""

import tvm
from tvm import relax
from tvm.target import Target

from .pipeline import available_flows, build, finish_passes, lower, schedule_passes

__version__ = "0.1.0"
__all__ = ["available_flows", "build", "compile_onnx", "lower", "__version__"]


def __getattr__(name: str) -> object:
    """``compile_onnx`` from ``tvm_stitch.deploy``, imported when first asked for so that
    ``import tvm_stitch`` does not load the ONNX front end and the tuning database."""
    if name == "compile_onnx":
        from .deploy import compile_onnx

        return compile_onnx
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _stitch_pipeline() -> tvm.transform.Pass:
    """The "stitch" Relax pipeline: TVM's default CUDA pipeline with stitch fusion and
    scheduling of the memory-intensive groups. The target is the one ``tvm.compile`` sets."""

    @tvm.transform.module_pass(opt_level=0, name="StitchPipeline")
    def _pipeline(mod: tvm.ir.IRModule, _ctx: tvm.transform.PassContext) -> tvm.ir.IRModule:
        target = Target.current(allow_none=False)
        with target:
            seq = tvm.transform.Sequential(schedule_passes("stitch", target)
                                           + finish_passes(target))
            return seq(mod)

    return _pipeline


if "stitch" not in relax.pipeline.PIPELINE_MAP:
    relax.pipeline.register_pipeline("stitch")(_stitch_pipeline)
