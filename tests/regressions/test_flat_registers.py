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


@pytest.mark.parametrize("compare", ["Less", "Equal"])
def test_vectors_across_the_innermost_axis_are_not_cached_as_boxes(compare: str) -> None:
    # fuzz graph 4242:320 (large 0.05), shrunk: Where(x < 0, x, 1.5) on (4, 256, 14, 14). The
    # input read twice was kept in registers for vectors of 4, which run over the end of the
    # innermost axis of 14: the copy covered whole rows of 14 modulo 4 slots (max error 5.99)
    # and a stack frame of 112 B. Such a group now takes scalars.
    g = GraphBuilder("where_" + compare.lower())
    x = g.input("x", (4, 256, 14, 14))
    picked = g.op("Where", g.op(compare, x, g.constant(0.0)), x, g.constant(1.5))
    outcome = check_model(g.model([picked]), "stitch", triage=False)
    assert outcome.kind == "ok" and not outcome.fallbacks, (outcome.error, outcome.fallbacks)
    assert outcome.violations == []
