"""Blocks whose lanes TVM computes one by one (``schedule.lanes``): a vectorised block that
calls ``erf`` on its lanes' values was run lane by lane by TVM's VectorizeLoop, every load and
store a scalar; the plan now computes those lanes into a register vector and loads and
stores whole vectors."""

from __future__ import annotations

import functools
import re
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper
from stitch_helpers import module_cuda_source

from tvm_stitch import pipeline, verify
from tvm_stitch.analysis import analyze
from tvm_stitch.frontend.onnx import import_model
from tvm_stitch.plan import MappingKind, StitchPlan
from tvm_stitch.testing.differential import check_model
from tvm_stitch.testing.resources import check_resources
from tvm_stitch.workloads import micro

SAVED_CASES = Path(__file__).parents[1] / "regressions" / "cases"


def _erf_model(shape: list[int], body: str, dtype: int = TensorProto.FLOAT) -> object:
    """``erf(x) / 2`` (``body="erf"``), ``x * erf(x)`` (``"x_erf"``) or ``erf(x + b)`` with a
    bias over the last axis (``"bias_erf"``)."""
    x = helper.make_tensor_value_info("x", dtype, shape)
    y = helper.make_tensor_value_info("y", dtype, shape)
    inits = []
    kind = np.float32 if dtype == TensorProto.FLOAT else np.float16
    if body == "erf":  # two ops: one alone is left to TVM
        inits = [numpy_helper.from_array(np.array(0.5, kind), "half")]
        nodes = [helper.make_node("Erf", ["x"], ["e"]),
                 helper.make_node("Mul", ["e", "half"], ["y"])]
    elif body == "x_erf":
        nodes = [helper.make_node("Erf", ["x"], ["e"]), helper.make_node("Mul", ["x", "e"], ["y"])]
    else:
        inits = [numpy_helper.from_array(np.linspace(-1, 1, shape[-1]).astype(kind), "b")]
        nodes = [helper.make_node("Add", ["x", "b"], ["h"]), helper.make_node("Erf", ["h"], ["y"])]
    graph = helper.make_graph(nodes, body, [x], [y], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])


@functools.cache
def _lowered(body: str, shape: tuple[int, ...], dtype: int = TensorProto.FLOAT):
    model = micro.bias_gelu(list(shape)) if body == "bias_gelu" else \
        _erf_model(list(shape), body, dtype)
    scheduled = pipeline.lower(import_model(model), "cuda:sm_90", "stitch")
    return model, scheduled, StitchPlan.of_module(scheduled)


# (body, shape, dtype, mapping): flat kernels reading x in the erf block, with x read twice,
# with a broadcast bias (3-D), float16; bias + GELU flat and walking its rows
CASES = [("erf", (512, 1024), TensorProto.FLOAT, MappingKind.FLAT),
         ("x_erf", (4, 128, 768), TensorProto.FLOAT, MappingKind.FLAT),
         ("bias_erf", (2, 196, 384), TensorProto.FLOAT, MappingKind.FLAT),
         ("erf", (512, 1024), TensorProto.FLOAT16, MappingKind.FLAT),
         ("bias_gelu", (2, 784, 384), TensorProto.FLOAT, MappingKind.FLAT),
         ("bias_gelu", (8192, 768), TensorProto.FLOAT, MappingKind.ROW_WALK)]


@pytest.mark.parametrize(("body", "shape", "dtype", "kind"), CASES)
def test_erf_lanes_move_in_vectors_and_match_onnxruntime(body, shape, dtype, kind) -> None:
    model, scheduled, plan = _lowered(body, shape, dtype)
    (group,) = plan.groups
    assert group.mapping.kind is kind and group.mapping.vector > 1
    assert group.lane_blocks
    source = module_cuda_source(scheduled, "sm_90")
    body_start = source.index("{", source.index('extern "C" __global__ void __launch_bounds__'))
    kernel = source[body_start:]
    stored = re.findall(r"\*\((\w+)\*\)\((\w+)_ptr \+ [^;]*\) = ", kernel)
    vector_type = "float4" if dtype == TensorProto.FLOAT else \
        {4: "half4", 8: "uint4"}[group.mapping.vector]
    assert {t for t, name in stored if not name.endswith("_local")} == {vector_type}
    scalar = [n for n in re.findall(r"(\w+)_ptr\[[^;=]*\] = ", kernel)
              if not n.endswith(("_local", "_shared"))]
    assert not scalar, f"scalar stores to {scalar}"
    if int(np.prod(shape)) <= 1 << 20:
        assert verify.run_simt(scheduled, model).ok


