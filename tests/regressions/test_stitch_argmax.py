"""ArgMax/ArgMin (and Hardmax, built on them) through the stitch flow. The reduction's second
buffer (the running maximum) was left a global-scope allocation inside the stitched kernel,
which neither CUDA ("Cannot allocate global memory when targeting CUDA") nor OpenCL can build.
Found by ONNX's node tests (test_argmax_*, test_hardmax_*); the stitch flow now lists such a
group as a fallback ("lowering failed") and TVM's path builds it. Owner: schedule/."""

from __future__ import annotations

import pytest
from onnx import TensorProto, helper
from regression_models import model, needs_stitch

from tvm_stitch.testing.differential import check_model

pytestmark = needs_stitch


@pytest.mark.parametrize("op", ["ArgMax", "ArgMin"])
@pytest.mark.parametrize(("shape", "axis"), [([2, 2], 1), ([4, 33], 1), ([3, 4, 5], 2)])
def test_stitch_runs_argmax(op: str, shape: list[int], axis: int) -> None:
    out = [1 if i == axis else d for i, d in enumerate(shape)]
    built = model([helper.make_node(op, ["x"], ["y"], axis=axis, keepdims=1)], {"x": shape},
                  {"y": out})
    built.graph.output[0].type.tensor_type.elem_type = TensorProto.INT64
    outcome = check_model(built, "stitch", triage=False)
    assert outcome.kind == "ok" and not outcome.violations, outcome.error


def test_stitch_runs_hardmax() -> None:
    hardmax = model([helper.make_node("Hardmax", ["x"], ["y"], axis=-1)], {"x": [6, 20]},
                    {"y": [6, 20]})
    assert check_model(hardmax, "stitch", triage=False).kind == "ok"
