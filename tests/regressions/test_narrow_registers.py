"""float16 values take more registers than their count says: rows held in registers beside
an element-wise output, and column maxima accumulated in registers (fuzz seed 852171 graph
13, drawn by CI's bounded sample).

- A float16 LayerNorm over rows of 20000 beside ``|x|``, x held in registers (20 elements a
  thread of 1024), spilled 32 B on sm_90: its readers keep each element widened for the
  statistics and at its own type for ``|x|``. A held element narrower than 32 bits is now
  budgeted two registers (``decisions.budget._element_registers``); x is read again.
- The same LayerNorm over rows of 30000 with a column maximum of ``|x|``, ``sign(x)`` and
  ``|x|`` beside it: a Global kernel keeping 30 float16 partial maxima a thread of 1024 in
  registers spilled 88 B at the cap of 64. TVM's CUDA code takes a float16 maximum as a
  select of two ``half`` objects, which ptxas keeps copies of (with ``__hmax``, or float32
  sums, no spill); such a sum is now budgeted two registers
  (``decisions.global_stitch._selects_narrow``), the maximum's partial sums fit nowhere, and
  it is given back to TVM's fusion while the rest stitches.
Owner: schedule/decisions (budget.py, global_stitch.py)."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper
from regression_models import model

from tvm_stitch import verify
from tvm_stitch.plan import StitchPlan, StorageLevel
from tvm_stitch.testing.differential import check_model


def _layer_norm_beside(rows: int, width: int, elem_type: int, column_max: bool = False):
    """LayerNorm over (rows, width) and ``|x|`` beside it; with ``column_max`` also the
    maximum of ``|x|`` over the rows and ``sign(x)`` (fuzz graph 852171:13's first group)."""
    dtype = np.float16 if elem_type == TensorProto.FLOAT16 else np.float32
    rng = np.random.default_rng(0)
    nodes = [helper.make_node("LayerNormalization", ["x", "g", "b"], ["y"], axis=1,
                              epsilon=1e-5),
             helper.make_node("Abs", ["x"], ["a"])]
    outputs = {"y": [rows, width], "a": [rows, width]}
    constants = {"g": rng.random(width).astype(dtype), "b": rng.random(width).astype(dtype)}
    if column_max:
        nodes += [helper.make_node("ReduceMax", ["a", "axes"], ["m"], keepdims=1),
                  helper.make_node("Sign", ["x"], ["s"])]
        outputs |= {"m": [1, width], "s": [rows, width]}
        constants["axes"] = np.array([0], np.int64)
    return model(nodes, {"x": [rows, width]}, outputs, constants, elem_type)


def _checked(built) -> StitchPlan:
    """The plan of ``built``, after checking it against onnxruntime on the SIMT runner with
    every kernel's resources (no spill, no stack frame) for sm_80 and sm_90."""
    outcome = check_model(built, "stitch")
    assert outcome.kind == "ok" and not outcome.violations, (outcome.error, outcome.violations)
    return StitchPlan.of_module(verify.compile_model(built, "stitch"))


def _x_level(plan: StitchPlan) -> StorageLevel:
    (group,) = plan.groups
    assert group.mapping.threads_per_row == 1024 and group.row_split == 1, group
    return next(b.level for b in group.buffers if b.name == "x")


# 160 rows fill the GPU: no task splitting (two rows are split over 16 blocks each)
@pytest.mark.nvcc
def test_float16_rows_beside_an_output_of_their_own_are_read_again() -> None:
    plan = _checked(_layer_norm_beside(160, 20000, TensorProto.FLOAT16))
    assert _x_level(plan) is StorageLevel.GLOBAL and not plan.fallbacks


@pytest.mark.nvcc
def test_float32_rows_beside_an_output_of_their_own_stay_in_registers() -> None:
    # one register an element: 32 a thread of 1024 fit beside |x|
    plan = _checked(_layer_norm_beside(160, 32768, TensorProto.FLOAT))
    assert _x_level(plan) is StorageLevel.REGISTER


@pytest.mark.nvcc
def test_float16_column_maxima_that_fit_no_registers_go_back_to_tvm() -> None:
    built = _layer_norm_beside(2, 30000, TensorProto.FLOAT16, column_max=True)
    plan = _checked(built)
    fallback = next(f for f in plan.fallbacks if "partial sums" in f.reason)
    assert [op.partition(":")[2] for op in fallback.ops] == ["max"], fallback
    assert "in registers 60 per thread" in fallback.reason, fallback.reason
    stitch = verify.summarize(verify.compile_model(built, "stitch"), built)
    baseline = verify.summarize(verify.compile_model(built, "baseline"), built)
    assert stitch["kernels"] < baseline["kernels"], (stitch, baseline)
    assert stitch["global_bytes"] <= baseline["global_bytes"], (stitch, baseline)