@pytest.mark.parametrize(("body", "shape", "dtype", "kind"), CASES)
def test_register_lanes_count_one_access_per_vector(body, shape, dtype, kind) -> None:
    """The counted bytes stay those of each element once; the accesses fall to one per
    vector for what the erf block loads and stores."""
    _, scheduled, plan = _lowered(body, shape, dtype)
    report = analyze(scheduled)
    (kernel,) = report.kernels
    item = 4 if dtype == TensorProto.FLOAT else 2
    elements = int(np.prod(shape))
    assert kernel.traffic.write_bytes == elements * item
    assert kernel.traffic.accesses <= 3 * elements // plan.groups[0].mapping.vector


def test_register_lanes_keep_registers() -> None:
    for body, shape, dtype, _ in CASES:
        report = check_resources(_lowered(body, shape, dtype)[1])
        assert not report.violations, (body, report.violations)
        assert all(k.spill_bytes == 0 for k in report.kernels)


def test_vectorisable_blocks_are_not_register_lanes() -> None:
    """Exp then ReLU vectorises as it is: nothing is computed lane by lane."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [512, 1024])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [512, 1024])
    model = helper.make_model(helper.make_graph(
        [helper.make_node("Exp", ["x"], ["e"]), helper.make_node("Relu", ["e"], ["y"])],
        "exp_relu", [x], [y]), opset_imports=[helper.make_opsetid("", 18)])
    scheduled = pipeline.lower(import_model(model), "cuda:sm_90", "stitch")
    (group,) = StitchPlan.of_module(scheduled).groups
    assert group.mapping.vector > 1 and not group.lane_blocks


def test_an_input_another_block_reads_transposed() -> None:
    """Fuzz graph 1205:36, smaller: ``erf(x) / c`` and ``transpose(x) / c'`` in one flat
    kernel. The erf block's register copy of x was made for every reader of x, so it held the
    transposed reader's elements too and the kernel fell back ("scheduling failed"); it is
    now the erf block's alone."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [30000, 32])
    outputs = [helper.make_tensor_value_info("a", TensorProto.FLOAT, [30000, 32]),
               helper.make_tensor_value_info("t", TensorProto.FLOAT, [32, 30000])]
    inits = [numpy_helper.from_array(np.linspace(0.5, 1.5, 32).astype(np.float32), "c"),
             numpy_helper.from_array(np.array(1.5, np.float32), "d")]
    nodes = [helper.make_node("Erf", ["x"], ["e"]), helper.make_node("Div", ["e", "c"], ["a"]),
             helper.make_node("Transpose", ["x"], ["xt"], perm=[1, 0]),
             helper.make_node("Div", ["xt", "d"], ["t"])]
    model = helper.make_model(helper.make_graph(nodes, "g", [x], outputs, inits),
                              opset_imports=[helper.make_opsetid("", 18)])
    scheduled = pipeline.lower(import_model(model), "cuda:sm_90", "stitch")
    plan = StitchPlan.of_module(scheduled)
    assert not plan.fallbacks and len(plan.groups) == 1, str(plan)
    assert plan.groups[0].lane_blocks, str(plan)
    assert verify.run_simt(scheduled, model).ok
    report = check_resources(scheduled)
    assert not report.violations, report.violations


def test_an_input_one_value_per_vector_is_read_by_each_lane() -> None:
    # fuzz graph 3301:723: a LayerNorm over all of (2, 2, 64) (one row of 256, normalised
    # lane by lane) then max with in1 of (2, 1), one value per 64 elements: read at
    # (f // 64) % 2 of the row index f, which names the lane variable but takes one value
    # over an aligned vector. Taken for a moving input, its register copy held one element
    # where a vector was asserted: "scheduling failed", and TVM's kernels instead.
    built = onnx.load(SAVED_CASES / "stitch-s3301-g723.onnx")
    plan = StitchPlan.of_module(verify.compile_model(built, "stitch"))
    assert not [f.reason for f in plan.fallbacks if "scheduling failed" in f.reason], plan
    assert any(g.lane_blocks for g in plan.groups), plan
    outcome = check_model(built, "stitch")
    assert outcome.kind == "ok" and not outcome.violations, (outcome.error, outcome.violations)
