"""A reshape whose result feeds two consumers of a stitched group (Reshape -> Reshape and
Reshape -> Neg -> Add on a (2, 30000) tensor) is computed into a per-thread "local" buffer of
the *whole* tensor (60000 floats: compute_at cannot narrow the region through the ``% 60000``
of the reshape's index), under a loop whose trip count depends on threadIdx.x. On CUDA that is
a 240 KB stack frame per thread; on the SIMT runner it overflows PoCL's stack and kills the
process (SIGSEGV), so this test checks resources only and never runs it. The small version
((4, 1), Neg -> Reshape) is what test_analysis_traffic.py trips over.
The same happens to an input read both directly and through a reshape (float16 (1, 30000):
a 60 KB stack frame). Found by scripts/fuzz.py --seed 3 while shrinking graph 97, and graph 43
(a segfault), shrunk. Owner: schedule/ (stitch flow)."""

from __future__ import annotations

import numpy as np
from onnx import TensorProto, helper
from regression_models import model, needs_stitch

from tvm_stitch import verify
from tvm_stitch.testing.resources import check_resources

pytestmark = needs_stitch


def test_reshape_with_two_consumers_is_not_staged_whole_per_thread() -> None:
    nodes = [helper.make_node("Reshape", ["x", "flat"], ["r"]),
             helper.make_node("Reshape", ["r", "same"], ["r2"]),
             helper.make_node("Neg", ["r"], ["n"]),
             helper.make_node("Add", ["n", "r"], ["y"])]
    built = model(nodes, {"x": [2, 30000]}, {"r2": [60000], "y": [60000]},
                  {"flat": np.array([60000], np.int64), "same": np.array([-1], np.int64)})
    report = check_resources(verify.compile_model(built, "stitch"))
    assert report.violations == [], report.violations


def test_input_read_directly_and_through_a_reshape_is_not_staged_whole() -> None:
    nodes = [helper.make_node("Reshape", ["x", "flat"], ["r"]),
             helper.make_node("Neg", ["r"], ["n"]),
             helper.make_node("Tanh", ["x"], ["t"]),
             helper.make_node("Mul", ["t", "t"], ["y"])]
    built = model(nodes, {"x": [1, 30000]}, {"n": [30000], "y": [1, 30000]},
                  {"flat": np.array([30000], np.int64)}, elem_type=TensorProto.FLOAT16)
    report = check_resources(verify.compile_model(built, "stitch"))
    assert report.violations == [], report.violations


def test_input_whose_rows_cut_a_dimension_is_read_where_it_lies() -> None:
    # ConvBERT's span-based convolution: a (2, 32, 18) tensor viewed as 128 rows of 9 and a
    # softmax over them. The input, read at two places of its row, was staged by a copy
    # over its own shape, which cannot be mapped to the rows (64 x 18 is not 128 x 9): the
    # group fell back, "block x_shared does not iterate over the 128 rows first"
    from tvm_stitch.plan import StitchPlan
    from tvm_stitch.testing.differential import check_model

    # (its attention softmax over 128 rows of 32 joins the group)
    nodes = [helper.make_node("Reshape", ["x", "view"], ["r"]),
             helper.make_node("Softmax", ["r"], ["y"], axis=1),
             helper.make_node("Softmax", ["s"], ["p"], axis=-1)]
    built = model(nodes, {"x": [2, 32, 18], "s": [2, 2, 32, 32]},
                  {"y": [128, 9, 1], "p": [2, 2, 32, 32]},
                  {"view": np.array([128, 9, 1], np.int64)})
    plan = StitchPlan.of_module(verify.compile_model(built, "stitch"))
    assert not plan.fallbacks and len(plan.groups) == 1, plan
    outcome = check_model(built, "stitch", triage=False)
    assert outcome.kind == "ok" and not outcome.violations, (outcome.error, outcome.violations)
