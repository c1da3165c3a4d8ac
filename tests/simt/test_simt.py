"""The CPU SIMT runner executes real GPU semantics: known kernels match numpy, and broken
kernels (a wrong index, a removed barrier) are caught rather than papered over."""

import re

import numpy as np
import pytest
import tvm
import tvm_ffi
from shared_kernels import scale_then_mirror
from tvm.script import ir as I
from tvm.script import relax as R
from tvm.script import tirx as T

from tvm_stitch import pipeline
from tvm_stitch.lowering import LoweringError, lower
from tvm_stitch.simt import SimtFunction, SimtModule
from tvm_stitch.target import cuda_target


@T.prim_func(s_tir=True)
def shifted_copy(a: T.handle, b: T.handle, shift: T.int32):
    """A 2-D grid with a scalar parameter: B[i, j] = A[i, (j + shift) % 32]."""
    A = T.match_buffer(a, (16, 32), "float32")
    B = T.match_buffer(b, (16, 32), "float32")
    for by in T.thread_binding(16, thread="blockIdx.y"):
        for tx in T.thread_binding(32, thread="threadIdx.x"):
            with T.sblock("copy"):
                vi, vj = T.axis.remap("SS", [by, tx])
                B[vi, vj] = A[vi, T.truncmod(vj + shift, 32)]


@T.prim_func(s_tir=True)
def wrong_index(a: T.handle, b: T.handle):
    """Meant to copy A to B, but thread t reads A[t + 1] (clamped): an indexing bug."""
    A = T.match_buffer(a, (256,), "float32")
    B = T.match_buffer(b, (256,), "float32")
    for tx in T.thread_binding(256, thread="threadIdx.x"):
        with T.sblock("copy"):
            vi = T.axis.spatial(256, tx)
            B[vi] = A[T.min(vi + 1, 255)]


@I.ir_module
class SoftmaxReshape:
    @R.function
    def main(x: R.Tensor((8, 300), "float32")):
        with R.dataflow():
            y = R.nn.softmax(x, axis=-1)
            z = R.reshape(y, (4, 600))
            w = R.multiply(z, R.const(3.0, "float32"))
            R.output(w)
        return w


def _softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


@pytest.mark.parametrize("n", [100, 7, 64])
def test_kernels_run_in_order_with_symbolic_shapes(n: int) -> None:
    f = SimtFunction.from_primfunc(scale_then_mirror, "scale_then_mirror")
    assert len(f.lowered.launches) == 2
    rng = np.random.default_rng(n)
    a = rng.standard_normal(n, dtype=np.float32)
    b = np.zeros(n, np.float32)
    c = np.zeros(n, np.float32)
    f(a, b, c)
    np.testing.assert_allclose(b, 2 * a, rtol=0, atol=0)
    np.testing.assert_array_equal(c, 2 * a[::-1])


def test_scalar_parameter_and_2d_grid() -> None:
    f = SimtFunction.from_primfunc(shifted_copy, "shifted_copy")
    a = np.arange(16 * 32, dtype=np.float32).reshape(16, 32)
    b = np.zeros_like(a)
    f(a, b, shift=5)
    np.testing.assert_array_equal(b, np.roll(a, -5, axis=1))
    with pytest.raises(ValueError, match="shift"):
        f(a, b)


def test_shape_and_dtype_mismatch_are_refused() -> None:
    f = SimtFunction.from_primfunc(shifted_copy, "shifted_copy")
    with pytest.raises(ValueError, match="expects"):
        f(np.zeros((16, 31), np.float32), np.zeros((16, 32), np.float32), shift=0)
    with pytest.raises(ValueError, match="float32"):
        f(np.zeros((16, 32), np.float64), np.zeros((16, 32), np.float32), shift=0)


def test_wrong_index_is_visible() -> None:
    f = SimtFunction.from_primfunc(wrong_index, "wrong_index")
    a = np.arange(256, dtype=np.float32)
    b = np.zeros_like(a)
    f(a, b)
    assert not np.array_equal(b, a)
    np.testing.assert_array_equal(b[:-1], a[1:])


