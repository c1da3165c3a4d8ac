"""float16 on the SIMT runner rounds like the GPU, and the kernels of TVM's float16 matmuls run:
every float16 result is rounded to half (so a float16 accumulator shows its error), dynamic
shared memory is ``__local`` memory, warp matrix fragments are emulated."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper
from tvm import tirx
from tvm.script import tirx as T

from tvm_stitch import verify
from tvm_stitch.lowering import lower
from tvm_stitch.simt import SimtFunction, SimtModule
from tvm_stitch.target import cuda_target

ROW = 30000


def _row_sum(accumulator: str) -> tirx.PrimFunc:
    """Sums of the rows of a (4, ROW) float16 matrix, one thread per row (one block each)
    adding the row into an ``accumulator`` register: the plain loop a float16 kernel runs."""

    @T.prim_func(s_tir=True)
    def row_sum(a: T.Buffer((4, ROW), "float16"), b: T.Buffer((4,), "float16")):
        acc = T.sblock_alloc_buffer((4,), accumulator, scope="local")
        for i in T.thread_binding(4, thread="blockIdx.x"):
            for t in T.thread_binding(1, thread="threadIdx.x"):
                for k in range(ROW):
                    with T.sblock("sum"):
                        vi = T.axis.spatial(4, i + t)
                        vk = T.axis.reduce(ROW, k)
                        with T.init():
                            acc[vi] = T.cast(0, accumulator)
                        acc[vi] = acc[vi] + T.cast(a[vi, vk], accumulator)
                with T.sblock("out"):
                    vi = T.axis.spatial(4, i + t)
                    b[vi] = T.cast(acc[vi], "float16")

    return row_sum


def _sum_error(accumulator: str) -> tuple[np.ndarray, np.ndarray]:
    """|SIMT sum - float64 sum| of rows of values about 1, and the float16 tolerance."""
    a = np.random.default_rng(0).uniform(0.5, 1.5, (4, ROW)).astype(np.float16)
    b = np.zeros(4, np.float16)
    SimtFunction.from_primfunc(_row_sum(accumulator), "row_sum")(a, b)
    exact = a.astype(np.float64).sum(axis=1)
    return np.abs(b - exact), verify.ATOL["float16"] + verify.RTOL["float16"] * exact


def test_a_float16_accumulator_shows_its_error() -> None:
    """The negative control: past 2048 a float16 sum gains nothing from a value below 1 and
    past 4096 nothing from any value below 2, so the sum of 30000 values about 1 stops near
    4096. Computed in float32 without rounding, it would be right."""
    err, tol = _sum_error("float16")
    assert np.all(err > tol), (err, tol)


def test_the_same_kernel_accumulating_in_float32_matches() -> None:
    err, tol = _sum_error("float32")
    assert np.all(err <= tol), (err, tol)


@T.prim_func(s_tir=True)
def round_trip(a: T.Buffer((64,), "float32"), b: T.Buffer((64,), "float32")):
    """b = float32(float16(a)): the value a float16 buffer would hold."""
    for i in T.thread_binding(64, thread="threadIdx.x"):
        with T.sblock("b"):
            vi = T.axis.spatial(64, i)
            b[vi] = T.Cast("float32", T.Cast("float16", a[vi]))


def test_rounding_is_round_to_nearest_even_with_overflow_and_subnormals() -> None:
    halves = np.array([1.0, 2048.0, 65504.0, 6.1035156e-05, 5.9604645e-08], np.float32)
    up = np.nextafter(halves, np.float32(np.inf))
    special = [65519.0, 65520.0, -65520.0, 2049.0, 2051.0, 1e-8, 3e-8, 8.9e-8, np.inf, -0.0]
    a = np.concatenate([halves, up, np.float32(special),
                        np.random.default_rng(1).standard_normal(64) * 1000])[:64]
    a = a.astype(np.float32)
    b = np.zeros_like(a)
    SimtFunction.from_primfunc(round_trip, "round_trip")(a, b)
    with np.errstate(over="ignore"):  # 65520 rounds to infinity
        expected = a.astype(np.float16).astype(np.float32)
    np.testing.assert_array_equal(b, expected)


def test_float16_constants_are_the_halves_they_denote() -> None:
    @T.prim_func(s_tir=True)
    def tenth(b: T.Buffer((1,), "float32")):
        for i in T.thread_binding(1, thread="threadIdx.x"):
            with T.sblock("b"):
                vi = T.axis.spatial(1, i)
                b[vi] = T.Cast("float32", T.float16(0.1))

    b = np.zeros(1, np.float32)
    SimtFunction.from_primfunc(tenth, "tenth")(b)
    assert b[0] == np.float32(np.float16(0.1)) != np.float32(0.1)


@T.prim_func(s_tir=True)
def reverse_rows(a: T.Buffer((4, 64), "float32"), b: T.Buffer((4, 64), "float32")):
    """Each block reverses its row through dynamic shared memory: thread t reads what thread
    63 - t wrote, after a barrier."""
    s = T.sblock_alloc_buffer((64,), "float32", scope="shared.dyn")
    for i in T.thread_binding(4, thread="blockIdx.x"):
        for j in T.thread_binding(64, thread="threadIdx.x"):
            with T.sblock("load"):
                vi, vj = T.axis.remap("SS", [i, j])
                s[vj] = a[vi, vj]
        for j in T.thread_binding(64, thread="threadIdx.x"):
            with T.sblock("store"):
                vi, vj = T.axis.remap("SS", [i, j])
                b[vi, vj] = s[63 - vj]


def test_dynamic_shared_memory_is_a_launch_parameter() -> None:
    (launch,) = lower(reverse_rows, "reverse_rows", cuda_target()).launches
    assert int(launch.dynamic_shared_bytes) == 64 * 4
    assert [tag for tag, _ in launch.launch] == ["blockIdx.x", "threadIdx.x"]


def test_dynamic_shared_memory_is_shared_by_the_block() -> None:
    """TVM's OpenCL code generator prints dynamic shared memory as a private array and drops
    its barrier: every thread would read its own uninitialised copy."""
    f = SimtFunction.from_primfunc(reverse_rows, "reverse_rows")
    assert "__local float" in f.source and "barrier(" in f.source
    a = np.arange(4 * 64, dtype=np.float32).reshape(4, 64)
    b = np.zeros_like(a)
    f(a, b)
    np.testing.assert_array_equal(b, a[:, ::-1])


def _matmul(m: int, k: int, n: int) -> tuple:
    rng = np.random.default_rng(2)
    w = rng.uniform(-1, 1, (k, n)).astype(np.float16)
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"])], "matmul",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT16, [m, k])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT16, [m, n])],
        initializer=[numpy_helper.from_array(w, "w")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    return model, rng.uniform(-1, 1, (m, k)).astype(np.float16), w


def _run_matmul(shape: tuple[int, int, int]) -> tuple[SimtModule, verify.Check]:
    model, x, w = _matmul(*shape)
    module = SimtModule(verify.compile_model(model, "baseline", "cuda:sm_90"))
    (y,) = module(x)
    exact = x.astype(np.float64) @ w.astype(np.float64)
    return module, verify.compare([y], [exact.astype(np.float16)])


@pytest.mark.slow  # 65-80 s on 2 cores, most of it importing TVM's tensor intrinsics
def test_tvm_tensor_core_matmul_runs_on_the_simt_runner() -> None:
    """dlight's tensor-core rule (a float16 matmul whose extents all exceed 64) stages tiles in
    dynamic shared memory and multiplies warp matrix fragments. (The first such compile in a
    process imports TVM's tensor intrinsics: about 45 s here.)"""
    module, check = _run_matmul((128, 256, 256))
    (func,) = module.functions.values()
    (launch,) = func.lowered.launches
    assert launch.dynamic_shared_bytes is not None
    assert "stitch_wmma_mma_half" in func.source
    assert check.ok, check


def test_float16_matmul_without_tensor_cores_is_within_tolerance() -> None:
    """Without tensor cores dlight's float16 matmul added its 256 products one by one into a
    float16 register as TVM imports it; ours accumulates in float32 (frontend.precision)."""
    _, check = _run_matmul((64, 256, 256))
    assert check.ok, check
