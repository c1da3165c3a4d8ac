"""Row blocks of a Global group stay in their rows, and a column reduction is recognised even
when its column count equals the row count.

- A LayerNorm whose result is both transposed and summed over its rows (the weight and bias
  gradients of torch's MLP backward) was stitched as a Global group whose transpose read
  other rows' results from an uninitialised on-chip copy: wrong numbers (max error 1.7e26).
  Global groups now check row alignment like row groups; and grouping puts a transpose of
  the innermost axis in a cluster with the rows it reads only as a permuted write that no
  op of the cluster reads (``grouping._permuted_sink``): it then walks the rows it reads,
  each element written in its place (``row_permutation``), one kernel.
- The bias gradient of a square layer, a sum over (B, S) of (B, S, H) with B x S = H (2 x 32
  rows of 64: mlp_backward at ci), looked like H row sums; it is a column reduction, and the
  LayerNorm backward around it is one Global kernel.
Owner: schedule/decisions/, schedule/phases.py (``column_reductions``)."""

from __future__ import annotations

from tvm_stitch import verify
from tvm_stitch.plan import StitchPlan
from tvm_stitch.testing.differential import check_model
from tvm_stitch.workloads.graph import GraphBuilder


def _layer_norm_transposed_and_summed() -> object:
    g = GraphBuilder("layer_norm_transposed_and_summed")
    x, dy = g.input("x", (64, 64)), g.input("dy", (64, 64))
    y = g.op("LayerNormalization", x, g.weight("g", (64,)), g.weight("b", (64,)), axis=-1)
    return g.model([g.op("Transpose", y, perm=[1, 0]),
                    g.op("ReduceSum", g.op("Mul", y, dy), g.axes(0), keepdims=0)])


def _layer_norm_backward_square(batch: int = 2, seq: int = 32, hidden: int = 64) -> object:
    g = GraphBuilder("layer_norm_backward_square")
    x, dy = g.input("x", (batch, seq, hidden)), g.input("dy", (batch, seq, hidden))
    mean = g.op("ReduceMean", x, g.axes(-1), keepdims=1)
    centred = g.op("Sub", x, mean)
    var = g.op("ReduceMean", g.op("Mul", centred, centred), g.axes(-1), keepdims=1)
    rstd = g.op("Reciprocal", g.op("Sqrt", g.op("Add", var, g.constant(1e-5))))
    xhat = g.op("Mul", centred, rstd)
    grad = g.op("Mul", dy, g.weight("gamma", (hidden,)))
    mean_g = g.op("ReduceMean", grad, g.axes(-1), keepdims=1)
    mean_gx = g.op("ReduceMean", g.op("Mul", grad, xhat), g.axes(-1), keepdims=1)
    dx = g.op("Mul", g.op("Sub", g.op("Sub", grad, mean_g), g.op("Mul", xhat, mean_gx)),
              rstd)
    dgamma = g.op("ReduceSum", g.op("Mul", dy, xhat), g.axes(0, 1), keepdims=0)
    dbeta = g.op("ReduceSum", dy, g.axes(0, 1), keepdims=0)
    return g.model([dx, dgamma, dbeta])


def test_a_transpose_of_a_global_groups_rows_is_written_from_its_own_rows() -> None:
    model = _layer_norm_transposed_and_summed()
    outcome = check_model(model, "stitch", resources=False)
    assert outcome.kind == "ok", outcome.error
    assert outcome.fallbacks == []
    (group,) = StitchPlan.of_module(verify.compile_model(model, "stitch")).groups
    assert group.phases and len(group.permuted_outputs) == 1, group


def test_a_square_layers_bias_gradient_is_a_column_reduction() -> None:
    model = _layer_norm_backward_square()
    outcome = check_model(model, "stitch")
    assert outcome.kind == "ok" and not outcome.fallbacks, (outcome.error, outcome.fallbacks)
    assert outcome.violations == []
    (group,) = StitchPlan.of_module(verify.compile_model(model, "stitch", "cuda:sm_90")).groups
    assert [p.kind for p in group.phases] == ["rows", "columns"]
