"""A column reduction of no more rows than columns reads a transposed view of its input as
strided rows: a thread per column, each element read once, no partial sums.

Fuzz graph 12032:219: the mean of x (2, 30000) over its rows, its erf and the exp of its
tanh, was Global stitching of one row tile of 2 rows: a row of 30000 partial sums written
and read back after a grid barrier, 1.32 MB where TVM's three kernels move 840 KB and the
input and results are 480 KB. Where the input is read by other ops that stitch with the
reduction (its rows normalised, the sums broadcast back over them), Global stitching keeps
them in one kernel and stays. Owner: transform/mixed_reduction.py."""

from __future__ import annotations

import numpy as np
import pytest

from tvm_stitch import pipeline
from tvm_stitch.analysis import analyze
from tvm_stitch.frontend.onnx import import_model
from tvm_stitch.plan import MappingKind, StitchPlan
from tvm_stitch.testing.differential import check_model
from tvm_stitch.workloads.graph import GraphBuilder


def _mean_and_its_functions(shape: tuple[int, ...], axes: tuple[int, ...]) -> object:
    g = GraphBuilder("column_mean")
    x = g.input("x", shape)
    mean = g.op("ReduceMean", x, g.axes(*axes), keepdims=1)
    return g.model([g.op("Erf", mean), g.op("Exp", g.op("Tanh", mean))])


@pytest.mark.parametrize(("shape", "axes"), [((2, 30000), (0,)), ((16, 30000), (0,)),
                                             ((4, 8, 4096), (0, 1))])
def test_a_column_reduction_of_few_rows_reads_strided_rows(shape, axes) -> None:
    model = _mean_and_its_functions(shape, axes)
    mod = import_model(model)
    stitched = pipeline.lower(mod, "cuda:sm_90", "stitch")
    (group,) = StitchPlan.of_module(stitched).groups
    assert group.mapping.kind is MappingKind.STRIDED_ROWS and not group.phases, group
    columns = int(np.prod(shape)) // int(np.prod([shape[a] for a in axes]))
    compulsory = 4 * (int(np.prod(shape)) + 2 * columns)
    mine, tvms = (analyze(m) for m in (stitched, pipeline.lower(mod, "cuda:sm_90", "baseline")))
    assert len(mine.kernels) == 1 and mine.global_bytes == compulsory < tvms.global_bytes
    outcome = check_model(model, "stitch")
    assert outcome.kind == "ok" and not outcome.violations, (outcome.error, outcome.violations)


def _column_sums_beside_rows(kind: str) -> object:
    g = GraphBuilder(f"column_sums_{kind}")
    x = g.input("x", (16, 256))
    total = g.op("ReduceSum", x, g.axes(0), keepdims=1)
    if kind == "broadcast back":
        return g.model([g.op("Sub", x, total)])
    return g.model([g.op("Exp", total), g.op("Softmax", x, axis=1)])


@pytest.mark.parametrize("kind", ["broadcast back", "row softmax"])
def test_column_sums_that_stitch_with_row_ops_stay_global(kind: str) -> None:
    model = _column_sums_beside_rows(kind)
    stitched = pipeline.lower(import_model(model), "cuda:sm_90", "stitch")
    (group,) = StitchPlan.of_module(stitched).groups
    assert group.phases, group
    assert len(analyze(stitched).kernels) == 1
    outcome = check_model(model, "stitch", resources=False)
    assert outcome.kind == "ok", outcome.error
