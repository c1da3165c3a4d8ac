"""Small hand-written kernels and Relax modules that several test packages check."""

from tvm.script import ir as I
from tvm.script import relax as R
from tvm.script import tirx as T


@T.prim_func(s_tir=True)
def scale_then_mirror(a: T.handle, b: T.handle, c: T.handle):
    """Two kernels over a symbolic length, each guarded against the grid's tail:
    B = 2 A, then C[i] = B[n - 1 - i], which reads what other blocks of the first kernel wrote."""
    n = T.int64()
    A = T.match_buffer(a, (n,), "float32")
    B = T.match_buffer(b, (n,), "float32")
    C = T.match_buffer(c, (n,), "float32")
    for bx in T.thread_binding((n + 127) // 128, thread="blockIdx.x"):
        for tx in T.thread_binding(128, thread="threadIdx.x"):
            with T.sblock("scale"):
                T.where(bx * 128 + tx < n)
                vi = T.axis.spatial(n, bx * 128 + tx)
                B[vi] = A[vi] * T.float32(2)
    for bx in T.thread_binding((n + 127) // 128, thread="blockIdx.x"):
        for tx in T.thread_binding(128, thread="threadIdx.x"):
            with T.sblock("mirror"):
                T.where(bx * 128 + tx < n)
                vi = T.axis.spatial(n, bx * 128 + tx)
                C[vi] = B[n - 1 - vi]


@I.ir_module
class Softmax768:
    @R.function
    def main(x: R.Tensor((128, 768), "float32")):
        with R.dataflow():
            s = R.nn.softmax(x, axis=-1)
            R.output(s)
        return s
