"""TVM 0.27's dlight GEMV rule takes an operand broadcast along the kept axes of a sum for
the vector of a matrix-vector product, and its kernel is wrong: a sum over the last axis of
``x * c`` on (2, 32, 32) with ``c`` of (1, 32, 1) came out up to 135 off in TVM's default
flow, and the stitch flow's fallback of fuzz graph 6007:1592 (a sum over the middle axis of
``max(log_softmax(x), c)``) gave infinities. Our dlight rules take GEMV only where each
vector operand runs along the reduction (``schedule.rule.GEMV``). Owner:
schedule/rule.py."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import helper
from regression_models import model, needs_stitch
from tvm.s_tir import dlight as dl
from tvm.script import tirx as T

from tvm_stitch.schedule.rule import GEMV, default_rules, schedule_func
from tvm_stitch.simt.kernel import SimtFunction
from tvm_stitch.target import parse_target
from tvm_stitch.testing.differential import check_model

pytestmark = needs_stitch

CASES = Path(__file__).parent / "cases"


@T.prim_func(s_tir=True)
def _max_sum(x: T.Buffer((2, 32, 32), "float32"), c: T.Buffer((1, 32, 1), "float32"),
             out: T.Buffer((2, 32), "float32")):
    T.func_attr({"tirx.noalias": True})
    m = T.sblock_alloc_buffer((2, 32, 32))
    for i, j, k in T.grid(2, 32, 32):
        with T.sblock("m"):
            vi, vj, vk = T.axis.remap("SSS", [i, j, k])
            m[vi, vj, vk] = T.max(x[vi, vj, vk], c[0, vj, 0])
    for i, j, k in T.grid(2, 32, 32):
        with T.sblock("sum"):
            vi, vj, vk = T.axis.remap("SSR", [i, j, k])
            with T.init():
                out[vi, vj] = T.float32(0)
            out[vi, vj] = out[vi, vj] + m[vi, vj, vk]


@T.prim_func(s_tir=True)
def _gemv(a: T.Buffer((64, 128), "float32"), v: T.Buffer((128,), "float32"),
          out: T.Buffer((64,), "float32")):
    T.func_attr({"tirx.noalias": True})
    for i, k in T.grid(64, 128):
        with T.sblock("gemv"):
            vi, vk = T.axis.remap("SR", [i, k])
            with T.init():
                out[vi] = T.float32(0)
            out[vi] = out[vi] + a[vi, vk] * v[vk]


def _run(func, *arrays: np.ndarray) -> np.ndarray:
    target = parse_target("cuda:sm_90")
    with target:
        scheduled = schedule_func(func, target, default_rules())
    assert scheduled is not None
    out = np.zeros(arrays[0].shape[:-1], np.float32)
    SimtFunction.from_primfunc(scheduled, "f")(*arrays, out)
    return out


def test_a_sum_with_a_broadcast_operand_is_not_taken_for_a_gemv() -> None:
    rng = np.random.default_rng(0)
    x = rng.standard_normal((2, 32, 32)).astype(np.float32)
    c = rng.standard_normal((1, 32, 1)).astype(np.float32)
    target = parse_target("cuda:sm_90")
    assert GEMV().apply(_max_sum, target, False) is None
    assert dl.gpu.GEMV().apply(_max_sum, target, False) is not None  # TVM's takes it
    np.testing.assert_allclose(_run(_max_sum, x, c), np.maximum(x, c).sum(2), rtol=1e-5)


def test_a_matrix_vector_product_is_still_a_gemv() -> None:
    rng = np.random.default_rng(1)
    a = rng.standard_normal((64, 128)).astype(np.float32)
    v = rng.standard_normal(128).astype(np.float32)
    assert GEMV().apply(_gemv, parse_target("cuda:sm_90"), False) is not None
    np.testing.assert_allclose(_run(_gemv, a, v), a @ v, rtol=1e-4, atol=1e-4)


def test_the_fuzz_graph_runs_right() -> None:
    # its sum over the transposed rows fell back to a TVM-scheduled kernel (the one above)
    # while remote stitching merged it with the log-softmax whose results it reads across
    # rows; now that such clusters stay apart, both are stitched
    outcome = check_model(onnx.load(CASES / "stitch-s6007-g1592.onnx"), "stitch")
    assert outcome.kind == "ok", outcome.error
    assert not outcome.fallbacks and outcome.functions == 2, outcome


def _sum_of_product() -> onnx.ModelProto:
    nodes = [helper.make_node("Mul", ["x", "c"], ["m"]),
             helper.make_node("ReduceSum", ["m", "axes"], ["y"], keepdims=0)]
    return model(nodes, {"x": [2, 32, 32]}, {"y": [2, 32]},
                 {"c": np.linspace(-1, 1, 32, dtype=np.float32).reshape(1, 32, 1),
                  "axes": np.array([2], np.int64)})


def test_the_stitch_flow_sums_a_broadcast_product_right() -> None:
    outcome = check_model(_sum_of_product(), "stitch")
    assert outcome.kind == "ok", outcome.error


@pytest.mark.xfail(strict=True, reason="TVM's: dlight's GEMV rule takes the broadcast "
                   "operand c for a vector, and its kernel sums the wrong elements")
def test_tvm_default_flow_is_wrong_on_a_broadcast_product() -> None:
    outcome = check_model(_sum_of_product(), "baseline", triage=False)
    assert outcome.kind == "ok", outcome.error
