"""Global bytes counted from device TIR match hand counts, kernel by kernel."""

import pytest
from shared_kernels import Softmax768, scale_then_mirror
from tvm.script import ir as I
from tvm.script import relax as R
from tvm.script import tirx as T

from tvm_stitch import pipeline
from tvm_stitch.analysis import AnalysisError, analyze, analyze_primfunc

F32 = 4


def _only_kernel(mod, **kwargs):
    report = analyze(pipeline.lower(mod, "cuda"), **kwargs)
    assert len(report.kernels) == 1
    return report.kernels[0]


@I.ir_module
class Add:
    @R.function
    def main(x: R.Tensor((128, 256), "float32"), y: R.Tensor((128, 256), "float32")):
        with R.dataflow():
            z = R.add(x, y)
            R.output(z)
        return z


@I.ir_module
class RowSum:
    @R.function
    def main(x: R.Tensor((128, 1000), "float32")):
        with R.dataflow():
            s = R.sum(x, axis=[1])
            R.output(s)
        return s


@I.ir_module
class Softmax1000:
    @R.function
    def main(x: R.Tensor((128, 1000), "float32")):
        with R.dataflow():
            s = R.nn.softmax(x, axis=-1)
            R.output(s)
        return s


@I.ir_module
class LayerNorm:
    @R.function
    def main(x: R.Tensor((128, 768), "float32"), g: R.Tensor((768,), "float32"),
             b: R.Tensor((768,), "float32")):
        with R.dataflow():
            y = R.nn.layer_norm(x, g, b, axes=[-1])
            R.output(y)
        return y


@T.prim_func
def vector_add(a: T.Buffer((128, 256), "float32"), b: T.Buffer((128, 256), "float32"),
               c: T.Buffer((128, 256), "float32")):
    for i in T.thread_binding(128, thread="blockIdx.x"):
        for j0 in T.thread_binding(64, thread="threadIdx.x"):
            for j1 in T.vectorized(4):
                c[i, j0 * 4 + j1] = a[i, j0 * 4 + j1] + b[i, j0 * 4 + j1]


@T.prim_func
def strided_row_sum(a: T.Buffer((32, 1000), "float32"), b: T.Buffer((32, 128), "float32")):
    """Thread t of row i adds a[i, t], a[i, t + 128], ... for columns below 1000."""
    for i in T.thread_binding(32, thread="blockIdx.x"):
        for t in T.thread_binding(128, thread="threadIdx.x"):
            b[i, t] = T.float32(0)
            for k in T.serial(8):
                if k * 128 + t < 1000:
                    b[i, t] = b[i, t] + a[i, k * 128 + t]


@T.prim_func
def positive_copy(a: T.Buffer((64, 128), "float32"), b: T.Buffer((64, 128), "float32")):
    for i in T.thread_binding(64, thread="blockIdx.x"):
        for j in T.thread_binding(128, thread="threadIdx.x"):
            if a[i, j] > T.float32(0):
                b[i, j] = a[i, j]


