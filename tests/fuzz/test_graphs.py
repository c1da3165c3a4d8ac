"""The random graph generator: valid, reproducible, diverse, bounded and well conditioned."""

from __future__ import annotations

import collections
import functools
import math

import numpy as np
import onnx
import pytest
from hypothesis import HealthCheck, given, settings

from tvm_stitch import verify
from tvm_stitch.testing.choices import ReplayChooser
from tvm_stitch.testing.graphs import GraphConfig, describe, graph_from_seed, graphs, random_graph
from tvm_stitch.workloads import inputs

SEEDS = 300


@functools.cache
def _sample() -> tuple[onnx.ModelProto, ...]:
    return tuple(graph_from_seed(f"test:{i}")[0] for i in range(SEEDS))


def _shapes(model: onnx.ModelProto) -> list[tuple[int, ...]]:
    inferred = onnx.shape_inference.infer_shapes(model, strict_mode=True)
    values = list(inferred.graph.input) + list(inferred.graph.value_info) + list(
        inferred.graph.output)
    return [tuple(d.dim_value for d in v.type.tensor_type.shape.dim) for v in values]


def test_graphs_are_valid_and_reproducible() -> None:
    for i, model in enumerate(_sample()[:50]):
        onnx.checker.check_model(model, full_check=True)
        again, offsets = graph_from_seed(f"test:{i}")
        assert again.SerializeToString() == model.SerializeToString()
        replayed = random_graph(ReplayChooser(offsets))
        assert replayed.SerializeToString() == model.SerializeToString()


def test_graphs_cover_the_op_mix_of_the_issue() -> None:
    ops = collections.Counter(n.op_type for m in _sample() for n in m.graph.node)
    wanted = {"Exp", "Tanh", "Erf", "Pow", "Sqrt", "Log", "Add", "Sub", "Mul", "Div", "Max",
              "ReduceSum", "ReduceMean", "ReduceMax", "ReduceMin", "Softmax", "LogSoftmax",
              "LayerNormalization", "Reshape", "Transpose", "Expand", "Where", "Less",
              "Greater", "Equal", "Cast", "MatMul"}
    assert wanted <= set(ops), wanted - set(ops)
    keepdims = {a.i for m in _sample() for n in m.graph.node for a in n.attribute
                if a.name == "keepdims"}
    assert keepdims == {0, 1}


def test_graphs_cover_dtypes_and_irregular_shapes() -> None:
    elem_types = {v.type.tensor_type.elem_type for m in _sample() for v in m.graph.input}
    assert {onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16} <= elem_types
    dims = {d for m in _sample() for s in _shapes(m) for d in s}
    assert {1, 3, 7, 13, 31, 127, 257} & dims and 1 in dims
    last = [s[-1] for m in _sample() for s in _shapes(m) if s]
    rows = [math.prod(s[:-1]) for m in _sample() for s in _shapes(m) if s]
    assert max(last) >= 4097 and max(rows) >= 1000 and 1 in rows


def test_graphs_stay_within_the_element_limit() -> None:
    limit = GraphConfig().max_elements
    for model in _sample():
        assert all(math.prod(s) <= limit for s in _shapes(model)), describe(model)


def test_matmuls_can_be_switched_off() -> None:
    config = GraphConfig(matmul=0.0)
    for i in range(100):
        model, _ = graph_from_seed(f"nomm:{i}", config)
        assert all(n.op_type != "MatMul" for n in model.graph.node)


def test_reference_outputs_are_finite() -> None:
    """Generated graphs are well conditioned: no inf or NaN (overflow, log of negatives)."""
    for model in _sample()[:120]:
        feeds = inputs(model, 0)
        for out in verify.reference_outputs(model, feeds):
            out = np.asarray(out)
            if out.dtype.kind == "f":
                assert np.isfinite(out).all(), describe(model)


def test_describe_names_nodes_and_constants() -> None:
    text = describe(_sample()[3])
    assert text.startswith("inputs ") and "outputs " in text
    assert any(line.count("=") >= 1 for line in text.splitlines()[1:-1])


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(graphs(GraphConfig(max_nodes=5)))
def test_hypothesis_strategy_makes_valid_models(model: onnx.ModelProto) -> None:
    onnx.checker.check_model(model)
    assert 1 <= len(model.graph.node) and len(model.graph.output) >= 1


@pytest.mark.parametrize("max_nodes", [1, 3])
def test_node_count_follows_the_config(max_nodes: int) -> None:
    for i in range(40):
        model, _ = graph_from_seed(f"n:{i}", GraphConfig(max_nodes=max_nodes))
        ops = [n.op_type for n in model.graph.node]
        # Helper nodes (Abs + Add moving an operand into a domain, Tanh before Exp, a cast
        # island) come on top of the requested count.
        assert 1 <= len(ops) <= max_nodes + 4, ops
