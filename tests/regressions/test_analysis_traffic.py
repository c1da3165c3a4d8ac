"""analysis.analyze on a stitched kernel whose TIR has a loop with a thread-dependent trip
count (``T.max(threadIdx.x, threadIdx.x & 3) + 1 - T.min(...)``, from the stitch schedule of
Neg -> Reshape on a (4, 1) tensor): traffic counting raises AnalysisError. The numbers are
right on the SIMT runner, so ``verify``/``bench`` fail on a correct module; the loop itself
also hints at redundant work in the stitch schedule. Found by scripts/fuzz.py --seed 2
(graph 74), shrunk. Owner: analysis/traffic.py (and schedule/ for the odd loop)."""

from __future__ import annotations

import numpy as np
from onnx import helper
from regression_models import model, needs_stitch

from tvm_stitch import analysis, verify
from tvm_stitch.testing.differential import check_model

pytestmark = needs_stitch


def _neg_reshape() -> object:
    nodes = [helper.make_node("Neg", ["x"], ["a"]),
             helper.make_node("Neg", ["a"], ["b"]),
             helper.make_node("Reshape", ["a", "shape"], ["c"])]
    return model(nodes, {"x": [4, 1]}, {"b": [4, 1], "c": [4]},
                 {"shape": np.array([4], np.int64)})


def test_numbers_are_right() -> None:
    assert check_model(_neg_reshape(), "stitch").kind == "ok"


def test_analyze_counts_the_stitched_kernel() -> None:
    report = analysis.analyze(verify.compile_model(_neg_reshape(), "stitch"))
    (kernel,) = report.kernels
    assert kernel.traffic.exact
    # float32 (4, 1) and (4,) tensors: 16 B each. The kernel computes b = -(-x) and c = -x from
    # x, loading x once into a register for both outputs (16 B read; the reshape's unwrapped
    # index is the thread's own element), and writes b and c (32 B); compulsory is x once
    # plus b and c (48 B)
    assert kernel.traffic.buffers["x"].read_bytes == 16
    assert (report.read_bytes, report.write_bytes) == (16, 32)
    assert report.compulsory_bytes == 48