@T.prim_func
def leaky(a: T.Buffer((64, 128), "float32"), w: T.Buffer((128,), "float32"),
          b: T.Buffer((64, 128), "float32")):
    for i in T.thread_binding(16, thread="blockIdx.x"):
        for j in T.thread_binding(1024, thread="threadIdx.x"):
            if i * 8 + j // 128 < 12:  # a tail guard next to a data-dependent one
                b[i * 8 + j // 128, j % 128] = T.if_then_else(
                    a[i * 8 + j // 128, j % 128] > T.float32(0), a[i * 8 + j // 128, j % 128],
                    a[i * 8 + j // 128, j % 128] * w[j % 128])


def test_elementwise_add_reads_two_tensors_and_writes_one() -> None:
    k = _only_kernel(Add)
    assert k.traffic.read_bytes == 2 * 128 * 256 * F32
    assert k.traffic.write_bytes == 128 * 256 * F32
    assert k.traffic.exact
    assert k.blocks * k.threads_per_block >= 128 * 256 // 4


def test_vectorised_loop_counts_every_lane_in_a_quarter_of_the_accesses() -> None:
    (k,) = analyze_primfunc(vector_add, name="vector_add")
    assert (k.grid, k.block) == ((128, 1, 1), (64, 1, 1))
    assert k.traffic.read_bytes == 2 * 128 * 256 * F32
    assert k.traffic.write_bytes == 128 * 256 * F32
    assert k.traffic.accesses == 3 * 128 * 64  # one float4 access per tensor per thread


def test_dlight_row_sum_reads_once_and_writes_one_value_per_row() -> None:
    k = _only_kernel(RowSum)
    assert k.traffic.read_bytes == 128 * 1000 * F32  # the 1000 % 512 tail is guarded off
    assert k.traffic.write_bytes == 128 * F32  # only threadIdx.x == 0 stores
    assert k.traffic.exact


def test_counting_guards_as_true_is_an_upper_bound_that_misses_reductions_badly() -> None:
    k = _only_kernel(RowSum, exact_guards=False)
    assert not k.traffic.exact
    assert k.traffic.write_bytes == 128 * k.threads_per_block * F32
    assert k.traffic.read_bytes == 128 * 2 * k.threads_per_block * F32


def test_dlight_softmax_reads_each_row_three_times() -> None:
    k = _only_kernel(Softmax768)  # max, sum of exp, normalise: three passes over the row
    assert k.traffic.read_bytes == 3 * 128 * 768 * F32
    assert k.traffic.write_bytes == 128 * 768 * F32
    assert k.traffic.buffers["x"].read_bytes == 3 * k.traffic.buffers["x"].size_bytes


def test_softmax_tail_guard_is_counted_exactly() -> None:
    exact = _only_kernel(Softmax1000)
    bound = _only_kernel(Softmax1000, exact_guards=False)
    assert exact.traffic.read_bytes == 3 * 128 * 1000 * F32
    assert exact.traffic.write_bytes == 128 * 1000 * F32
    assert bound.traffic.read_bytes == 3 * 128 * 1024 * F32  # 4 x 256 threads per row


def test_layer_norm_counts_repeated_loads_once_and_parameter_rereads_per_block() -> None:
    k = _only_kernel(LayerNorm)
    buffers = k.traffic.buffers
    row_bytes = 128 * 768 * F32
    # mean, variance ((x - m) * (x - m) loads x[i] once), normalise
    assert buffers["x"].read_bytes == 3 * row_bytes
    # gamma and beta are re-read by each of the 128 blocks
    assert buffers["g"].read_bytes == buffers["b"].read_bytes == row_bytes
    assert buffers["g"].size_bytes == 768 * F32
    assert k.traffic.read_bytes == 5 * row_bytes


def test_loop_trip_counts_and_loop_variable_guards() -> None:
    (k,) = analyze_primfunc(strided_row_sum, name="strided_row_sum")
    a, b = k.traffic.buffers["a"], k.traffic.buffers["b"]
    active = 32 * 1000  # (k, t) pairs with k * 128 + t < 1000, times 32 rows
    assert a.read_bytes == active * F32
    assert b.read_bytes == active * F32
    assert b.write_bytes == (32 * 128 + active) * F32
    assert k.traffic.exact


def test_data_dependent_guard_falls_back_to_an_upper_bound() -> None:
    (k,) = analyze_primfunc(positive_copy, name="positive_copy")
    size = 64 * 128 * F32
    assert k.traffic.read_bytes == 2 * size
    assert k.traffic.write_bytes == size
    assert not k.traffic.exact
    assert any("always true" in c for c in k.traffic.caveats)


def test_select_on_loaded_data_reuses_the_load_and_bounds_only_the_unknown_branch() -> None:
    (k,) = analyze_primfunc(leaky, name="leaky")
    rows = 12 * 128  # elements below the tail guard
    assert k.traffic.buffers["a"].read_bytes == rows * F32  # condition and branches: one load
    assert k.traffic.buffers["w"].read_bytes == rows * F32  # as if every element were negative
    assert k.traffic.write_bytes == rows * F32
    assert not k.traffic.exact
    (caveat,) = k.traffic.caveats
    assert caveat.startswith("data-dependent guard counted as always true: not")


def test_symbolic_primfunc_with_two_kernels_and_tail_guards() -> None:
    n = 1000
    kernels = analyze_primfunc(scale_then_mirror, [(n,), (n,), (n,)], name="scale_then_mirror")
    assert len(kernels) == 2
    for k in kernels:
        assert k.grid == (8, 1, 1)
        assert (k.traffic.read_bytes, k.traffic.write_bytes) == (n * F32, n * F32)
        assert k.traffic.exact


def test_symbolic_primfunc_without_shapes_is_refused() -> None:
    with pytest.raises(AnalysisError, match="input shapes of symbolic dimensions"):
        analyze_primfunc(scale_then_mirror, name="scale_then_mirror")


ROWS, WIDTH = 750000, 32


@T.prim_func(s_tir=True)
def warp_per_row(x: T.Buffer((ROWS, WIDTH), "float32"), y: T.Buffer((ROWS,), "float32")):
    # A block walks 150 groups of 8 rows; each row is one warp's scalar loads, reduced across
    # the warp before the next group's loads are issued.
    T.func_attr({"tirx.noalias": True})
    for b in T.thread_binding(625, thread="blockIdx.x"):
        for step in range(150):
            for r in T.thread_binding(8, thread="threadIdx.y"):
                for k in T.thread_binding(WIDTH, thread="threadIdx.x"):
                    with T.sblock("y"):
                        vi = T.axis.spatial(ROWS, b * 1200 + step * 8 + r)
                        vk = T.axis.reduce(WIDTH, k)
                        with T.init():
                            y[vi] = T.float32(0)
                        y[vi] = y[vi] + x[vi, vk]


@T.prim_func(s_tir=True)
def eight_threads_per_row(x: T.Buffer((ROWS, WIDTH), "float32"),
                          y: T.Buffer((ROWS,), "float32")):
    # 75 groups of 16 rows per block; each thread loads 4 elements of its row per group.
    T.func_attr({"tirx.noalias": True})
    for b in T.thread_binding(625, thread="blockIdx.x"):
        for step in range(75):
            for r in T.thread_binding(16, thread="threadIdx.y"):
                for k1 in T.thread_binding(8, thread="threadIdx.x"):
                    for k0 in range(4):
                        with T.sblock("y"):
                            vi = T.axis.spatial(ROWS, b * 1200 + step * 16 + r)
                            vk = T.axis.reduce(WIDTH, k0 * 8 + k1)
                            with T.init():
                                y[vi] = T.float32(0)
                            y[vi] = y[vi] + x[vi, vk]


def test_loads_in_flight_are_counted_per_synchronising_step() -> None:
    # Measured on the H200 (docs/results/gpu-2026-11-29-h200.md): 48.5 us for the warp per
    # row, 34.3 us for 8 threads per row. Counting a thread's accesses over all its row steps
    # as in flight ranked them the other way round (26.2 us against 49.4 us).
    (warp,) = analyze_primfunc(warp_per_row)
    (eight,) = analyze_primfunc(eight_threads_per_row)
    assert warp.traffic.global_bytes == eight.traffic.global_bytes == (ROWS * WIDTH + ROWS) * F32
    assert warp.traffic.step_accesses == pytest.approx(warp.traffic.accesses / 150)
    assert eight.traffic.step_accesses == pytest.approx(eight.traffic.accesses / 75)
    assert warp.roofline_us()["H200"] > 1.5 * eight.roofline_us()["H200"]


def test_loops_without_synchronisation_keep_every_access_in_flight() -> None:
    kernel = _only_kernel(Add)
    assert kernel.traffic.step_accesses == kernel.traffic.accesses


@T.prim_func
def column_per_lane(a: T.Buffer((64, 512), "float32"), b: T.Buffer((512,), "float32")):
    """Lane j sums column j: a warp reads 32 neighbouring floats of a row at each step."""
    for i in T.thread_binding(4, thread="blockIdx.x"):
        for j in T.thread_binding(128, thread="threadIdx.x"):
            b[i * 128 + j] = T.float32(0)
            for k in T.serial(64):
                b[i * 128 + j] = b[i * 128 + j] + a[k, i * 128 + j]


@T.prim_func
def row_per_lane(a: T.Buffer((512, 64), "float32"), b: T.Buffer((512,), "float32")):
    """Lane j sums row j: a warp's loads at one step lie a row (256 bytes) apart."""
    for i in T.thread_binding(4, thread="blockIdx.x"):
        for j in T.thread_binding(128, thread="threadIdx.x"):
            b[i * 128 + j] = T.float32(0)
            for k in T.serial(64):
                b[i * 128 + j] = b[i * 128 + j] + a[i * 128 + j, k]


@T.prim_func
def half_warp_store(a: T.Buffer((4096,), "float16"), b: T.Buffer((4096,), "float16")):
    """Threads 0-15 of each warp store eight halves each; the others store nothing."""
    for i in T.thread_binding(16, thread="blockIdx.x"):
        for j in T.thread_binding(256, thread="threadIdx.x"):
            if j % 32 < 16:
                for v in T.vectorized(8):
                    b[i * 256 + (j // 32 * 16 + j % 32) * 8 % 256 + v] = a[i * 256 + v]


def test_coalesced_lanes_move_the_sectors_they_ask_for() -> None:
    (k,) = analyze_primfunc(column_per_lane, name="column_per_lane")
    assert k.traffic.sector_bytes == pytest.approx(k.traffic.global_bytes)
    assert k.traffic.sector_ratio == pytest.approx(1.0)


def test_lanes_a_row_apart_each_move_a_sector() -> None:
    (k,) = analyze_primfunc(row_per_lane, name="row_per_lane")
    a = k.traffic.buffers["a"].read_bytes
    # every lane's 4-byte load of ``a`` takes a 32-byte sector of its own; b is coalesced
    assert k.traffic.sector_bytes == pytest.approx(8 * a + (k.traffic.global_bytes - a))


def test_lanes_guarded_off_are_not_counted_and_vectors_fill_their_sectors() -> None:
    (k,) = analyze_primfunc(half_warp_store, name="half_warp_store")
    # 16 lanes store 16 bytes each, side by side: 8 sectors for 256 bytes asked; the loads
    # of ``a`` are the same 16 bytes for every lane: one sector for 16 x 16 bytes
    b = k.traffic.buffers["b"].write_bytes
    a = k.traffic.buffers["a"].read_bytes
    assert b == 16 * 8 * 16 * 2 * 8
    assert k.traffic.sector_bytes == pytest.approx(b * 1.0 + a * 32 / (16 * 16))
