"""float16 on the SIMT runner: kernels retyped to float32 with the same loops and launches,
every float16 result rounded to half."""

from __future__ import annotations

import numpy as np
import pytest
from fuzz_models import F16, F32, make_model
from onnx import helper
from tvm import tirx
from tvm.script import tirx as T

from tvm_stitch import verify
from tvm_stitch.lowering import lower
from tvm_stitch.simt import SimtFunction
from tvm_stitch.simt.retype import float32_version, narrow_into, widen
from tvm_stitch.target import opencl_target
from tvm_stitch.testing.differential import check_model, float32_twin, reference_outputs
from tvm_stitch.workloads import inputs


@T.prim_func(s_tir=True)
def row_max_f16(a: T.Buffer((4, 64), "float16"), b: T.Buffer((4,), "float16")):
    """Row maxima with a cross-thread reduction whose identity is float16's lowest value."""
    for i in T.thread_binding(4, thread="blockIdx.x"):
        for j in T.thread_binding(64, thread="threadIdx.x"):
            with T.sblock("max"):
                vi, vj = T.axis.remap("SR", [i, j])
                with T.init():
                    b[vi] = T.float16(-65504.0)
                b[vi] = T.max(b[vi], a[vi, vj] * T.float16(0.5))


def _launch_shapes(func: tirx.PrimFunc) -> list:
    low = lower(func, "f", opencl_target(), vectorize=False)
    ana = low.bind_shapes([(4, 64), (4,)])
    return [launch.geometry(ana) for launch in low.launches]


def test_retype_replaces_every_float16_and_keeps_the_launches() -> None:
    wide = float32_version(row_max_f16)
    script = wide.script()
    assert "float16" not in script
    # the reduction was lowered while float16, so its identity stays float16's lowest value
    assert "T.tvm_thread_allreduce" in script and "T.float32(-65504.0)" in script
    rounded = 'T.call_pure_extern("float32", "stitch_round_half", a[vi, vj] * T.float32(0.5))'
    assert rounded in script
    assert _launch_shapes(wide) == [((4, 1, 1), (64, 1, 1))]


def test_float32_functions_are_left_alone() -> None:
    wide = float32_version(row_max_f16)
    assert float32_version(wide) is wide


def test_widen_and_narrow_convert_only_float16() -> None:
    half, ints = np.ones(3, np.float16), np.arange(3)
    wide = widen([half, ints])
    assert wide[0].dtype == np.float32 and wide[1] is ints
    wide[0][:] = 2.5
    narrow_into([half, ints], wide)
    assert half.tolist() == [2.5, 2.5, 2.5] and half.dtype == np.float16


def test_float16_kernel_runs_on_the_simt_runner() -> None:
    f = SimtFunction.from_primfunc(row_max_f16, "row_max_f16")
    a = np.random.default_rng(0).standard_normal((4, 64)).astype(np.float16)
    b = np.zeros(4, np.float16)
    f(a, b)
    np.testing.assert_array_equal(b, (a.astype(np.float32) * 0.5).max(axis=1).astype(np.float16))


@T.prim_func(s_tir=True)
def at_least_f16(a: T.Buffer((256,), "float16"), b: T.Buffer((256,), "float16")):
    """A float16 literal that is no half (0.1) and whose half seven digits do not print."""
    for i in T.thread_binding(256, thread="threadIdx.x"):
        with T.sblock("at_least"):
            vi = T.axis.remap("S", [i])
            b[vi] = T.Select(a[vi] >= T.float16(0.1), T.float16(1), T.float16(0))


def test_float16_constants_are_the_halves_they_denote() -> None:
    """CUDA converts the literal to its half (0.0999755859375) and compares with that; so
    does the runner, although TVM's OpenCL code generator prints it as 9.997559e-02f, above
    the half."""
    half = np.float16(0.1)
    a = np.linspace(-1, 1, 256).astype(np.float16)
    a[::3] = half
    b = np.zeros(256, np.float16)
    SimtFunction.from_primfunc(at_least_f16, "at_least_f16")(a, b)
    assert np.float32(half) < np.float32(f"{np.float32(half):.6e}")
    np.testing.assert_array_equal(b, (a >= half).astype(np.float16))


def _f16_model():
    nodes = [helper.make_node("LayerNormalization", ["x", "g"], ["ln"], axis=-1),
             helper.make_node("Softmax", ["ln"], ["y"], axis=-1),
             helper.make_node("Cast", ["y"], ["y32"], to=F32)]
    return make_model(nodes, {"x": ([16, 96], F16)}, {"y": ([16, 96], F16),
                                                       "y32": ([16, 96], F32)},
                      {"g": np.linspace(0.5, 1.5, 96).astype(np.float16)})


def test_float32_twin_has_no_float16_left() -> None:
    twin = float32_twin(_f16_model())
    assert "FLOAT16" not in str(twin.graph).upper().replace("FLOAT16_", "")
    assert all(v.type.tensor_type.elem_type == F32 for v in twin.graph.output)


def test_float16_reference_is_the_twin_rounded() -> None:
    model = _f16_model()
    feeds = inputs(model, 0)
    y, y32 = reference_outputs(model, feeds)
    assert y.dtype == np.float16 and y32.dtype == np.float32
    wide = {k: v.astype(np.float32) for k, v in feeds.items()}
    twin_y, _ = verify.reference_outputs(float32_twin(model), wide)
    np.testing.assert_array_equal(y, twin_y.astype(np.float16))


@pytest.mark.parametrize("flow_name", ["baseline", "flow"])
def test_float16_model_matches_through_a_flow(flow_name: str, flow: str) -> None:
    nodes = [helper.make_node("LayerNormalization", ["x", "g"], ["ln"], axis=-1),
             helper.make_node("Softmax", ["ln"], ["y"], axis=-1)]
    model = make_model(nodes, {"x": ([16, 96], F16)}, {"y": ([16, 96], F16)},
                       {"g": np.linspace(0.5, 1.5, 96).astype(np.float16)})
    outcome = check_model(model, flow if flow_name == "flow" else "baseline", resources=False)
    assert outcome.kind == "ok", outcome.error
    assert outcome.max_abs_err < verify.ATOL["float16"]
