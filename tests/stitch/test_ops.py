"""Op classification from the legalized TIR."""

from __future__ import annotations

import stitch_patterns as patterns
from stitch_helpers import import_onnx, legalized

from tvm_stitch.graph import OpKind, dataflow_graphs


def _infos(name: str, *args: int) -> dict[str, object]:
    model, _ = patterns.PATTERNS[name](*args)
    (graph,) = dataflow_graphs(legalized(import_onnx(model)))
    return {n.callee: n.info for n in graph.nodes if n.info is not None}


def test_layer_norm_and_softmax_are_row_reductions_not_compute() -> None:
    infos = _infos("ln_softmax_add", 16, 64)
    for name in ("layer_norm", "softmax"):
        assert infos[name].kind is OpKind.ROW_REDUCE  # TVM marks them out-fusable
        assert (infos[name].rows, infos[name].row_length) == (16, 64)
    assert infos["softmax"].expensive
    assert infos["add"].kind is OpKind.ELEMWISE and not infos["add"].expensive
    # softmax reads its input twice (max, exp): a Regional dependence on its producer
    assert infos["softmax"].input_reads == (2,)
    assert infos["add"].input_aligned == (True, True)


def test_matmul_is_compute_and_column_mean_is_a_column_reduction() -> None:
    infos = _infos("matmul_between_layer_norms", 16, 64)
    assert infos["matmul"].kind is OpKind.COMPUTE
    column = _infos("column_mean_center", 16, 64)["mean"]
    assert column.kind is OpKind.COLUMN_REDUCE and not column.unsupported
    assert (column.rows, column.row_length) == (16, 64)  # rows reduced, columns kept


def test_middle_axis_reduction_is_unsupported() -> None:
    middle = _infos("middle_axis_sum", 4, 8, 16)["sum"]
    assert middle.kind is OpKind.COLUMN_REDUCE
    assert middle.unsupported.startswith("window or mixed reduction")


def test_gather_opaque_to_tvm_is_injective() -> None:
    infos = _infos("log_softmax_nll", 16, 32)
    assert infos["gather"].kind is OpKind.INJECTIVE
    assert infos["gather"].detail == "gather (opaque to TVM)"
