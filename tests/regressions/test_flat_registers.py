"""A register of a flat (element-wise) group holds one thread's elements, whatever the shape.
A bias add + erf-GELU on (2, 784, 384) float32 (a ViT-S MLP at 224x224) segfaulted on the SIMT
runner: the plan kept the bias add's result in registers, but TVM could not bound a thread's
region through the fused index's divisions on a 3-D shape and sized the register as the whole
intermediate (9408 floats per thread after OpenCL's shrinking; 2352 at (2, 196, 384)).
Owner: schedule/emit.py (``_register_per_thread``), schedule/decisions/flat.py."""

from __future__ import annotations

import numpy as np
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


def test_a_register_read_through_a_reshape_takes_scalars() -> None:
    # fuzz graph 4242:1746 (large 0.05): Min(x, 2) on (2, 784, 384), transposed to
    # (784, 2, 384), then a Reshape to (784, 2, 6, 64) and a Sigmoid, all outputs. The
    # transpose was kept in a register of vectors of 4 for both readers; with the reshape's
    # indices unwrapped, no division flagged it, and compute-at bounded the vector's region
    # of the register only by an expression nvcc cannot evaluate: 112 B of stack frame on
    # sm_80 and sm_90. A register read in another shape now takes scalars.
    g = GraphBuilder("reshape_of_a_register")
    low = g.op("Min", g.input("x", (2, 784, 384)), g.constant(2.0))
    moved = g.op("Transpose", low, perm=[1, 0, 2])
    split = g.op("Reshape", moved, g.constant([784, 2, 6, 64], dtype=np.int64))
    built = g.model([low, split, g.op("Sigmoid", moved)])
    outcome = check_model(built, "stitch", triage=False, resources=True)
    assert outcome.kind == "ok" and not outcome.fallbacks, (outcome.error, outcome.fallbacks)
    assert outcome.violations == []


def test_an_input_read_in_two_shapes_takes_scalars() -> None:
    # fuzz graph 4242:860 (large 0.05), shrunk: x (2, 3136, 96) compared with its own reshape
    # to (1, 2, 3136, 96), beside a LogSoftmax over axis -3 of it. The input kept in a
    # register of vectors of 4 for both shapes segfaulted the SIMT runner (the class of
    # graph 1746 above, fixed with it).
    g = GraphBuilder("input_in_two_shapes")
    x = g.input("x", (2, 3136, 96))
    log = g.op("Neg", g.op("LogSoftmax", x, axis=-3))
    again = g.op("Reshape", x, g.constant([1, 2, 3136, -1], dtype=np.int64))
    picked = g.op("Where", g.op("GreaterOrEqual", again, x), x, g.constant(1.5))
    built = g.model([log, picked, g.op("Neg", x)])
    outcome = check_model(built, "stitch", triage=False, resources=True)
    assert outcome.kind == "ok", outcome.error
    assert outcome.violations == []


def test_two_readers_of_one_element_through_a_reshape_share_a_register_copy() -> None:
    # fuzz graph 1206:11 (large 0.5), shrunk: x on (2048, 4096) read by tanh/exp and by
    # abs/add/pow. The readers reach a thread's element as bx % 4 * 1024 + tx * 4 and as
    # bx * 1024 + tx * 4 - bx // 4 * 4096 (through the pow's reshape); TVM proves them equal
    # but kept both, so the register copy of x covered a min/max of the two: a run-time trip
    # count, an array indexed at run time, and 112 B of stack per thread on sm_80 and sm_90.
    # The kernel now settles each min/max its domains order (transform/settle_bounds.py).
    g = GraphBuilder("two_readers")
    x = g.input("x", (2048, 4096))
    e = g.op("Exp", g.op("Tanh", x))
    s = g.op("Sqrt", g.op("Add", g.op("Abs", e), g.constant(0.5)))
    p = g.op("Pow", g.op("Add", g.op("Abs", x), g.constant(0.5)), g.constant(2.0))
    outcome = check_model(g.model([e, s, p]), "stitch", triage=False)
    assert outcome.kind == "ok" and not outcome.fallbacks, (outcome.error, outcome.fallbacks)
    assert outcome.violations == []


@pytest.mark.parametrize(("shape", "split"), [((8, 1000), (8, 250, 4)),
                                               ((512, 1024), (512, 16, 64))])
def test_an_input_held_for_a_reshaped_output_is_one_register(
        shape: tuple[int, ...], split: tuple[int, ...]) -> None:
    # fuzz graph 12040:100, shrunk: Where(x >= 0, x, y) on (8, 1000), reshaped to
    # (8, 250, 4). x, read twice, was held in a register that TVM sized to all of x per
    # thread (its region through the reshape's divisions unbounded): 4 KB of stack on sm_80
    # and sm_90. The sink reads the register at its own flat position, so it holds the
    # thread's element; beside it, a SiLU split into heads.
    g = GraphBuilder("held_for_a_reshape")
    x = g.input("x", shape)
    picked = g.op("Where", g.op("GreaterOrEqual", x, g.constant(0.0)), x, g.input("y", shape))
    silu = g.op("Mul", x, g.op("Sigmoid", x))
    built = g.model([g.op("Reshape", out, g.constant(list(split), dtype=np.int64))
                     for out in (picked, silu)])
    outcome = check_model(built, "stitch", triage=False)
    assert outcome.kind == "ok" and not outcome.fallbacks, (outcome.error, outcome.fallbacks)
    assert outcome.violations == []
