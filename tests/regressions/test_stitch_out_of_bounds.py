"""ArgMax over the first axis of a (2, 3, 4) tensor through the stitch flow corrupts the host's
heap on the SIMT runner ("free(): invalid pointer", "double free or corruption": PoCL's buffers
are host memory, so a kernel writing out of bounds tramples malloc's bookkeeping) and the
process aborts, sometimes after the result was already returned right. On a GPU the same write
is an illegal address or silent corruption of a neighbouring buffer. The baseline flow is
clean. Fixed during the session that found it (the stitch flow changed its column
reductions); kept as a guard. The case runs in a worker process so that an abort fails this
test only. Found by ONNX's node test test_argmax_default_axis_random. Owner: schedule/
(column reductions, Global stitching)."""

from __future__ import annotations

import numpy as np
from onnx import TensorProto, helper
from regression_models import model, needs_stitch

from tvm_stitch.target import DEFAULT_TARGET
from tvm_stitch.testing.fuzz import Checker

pytestmark = needs_stitch


def _argmax_axis0() -> object:
    built = model([helper.make_node("ArgMax", ["x"], ["y"], axis=0, keepdims=1)],
                  {"x": [2, 3, 4]}, {"y": [1, 3, 4]})
    built.graph.output[0].type.tensor_type.elem_type = TensorProto.INT64
    return built


def test_argmax_over_the_first_axis_leaves_the_process_alive() -> None:
    checker = Checker("stitch", DEFAULT_TARGET, resources=False, timeout=120)
    try:
        outcomes = [checker(_argmax_axis0(), seed) for seed in range(2)]
    finally:
        checker.close()
    assert all(o["kind"] == "ok" for o in outcomes), [o["error"] for o in outcomes]


def test_max_with_a_scalar_leaves_the_process_alive() -> None:
    """Found by scripts/fuzz.py --seed 5 (graph 16), shrunk: "free(): invalid next size",
    "corrupted size vs. prev_size"."""
    built = model([helper.make_node("Max", ["x", "c"], ["y"])], {"x": [257, 2]},
                  {"y": [257, 2]}, {"c": np.array(1.5, np.float32)})
    checker = Checker("stitch", DEFAULT_TARGET, resources=False, timeout=120)
    try:
        outcomes = [checker(built, seed) for seed in range(2)]
    finally:
        checker.close()
    assert all(o["kind"] == "ok" for o in outcomes), [o["error"] for o in outcomes]
