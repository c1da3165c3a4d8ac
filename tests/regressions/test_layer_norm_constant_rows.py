"""A LayerNorm over a row of one repeated value gives exactly its bias, as onnxruntime does
(``transform.corrected_layer_norm``): topi's float32 mean of seven equal values is an ulp or
so off the value, the variance about 1e-14, and the difference divided by sqrt(epsilon) was
1e-4 where the exact result is 0. Fuzz graph 2612:1811. Owner: transform/corrected_layer_norm.py.
"""

from __future__ import annotations

import numpy as np
import pytest
from onnx import helper
from regression_models import model, needs_stitch

from tvm_stitch.testing.differential import check_model

pytestmark = needs_stitch


def _expanded_layer_norm(rows: int, width: int) -> object:
    # every row of the LayerNorm's input is one value of tanh(x) repeated ``width`` times
    nodes = [helper.make_node("Tanh", ["x"], ["t"]),
             helper.make_node("Unsqueeze", ["t", "last"], ["column"]),
             helper.make_node("Expand", ["column", "shape"], ["rows"]),
             helper.make_node("LayerNormalization", ["rows", "scale", "bias"], ["y"], axis=-1)]
    return model(nodes, {"x": [3, rows]}, {"y": [3, rows, width]},
                 {"last": np.array([-1], np.int64),
                  "shape": np.array([3, rows, width], np.int64),
                  "scale": np.linspace(0.5, 1.5, width).astype(np.float32),
                  "bias": np.linspace(-1.0, 1.0, width).astype(np.float32)})


@pytest.mark.parametrize("rows, width", [(127, 7), (64, 768)])
def test_layer_norm_of_a_constant_row_is_its_bias(rows: int, width: int) -> None:
    built = _expanded_layer_norm(rows, width)
    x = np.random.default_rng(0).uniform(-3.0, 3.0, (3, rows)).astype(np.float32)
    bias = np.linspace(-1.0, 1.0, width).astype(np.float32)
    expected = np.broadcast_to(bias, (3, rows, width)).astype(np.float32)
    outcome = check_model(built, "stitch", resources=False, triage=False, feeds={"x": x},
                          expected=[expected])
    assert outcome.kind == "ok", outcome.error
    assert outcome.max_abs_err <= 1e-6, outcome.max_abs_err
