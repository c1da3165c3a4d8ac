"""Identical layers are stitched identically. FuseOps gives identical groups one outlined
function called from every layer, named after the first layer's bindings; reading groups by
name lost the epilogue of every later layer's matmul, which was then stitched alone (two
(MatMul, bias, erf-GELU) layers on (64, 128): 3 kernels and 589,824 B against the baseline's
2 kernels and 524,288 B). Owner: graph/tvm_fusion.py."""

from __future__ import annotations

import pytest

from tvm_stitch import pipeline
from tvm_stitch.analysis import analyze
from tvm_stitch.frontend.onnx import import_model
from tvm_stitch.workloads.graph import GraphBuilder


def _mlp(layers: int) -> object:
    g = GraphBuilder("mlp")
    x = g.input("x", (64, 128))
    for i in range(layers):
        h = g.op("Add", g.op("MatMul", x, g.weight(f"w{i}", (128, 128))),
                 g.weight(f"b{i}", (128,)))
        erf = g.op("Erf", g.op("Mul", h, g.constant(0.7071067811865476)))
        x = g.op("Mul", g.op("Mul", h, g.constant(0.5)), g.op("Add", erf, g.constant(1.0)))
    return g.model([x])


def _counts(layers: int, flow: str) -> tuple[int, int]:
    report = analyze(pipeline.lower(import_model(_mlp(layers)), "cuda:sm_90", flow))
    return len(report.kernels), report.global_bytes


@pytest.mark.parametrize("layers", [2, 3])
def test_every_layer_keeps_its_epilogue_with_its_matmul(layers: int) -> None:
    one = _counts(1, "stitch")
    stitch, baseline = _counts(layers, "stitch"), _counts(layers, "baseline")
    assert stitch == baseline == (layers * one[0], layers * one[1])
