"""Matmul and convolution PrimFuncs are told from memory-intensive ones by their TIR."""

import pytest
import tvm
from tvm import s_tir, tirx
from tvm.script import ir as I
from tvm.script import relax as R

from tvm_stitch import pipeline
from tvm_stitch.analysis import has_contraction
from tvm_stitch.analysis.classify import is_contraction_block


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


@I.ir_module
class TensorCores:
    @R.function
    def main(x: R.Tensor((512, 256), "float16"), w: R.Tensor((256, 256), "float16")):
        with R.dataflow():
            y = R.matmul(x, w)
            R.output(y)
        return y


@pytest.mark.slow  # TVM imports its tensor intrinsics on the first tensorized matmul: ~1 min
def test_a_matmul_tensorized_for_tensor_cores_is_a_contraction() -> None:
    # dlight's float16 Matmul on sm_90 replaces the update by tvm_mma_sync: the matmul
    # counted as a memory-intensive kernel (gpt2_block_fp16 at real size: 73 of 81)
    scheduled = pipeline.lower(TensorCores, "cuda:sm_90", "baseline")
    (name,) = [gv.name_hint for gv in scheduled.functions if gv.name_hint != "main"]
    assert "tvm_mma_sync" in scheduled[name].script()
    assert has_contraction(scheduled[name])


@pytest.mark.parametrize(("op", "mma"), [
    ("tirx.tvm_mma_sync", True), ("tirx.ptx.mma", True), ("tirx.ptx.wgmma_f16_ss", True),
    ("tirx.ptx.tcgen05_mma_ss", True), ("tirx.ptx.wgmma_fence", False),
    ("tirx.tvm_load_matrix_sync", False)])
def test_a_block_calling_a_matrix_multiply_accumulate_is_a_contraction(op: str, mma: bool
                                                                        ) -> None:
    call = tvm.ir.Call(tvm.ir.Op.get(op), [tirx.const(0, "int32")] * 8, ret_ty="handle")
    block = s_tir.SBlock([], [], [], "tensorized", tirx.Evaluate(call))
    assert is_contraction_block(block) == mma
