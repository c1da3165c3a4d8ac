"""Kernels launched inside host loops: TVM's cumsum scans in rounds, one launch per round,
as many rounds as the length needs (one more past 256 and past 131072 elements). The
launcher expands the loops at run time (``LoweredFunc.launch_sequence``), so the SIMT runner
and the traffic count see every launch, with each round's arguments (a dynamic-axes GPT-2
builds its attention mask with a cumsum)."""

from __future__ import annotations

import numpy as np
import pytest
import tvm
from onnx import TensorProto, helper, numpy_helper

from tvm_stitch import pipeline
from tvm_stitch.analysis import analyze
from tvm_stitch.frontend.onnx import import_model
from tvm_stitch.lowering import lower
from tvm_stitch.simt import SimtModule
from tvm_stitch.target import cuda_target


def _cumsum():
    x = helper.make_tensor_value_info("x", TensorProto.INT64, [2, "n"])
    y = helper.make_tensor_value_info("y", TensorProto.INT64, [2, "n"])
    axis = numpy_helper.from_array(np.array(1, np.int64), "axis")
    graph = helper.make_graph([helper.make_node("CumSum", ["x", "axis"], ["y"])], "cumsum",
                              [x], [y], [axis])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _scheduled(flow: str = "baseline"):
    return pipeline.lower(import_model(_cumsum()), cuda_target(), flow)


def _lowered_scan():
    scheduled = _scheduled()
    (name,) = [gv.name_hint for gv, _ in scheduled.functions_items()
               if "cumsum" in gv.name_hint]
    return lower(scheduled[name], name, cuda_target())


def test_each_round_is_a_launch_with_its_round_index() -> None:
    lowered = _lowered_scan()
    assert any(launch.loops for launch in lowered.launches), "the rounds are a host loop"
    for n, rounds in ((100, 0), (300, 1), (140_000, 2)):
        sequence = lowered.launch_sequence(lowered.bind_shapes([(2, n), (2, n)]))
        per_round = [launch for launch in sequence if launch.kernel.endswith("_kernel_1")]
        assert len(per_round) == rounds, (n, [launch.kernel for launch in sequence])
        indices = [int(a) for launch in per_round for a in launch.args
                   if isinstance(a, tvm.tirx.IntImm)]
        assert set(range(rounds)) <= set(indices), (n, indices)
        assert not any(launch.loops for launch in sequence)


@pytest.mark.parametrize("flow", ["stitch", "baseline"])
def test_every_launch_is_counted(flow: str) -> None:
    scheduled = _scheduled(flow)
    kernels = {n: len(analyze(scheduled, shape_vars={"n": n}).kernels)
               for n in (100, 300, 140_000)}
    assert kernels[100] < kernels[300] < kernels[140_000], kernels


def test_short_scans_run() -> None:
    x = np.arange(20, dtype="int64").reshape(2, 10)
    (out,) = SimtModule(_scheduled())(x)
    np.testing.assert_array_equal(out, np.cumsum(x, axis=1))


def test_long_scans_run_on_the_simt_runner() -> None:
    # TVM's scan is warp-synchronous (a thread adds its neighbour's shared slot into its own
    # with no barrier between): the SIMT runner runs such steps in lockstep (simt/lockstep.py)
    x = np.ones((2, 300), dtype="int64")
    (out,) = SimtModule(_scheduled())(x)
    np.testing.assert_array_equal(out, np.cumsum(x, axis=1))
