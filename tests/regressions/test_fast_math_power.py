"""``Pow(x, 2)`` gave NaN on an H200 for both flows (rms_norm; llama/t5 RMSNorm, gpt2's GELU
cube): TVM builds CUDA with ``--use_fast_math``, where ``powf(x, y)`` is
``exp2(y * log2(x))``, NaN for every negative ``x``. The SIMT runner's OpenCL ``pow`` is exact,
so only the GPU showed it (docs/results/gpu-2026-11-29.md). The stitch flow now writes a power
by a small integer as multiplications (``transform.ExactPower``); other exponents stay a
``powf``. Owner: transform/exact_power.py."""

from __future__ import annotations

import re

import numpy as np
import pytest
import tvm
from onnx import helper
from regression_models import model, needs_stitch
from tvm import relax, tirx

from tvm_stitch import verify
from tvm_stitch.lowering import lower
from tvm_stitch.simt import SimtModule
from tvm_stitch.target import cuda_target
from tvm_stitch.transform.exact_power import integer_exponent

pytestmark = needs_stitch


def _cuda_source(scheduled: tvm.IRModule) -> str:
    """The CUDA source of every kernel of the scheduled module's PrimFuncs."""
    return "\n".join(lower(func, gv.name_hint, cuda_target("sm_90")).source()
                     for gv, func in scheduled.functions_items()
                     if isinstance(func, tirx.PrimFunc))


@pytest.mark.parametrize(("exponent", "exact"), [(2.0, True), (3.0, True), (4.0, True),
                                                 (2.5, False)])
def test_small_integer_powers_are_multiplications(exponent: float, exact: bool) -> None:
    nodes = [helper.make_node("Pow", ["x", "n"], ["p"]),
             helper.make_node("ReduceMean", ["p", "axes"], ["y"], keepdims=1)]
    built = model(nodes, {"x": [8, 64]}, {"y": [8, 1]},
                  {"n": np.array(exponent, np.float32), "axes": np.array([-1], np.int64)})
    scheduled = verify.compile_model(built, "stitch")
    assert bool(re.search(r"\bpowf\(", _cuda_source(scheduled))) is not exact
    x = np.random.default_rng(0).standard_normal((8, 64)).astype(np.float32)
    if not exact:
        x = np.abs(x)  # a fractional power of a negative number is NaN in ONNX too
    (y,) = SimtModule(scheduled)(x)
    np.testing.assert_allclose(y, np.mean(x.astype(np.float64) ** exponent, axis=-1,
                                          keepdims=True), rtol=1e-5, atol=1e-6)


def test_integer_exponent() -> None:
    assert integer_exponent(relax.const(2.0, "float32")) == 2
    assert integer_exponent(relax.const(np.array([3.0], np.float32))) == 3
    assert integer_exponent(relax.const(2.5, "float32")) is None
    assert integer_exponent(relax.const(5.0, "float32")) is None
    assert integer_exponent(relax.const(2, "int32")) is None