def _scheduled_softmax() -> tuple:
    scheduled = pipeline.lower(SoftmaxReshape, "cuda", "baseline")
    (name,) = [gv.name_hint for gv, f in scheduled.functions.items()
               if gv.name_hint != "main" and "softmax" in gv.name_hint]
    return scheduled, name


def test_dlight_softmax_matches_numpy() -> None:
    scheduled, name = _scheduled_softmax()
    f = SimtFunction.from_primfunc(scheduled[name], name)
    x = np.random.default_rng(0).standard_normal((8, 300), dtype=np.float32)
    outs = [np.zeros((8, 300), np.float32) for _ in range(len(f.lowered.params) - 1)]
    f(x, *outs)
    np.testing.assert_allclose(outs[-1], _softmax(x), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("flow", ["baseline", "stitch"])
def test_rows_at_the_lowest_float_keep_their_softmax(flow: str) -> None:
    """A row a mask set to float32's lowest value throughout (a padded query row of
    transformers' decoders) has a uniform softmax; TVM's OpenCL code printed the maximum's
    identity as -3.402823e+38f, above that value, and the row came out NaN."""
    lowest = np.finfo(np.float32).min
    x = np.full((8, 300), lowest, np.float32)
    x[1, :5] = 0.0
    x[2, 7] = -np.inf
    x[3] = np.random.default_rng(3).standard_normal(300)
    scheduled = pipeline.lower(SoftmaxReshape, "cuda", flow)
    (out,) = SimtModule(scheduled)(x)
    expected = np.full((8, 300), 1 / 300)
    expected[1] = np.where(np.arange(300) < 5, 0.2, 0.0)
    expected[2] = np.where(np.arange(300) == 7, 0.0, 1 / 299)
    expected[3] = _softmax(x[3:4])[0]
    np.testing.assert_allclose(out, 3 * expected.reshape(4, 600), rtol=1e-5, atol=1e-7)


def test_removing_barriers_breaks_the_reduction() -> None:
    """PoCL runs a work-group's items in lock-step regions between barriers; without the
    barriers of the cross-thread reduction, threads read partial sums that are not there yet."""
    scheduled, name = _scheduled_softmax()
    good = SimtFunction.from_primfunc(scheduled[name], name)
    assert "barrier(" in good.source
    no_barrier = re.sub(r"barrier\([^;]*\);", "", good.source)
    bad = SimtFunction(good.lowered, source=no_barrier)
    x = np.random.default_rng(1).standard_normal((8, 300), dtype=np.float32)
    out_good = [np.zeros((8, 300), np.float32) for _ in range(len(good.lowered.params) - 1)]
    out_bad = [np.zeros((8, 300), np.float32) for _ in range(len(good.lowered.params) - 1)]
    good(x, *out_good)
    bad(x, *out_bad)
    np.testing.assert_allclose(out_good[-1], _softmax(x), rtol=1e-5, atol=1e-6)
    # wrong values or NaN (a partial sum read before it was written)
    assert not np.allclose(out_bad[-1], _softmax(x), rtol=1e-2, atol=1e-2)


def test_whole_module_with_reshape_view() -> None:
    scheduled, _ = _scheduled_softmax()
    x = np.random.default_rng(2).standard_normal((8, 300), dtype=np.float32)
    (out,) = SimtModule(scheduled)(x)
    np.testing.assert_allclose(out, 3 * _softmax(x).reshape(4, 600), rtol=1e-5, atol=1e-6)


def test_a_host_loop_launches_once_per_iteration() -> None:
    @T.prim_func(s_tir=True)
    def host_loop(a: T.Buffer((4, 32), "float32")):
        for i in range(4):
            for tx in T.thread_binding(32, thread="threadIdx.x"):
                with T.sblock("b"):
                    vi, vj = T.axis.remap("SS", [i, tx])
                    a[vi, vj] = a[vi, vj] * T.float32(2) + T.float32(vi)

    a = np.ones((4, 32), "float32")
    SimtFunction.from_primfunc(host_loop, "host_loop")(a)
    np.testing.assert_array_equal(a, 2 + np.arange(4, dtype="float32")[:, None] + 0 * a)


def test_host_code_it_cannot_follow_is_refused() -> None:
    @T.prim_func(s_tir=True)
    def host_branch(a: T.Buffer((4, 32), "float32"), n: T.int64):
        if n > 2:
            for tx in T.thread_binding(32, thread="threadIdx.x"):
                with T.sblock("b"):
                    vj = T.axis.spatial(32, tx)
                    a[0, vj] = a[0, vj] + T.float32(1)

    with pytest.raises(LoweringError, match="host code"):
        SimtFunction.from_primfunc(host_branch, "host_branch")


@T.prim_func(s_tir=True)
def int32_indexed(a: T.handle, b: T.handle):
    """int32 shape variable and indices (TVM's default is int64)."""
    n = T.int32()
    A = T.match_buffer(a, (n,), "float32")
    B = T.match_buffer(b, (n,), "float32")
    for bx in T.thread_binding((n + 31) // 32, thread="blockIdx.x"):
        for tx in T.thread_binding(32, thread="threadIdx.x"):
            with T.sblock("b"):
                T.where(bx * 32 + tx < n)
                vi = T.axis.spatial(n, bx * 32 + tx)
                B[vi] = A[vi] + T.float32(1)


def test_int32_index_type() -> None:
    f = SimtFunction.from_primfunc(int32_indexed, "int32_indexed")
    a = np.arange(45, dtype=np.float32)
    b = np.zeros_like(a)
    f(a, b)
    np.testing.assert_array_equal(b, a + 1)


@I.ir_module
class TwoOutputs:
    @T.prim_func(s_tir=True)
    def plus_minus(a: T.Buffer((64,), "float32"), p: T.Buffer((64,), "float32"),
                   m: T.Buffer((64,), "float32")):
        for tx in T.thread_binding(64, thread="threadIdx.x"):
            with T.sblock("pm"):
                vi = T.axis.spatial(64, tx)
                p[vi] = a[vi] + T.float32(1)
                m[vi] = a[vi] - T.float32(1)

    @R.function
    def main(x: R.Tensor((64,), "float32")):
        cls = TwoOutputs
        with R.dataflow():
            y = R.call_tir(cls.plus_minus, (x,), out_ty=[R.Tensor((64,), "float32"),
                                                          R.Tensor((64,), "float32")])
            z = R.multiply(y[0], y[1])
            R.output(z)
        return z


def test_call_tir_with_several_outputs() -> None:
    scheduled = pipeline.lower(TwoOutputs, "cuda", "baseline")
    x = np.random.default_rng(3).standard_normal(64, dtype=np.float32)
    (out,) = SimtModule(scheduled)(x)
    np.testing.assert_allclose(out, (x + 1) * (x - 1), rtol=1e-6)


def test_a_primfunc_is_lowered_once_per_target_and_option() -> None:
    """The analysis, the SIMT runner and the resource check of one compiled module, at each
    size it runs at, share one lowering of each PrimFunc per target and vectorize option; a
    PrimFunc equal to it but another object is lowered anew."""
    func = scale_then_mirror
    first = lower(func, "f", cuda_target("sm_90"))
    assert lower(func, "f", cuda_target("sm_90")) is first
    assert lower(func, "f", cuda_target("sm_80")) is not first
    assert lower(func, "f", cuda_target("sm_90"), vectorize=False) is not first
    assert lower(func, "g", cuda_target("sm_90")) is not first
    copy = tvm.ir.load_json(tvm.ir.save_json(func))
    assert tvm_ffi.structural_equal(copy, func)
    assert lower(copy, "f", cuda_target("sm_90")) is not first
