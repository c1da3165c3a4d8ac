"""Matmul and convolution PrimFuncs are told from memory-intensive ones by their TIR."""

import pytest
from tvm.script import ir as I
from tvm.script import relax as R

from tvm_stitch import pipeline
from tvm_stitch.analysis import has_contraction


@I.ir_module
class Mixed:
    @R.function
    def main(a: R.Tensor((4, 64, 32), "float16"), b: R.Tensor((4, 32, 48), "float16"),
             x: R.Tensor((64, 48), "float32"), y: R.Tensor((64, 48), "float32")):
        with R.dataflow():
            mm = R.matmul(a, b, out_dtype="float32")  # batched, with casts to float32
            sq = R.sum(R.multiply(x, x), axis=[1])  # a square, not a product of two tensors
            var = R.variance(x, axis=[1])  # (x - mean) * (x - mean)
            dot = R.sum(R.multiply(x, y), axis=[0])  # two tensors at the same element: no reuse
            R.output(mm, sq, var, dot)
        return (mm, sq, var, dot)


@pytest.fixture(scope="module", params=["baseline", "stitch"])
def scheduled(request):
    return pipeline.lower(Mixed, "cuda", request.param)


def test_batched_mixed_precision_matmul_is_a_contraction(scheduled) -> None:
    matmuls = [gv.name_hint for gv in scheduled.functions if "matmul" in gv.name_hint]
    assert matmuls
    assert all(has_contraction(scheduled[name]) for name in matmuls)


def test_squares_and_variances_are_not_contractions(scheduled) -> None:
    others = [gv.name_hint for gv, f in scheduled.functions.items()
              if "matmul" not in gv.name_hint and gv.name_hint != "main"]
    assert any("multiply_sum" in name for name in others)  # one stitched kernel, or several
    assert not any(has_contraction(scheduled[name]) for name in others)
