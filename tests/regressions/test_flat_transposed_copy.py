"""A flat kernel computes the producers it keeps in registers at the thread's vector
before that index is split over block and thread, so that TVM bounds their regions through
one variable: every such loop has a fixed trip count. Computed at the thread, the indices
were divisions of remainders of ``blockIdx.x * n + threadIdx.x``, and TVM did not see that
two of them were one element. Fuzz graph 12017:395: x of (8, 64, 56, 56), Transpose to
(64, 56, 56, 8), Max with 8 constants, beside erf/abs/add/log of x, 4 lanes per thread: the
register copy of the transpose ran a loop of ``max(a, b) + 1 - min(a, b)`` steps (one in
fact) that the traffic counter refused ("trip count of loop ax2 ... does not reduce to a
constant"). Fuzz graph 12018:283: ``|x| + 0.5`` of (3, 100) read by a (3, 25, 4) reshape
and by a power, one lane per thread: the same. Owner: schedule/emit.py (``_map_flat``)."""

from __future__ import annotations

import numpy as np
from onnx import helper
from regression_models import model, needs_stitch
from tvm.target import Target

from tvm_stitch.analysis import analyze
from tvm_stitch.lowering import lower
from tvm_stitch.plan import MappingKind, StitchPlan
from tvm_stitch.testing.differential import check_model
from tvm_stitch.verify import compile_model

pytestmark = needs_stitch


def _transposed_beside_element_wise(channels: int) -> object:
    shape, moved = [8, channels, 56, 56], [channels, 56, 56, 8]
    nodes = [helper.make_node("Transpose", ["x"], ["t"], perm=[1, 2, 3, 0]),
             helper.make_node("Erf", ["x"], ["e"]),
             helper.make_node("Abs", ["e"], ["a"]),
             helper.make_node("Add", ["a", "half"], ["y"]),
             helper.make_node("Log", ["y"], ["l"]),
             helper.make_node("Max", ["t", "low"], ["m"])]
    return model(nodes, {"x": shape}, {"t": moved, "y": shape, "l": shape, "m": moved},
                 {"half": np.array(0.5, np.float32),
                  "low": np.linspace(-1, 1, 8, dtype=np.float32)})


def test_a_transposed_copy_in_a_flat_kernel_has_a_fixed_trip_count() -> None:
    built = _transposed_beside_element_wise(4)
    scheduled = compile_model(built, "stitch")
    (group,) = StitchPlan.of_module(scheduled).groups
    assert group.mapping.kind is MappingKind.FLAT and group.mapping.vector > 1, group
    source = lower(scheduled[group.function], group.function,
                   Target({"kind": "cuda", "arch": "sm_90"})).source()
    assert "max(" not in source.split("for (", 2)[-1].split(";")[1], source
    (kernel,) = analyze(scheduled).kernels  # counted: every loop has a fixed trip count
    assert kernel.traffic.global_bytes > 0
    outcome = check_model(built, "stitch", cost=True)
    assert outcome.kind == "ok" and not outcome.violations, (outcome.error, outcome.violations)


def test_a_value_read_through_a_reshape_has_a_fixed_trip_count() -> None:
    nodes = [helper.make_node("Abs", ["x"], ["a"]),
             helper.make_node("Add", ["a", "half"], ["y"]),
             helper.make_node("Reshape", ["y", "shape"], ["r"]),
             helper.make_node("Pow", ["y", "p"], ["z"])]
    built = model(nodes, {"x": [3, 100]}, {"r": [3, 25, 4], "z": [3, 100]},
                  {"half": np.array(0.5, np.float32), "p": np.array(1.5, np.float32),
                   "shape": np.array([3, 25, 4], np.int64)})
    scheduled = compile_model(built, "stitch")
    (group,) = StitchPlan.of_module(scheduled).groups
    assert group.mapping.kind is MappingKind.FLAT, group
    (kernel,) = analyze(scheduled).kernels
    assert kernel.traffic.global_bytes == 3 * 300 * 4  # x read, r and z written, once
    outcome = check_model(built, "stitch", cost=True)
    assert outcome.kind == "ok" and not outcome.violations, (outcome.error, outcome.violations)


def test_contiguous_flat_kernels_keep_one_multiply_add_per_address() -> None:
    nodes = [helper.make_node("Erf", ["x"], ["e"]), helper.make_node("Abs", ["e"], ["a"])]
    built = model(nodes, {"x": [8, 4, 56, 56]}, {"a": [8, 4, 56, 56]})
    scheduled = compile_model(built, "stitch")
    (group,) = StitchPlan.of_module(scheduled).groups
    source = lower(scheduled[group.function], group.function,
                   Target({"kind": "cuda", "arch": "sm_90"})).source()
    lanes = group.mapping.vector
    assert f"((int)blockIdx.x) * {256 * lanes}) + (((int)threadIdx.x) * {lanes})" in source, \
        source
