"""A register of a flat (element-wise) group holds one thread's elements, whatever the shape.
A bias add + erf-GELU on (2, 784, 384) float32 (a ViT-S MLP at 224x224) segfaulted on the SIMT
runner: the plan kept the bias add's result in registers, but TVM could not bound a thread's
region through the fused index's divisions on a 3-D shape and sized the register as the whole
intermediate (9408 floats per thread after OpenCL's shrinking; 2352 at (2, 196, 384)).
Owner: schedule/emit.py (``_register_per_thread``)."""

from __future__ import annotations

import pytest

from tvm_stitch.testing.differential import check_model
from tvm_stitch.workloads.graph import GraphBuilder


def _bias_gelu(shape: tuple[int, ...]) -> object:
    g = GraphBuilder("bias_gelu")
    h = g.op("Add", g.input("x", shape), g.weight("b", (shape[-1],)))
    erf = g.op("Erf", g.op("Mul", h, g.constant(0.7071067811865476)))
    return g.model([g.op("Mul", g.op("Mul", h, g.constant(0.5)),
                         g.op("Add", erf, g.constant(1.0)))])


@pytest.mark.parametrize("shape", [(2, 196, 384), (2, 784, 384), (3, 5, 7, 11)])
def test_registers_hold_one_threads_elements(shape: tuple[int, ...]) -> None:
    outcome = check_model(_bias_gelu(shape), "stitch", triage=False)
    assert outcome.kind == "ok" and not outcome.fallbacks, (outcome.error, outcome.fallbacks)
    assert outcome.violations == []  # no stack frame, no register over the plan's budget
