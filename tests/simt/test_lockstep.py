"""Warp-synchronous updates of shared memory run on the SIMT runner as a warp runs them
(``tvm_stitch.simt.lockstep``).

TVM's scan (``gpu_2d_continuous_cumsum``, every ``CumSum``) adds ``s[t - 2**i]`` into
``s[t]`` with no barrier in between, relying on a warp loading before it stores. PoCL runs
the work-items one after the other, so 36 of the 64 sums of a (2, 32) CumSum came out wrong
in both flows, and RoBERTa (its position ids are a cumulative sum of the token mask)
mismatched onnxruntime by 2.6. Its resource check also failed: the scan's PrimFunc has
symbolic shapes, now bound from its calls (``analysis.report.call_arguments``)."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
import tvm
from onnx import TensorProto, helper, numpy_helper
from tvm.script import tirx as T

from tvm_stitch.lowering import lower
from tvm_stitch.simt import lockstep
from tvm_stitch.target import opencl_target
from tvm_stitch.testing.differential import check_model


def _cumsum(shape: list[int], dtype: int) -> onnx.ModelProto:
    graph = helper.make_graph(
        [helper.make_node("CumSum", ["x", "axis"], ["y"])], "cumsum",
        [helper.make_tensor_value_info("x", dtype, shape)],
        [helper.make_tensor_value_info("y", dtype, shape)],
        [numpy_helper.from_array(np.array(len(shape) - 1, np.int64), "axis")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])


def _position_ids(batch: int, seq: int, vocab: int, width: int) -> onnx.ModelProto:
    """RoBERTa's embedding: position ids from a cumulative sum of the non-padding tokens,
    then word and position embeddings added."""
    rng = np.random.default_rng(0)
    consts = [numpy_helper.from_array(np.array(1, np.int64), "pad"),
              numpy_helper.from_array(np.array(1, np.int64), "axis"),
              numpy_helper.from_array(rng.standard_normal((vocab, width), np.float32), "words"),
              numpy_helper.from_array(rng.standard_normal((seq + 2, width), np.float32),
                                      "positions")]
    nodes = [helper.make_node("Equal", ["ids", "pad"], ["is_pad"]),
             helper.make_node("Not", ["is_pad"], ["kept"]),
             helper.make_node("Cast", ["kept"], ["mask"], to=TensorProto.INT32),
             helper.make_node("CumSum", ["mask", "axis"], ["count"]),
             helper.make_node("Mul", ["count", "mask"], ["counted"]),
             helper.make_node("Cast", ["counted"], ["counted64"], to=TensorProto.INT64),
             helper.make_node("Add", ["counted64", "pad"], ["position"]),
             helper.make_node("Gather", ["words", "ids"], ["word"]),
             helper.make_node("Gather", ["positions", "position"], ["place"]),
             helper.make_node("Add", ["word", "place"], ["y"])]
    graph = helper.make_graph(
        nodes, "position_ids", [helper.make_tensor_value_info("ids", TensorProto.INT64,
                                                              [batch, seq])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [batch, seq, width])], consts)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])


@pytest.mark.parametrize("flow", ["stitch", "baseline"])
@pytest.mark.parametrize(("shape", "dtype"), [
    ([2, 32], TensorProto.INT32),
    ([3, 100], TensorProto.FLOAT),
    ([2, 70000], TensorProto.INT64),  # more than one block per row: a second round of scans
])
def test_cumsum_matches_onnxruntime_in_both_flows(flow: str, shape: list[int],
                                                  dtype: int) -> None:
    outcome = check_model(_cumsum(shape, dtype), flow)
    assert outcome.kind == "ok" and not outcome.violations, (outcome.error, outcome.violations)


def test_position_ids_from_a_cumulative_sum_match_onnxruntime() -> None:
    model = _position_ids(2, 40, 50, 64)
    outcome = check_model(model, "stitch")
    assert outcome.kind == "ok" and not outcome.violations, (outcome.error, outcome.violations)


@T.prim_func(private=True, s_tir=True)
def _steps(a: T.Buffer((64,), "float32"), b: T.Buffer((64,), "float32")) -> None:
    T.func_attr({"tirx.is_scheduled": True})
    for tx in T.thread_binding(64, thread="threadIdx.x"):
        with T.sblock("steps"):
            s = T.sblock_alloc_buffer((64,), scope="shared")
            s[tx] = a[tx]
            if tx >= 1:  # a scan step: reads what its partner writes in the same step
                s[tx] = s[tx] + s[tx - 1]
            if tx < 16:  # a tree step: reads only what no thread of the step writes
                s[tx] = s[tx] + s[tx + 16]
            b[tx] = s[tx]


def _syncs(func: tvm.tirx.PrimFunc) -> int:
    return func.script().count("tvm_storage_sync")


def test_only_a_step_that_reads_what_it_writes_is_run_in_lockstep() -> None:
    lowered = lower(_steps, "steps", opencl_target(), vectorize=False)
    ((_, kernel),) = lowered.device.functions_items()
    ((_, rewritten),) = lockstep.in_lockstep(lowered.device).functions_items()
    # the scan step gains a barrier between its loads and its stores and one after them
    assert _syncs(rewritten) == _syncs(kernel) + 2
    assert "lockstep_value" in rewritten.script()
