"""Whole-module reports: kernels per run, compulsory bytes, symbolic shapes, refusals."""

import json

import numpy as np
import pytest
from tvm.script import ir as I
from tvm.script import relax as R
from tvm.script import tirx as T

from tvm_stitch import pipeline
from tvm_stitch.analysis import AnalysisError, analyze, has_contraction

F32 = 4
ROW = 128 * 768 * F32  # one (128, 768) float32 tensor
WEIGHT = np.random.default_rng(0).standard_normal((768, 256)).astype("float32")
FILTER = np.ones((8, 64, 3, 3), "float32")


@I.ir_module
class NormSoftmax:
    @R.function
    def main(x: R.Tensor((128, 768), "float32"), g: R.Tensor((768,), "float32"),
             b: R.Tensor((768,), "float32")):
        with R.dataflow():
            y = R.nn.layer_norm(x, g, b, axes=[-1])
            z = R.nn.softmax(y, axis=-1)
            w = R.add(z, x)
            R.output(w)
        return w


@I.ir_module
class Block:
    @R.function
    def main(x: R.Tensor((64, 768), "float32"), b: R.Tensor((256,), "float32")):
        with R.dataflow():
            h = R.nn.gelu(R.add(R.matmul(x, R.const(WEIGHT)), b))
            n = R.nn.layer_norm(h, b, b, axes=[-1])
            c = R.nn.conv2d(R.reshape(n, (1, 64, 16, 16)), R.const(FILTER))
            s = R.sum(R.multiply(n, n), axis=[1])
            R.output(c, s)
        return (c, s)


@I.ir_module
class SymbolicAdd:
    @R.function
    def main(x: R.Tensor(("n", 768), "float32"), g: R.Tensor((768,), "float32")):
        with R.dataflow():
            y = R.add(x, g)
            R.output(y)
        return y


@I.ir_module
class Handwritten:
    @T.prim_func(private=True)
    def double(a: T.Buffer((64,), "float32"), b: T.Buffer((64,), "float32")):
        for i in T.thread_binding(64, thread="threadIdx.x"):
            b[i] = a[i] * T.float32(2)

    @R.function
    def main(x: R.Tensor((64,), "float32")):
        cls = Handwritten
        y = R.call_tir(cls.double, (x,), out_ty=R.Tensor((64,), "float32"))
        z = R.call_tir(cls.double, (y,), out_ty=R.Tensor((64,), "float32"))
        return z

    @R.function
    def inner(x: R.Tensor((64,), "float32")) -> R.Tensor((64,), "float32"):
        cls = Handwritten
        y = R.call_tir(cls.double, (x,), out_ty=R.Tensor((64,), "float32"))
        return y

    @R.function
    def calls_inner(x: R.Tensor((64,), "float32")) -> R.Tensor((64,), "float32"):
        cls = Handwritten
        y = cls.inner(x)
        return y

    @R.function
    def branchy(x: R.Tensor((64,), "float32"), c: R.Tensor((), "bool")):
        cls = Handwritten
        if c:
            y = R.call_tir(cls.double, (x,), out_ty=R.Tensor((64,), "float32"))
        else:
            y = x
        return y


@pytest.fixture(scope="module")
def norm_softmax():
    return analyze(pipeline.lower(NormSoftmax, "cuda"))


@pytest.fixture(scope="module")
def block():
    scheduled = pipeline.lower(Block, "cuda")
    return scheduled, analyze(scheduled)


def test_norm_softmax_kernels_bytes_and_ratio(norm_softmax) -> None:
    r = norm_softmax
    assert [k.func for k in r.kernels] == ["layer_norm", "fused_softmax_add"]
    assert len(r.kernels) == r.mem_kernels == 2
    # layer_norm: x three times, gamma and beta once per block; softmax+add: y three times, x
    assert r.read_bytes == 5 * ROW + 4 * ROW
    assert r.write_bytes == 2 * ROW
    assert r.compulsory_bytes == 2 * ROW + 2 * 768 * F32
    assert r.traffic_ratio == pytest.approx(11 * ROW / r.compulsory_bytes)


def test_to_dict_has_the_documented_keys_and_is_json(norm_softmax) -> None:
    d = norm_softmax.to_dict()
    assert {"kernels", "mem_kernels", "global_bytes", "compulsory_bytes", "traffic_ratio",
            "roofline_us", "per_kernel"} <= set(d)
    assert set(d["roofline_us"]) == {"H200", "A100", "V100"}
    kernel = d["per_kernel"][0]
    assert {"name", "grid", "block", "blocks", "threads_per_block", "waves", "read_bytes",
            "write_bytes"} <= set(kernel)
    assert kernel["blocks"] == 128 and kernel["threads_per_block"] == 256
    assert kernel["waves"]["H200"] == pytest.approx(128 / (132 * 8))
    assert sum(k["roofline_us"]["A100"] for k in d["per_kernel"]) == d["roofline_us"]["A100"]
    assert "buffers" in norm_softmax.to_dict(buffers=True)["per_kernel"][0]
    json.dumps(d)


def test_render_is_a_table_with_one_row_per_kernel(norm_softmax) -> None:
    text = norm_softmax.render()
    assert "kernels 2 (memory-intensive 2)" in text
    assert "traffic ratio" in text and "H200" in text
    assert sum("_kernel" in line for line in text.splitlines()) == 2


def test_matmul_and_conv_are_compute_kernels_and_constants_are_compulsory(block) -> None:
    scheduled, r = block
    kinds = {k.func: k.memory_intensive for k in r.kernels}
    assert len(r.kernels) == 4
    assert r.mem_kernels == 2  # layer norm, sum of squares
    assert [f for f, mem in kinds.items() if not mem] == ["fused_matmul_add_gelu", "conv2d"]
    assert r.constant_bytes == WEIGHT.nbytes + FILTER.nbytes
    assert r.input_bytes == (64 * 768 + 256) * F32
    assert r.output_bytes == (8 * 14 * 14 + 64) * F32
    for k in r.kernels:
        assert has_contraction(scheduled[k.func]) is not k.memory_intensive


def test_symbolic_shapes_bind_by_name_by_position_or_by_variable() -> None:
    scheduled = pipeline.lower(SymbolicAdd, "cuda")
    reports = [analyze(scheduled, {"x": (100, 768)}), analyze(scheduled, [(100, 768), (768,)]),
               analyze(scheduled, shape_vars={"n": 100})]
    for r in reports:
        assert r.read_bytes == 2 * 100 * 768 * F32  # g is read once per output element
        assert r.write_bytes == 100 * 768 * F32
        assert r.compulsory_bytes == (2 * 100 * 768 + 768) * F32
    with pytest.raises(AnalysisError, match="symbolic"):
        analyze(scheduled)
    with pytest.raises(ValueError, match="rank"):
        analyze(scheduled, {"x": (100,)})
    with pytest.raises(ValueError, match="got shape"):
        analyze(scheduled, {"x": (100, 767)})


def test_every_call_tir_of_main_launches_in_order() -> None:
    r = analyze(Handwritten)
    assert [k.name for k in r.kernels] == ["double_kernel", "double_kernel"]
    assert r.read_bytes == r.write_bytes == 2 * 64 * F32
    assert r.compulsory_bytes == 2 * 64 * F32


@pytest.mark.parametrize("entry,message", [("calls_inner", "inner, which launches kernels"),
                                           ("branchy", "nested inside an expression")])
def test_kernels_outside_main_bindings_are_refused(entry, message) -> None:
    with pytest.raises(AnalysisError, match=message):
        analyze(Handwritten, entry=entry)
