"""Float16 rows move in 16-byte vectors (issue 13 part 3): a LayerNorm or RMSNorm of float16
rows that normalises in float32 loads and stores eight halves per access (PTX
``ld.global.nc.v4.u32``), its float32 arithmetic computed lane by lane; a float16 softmax stages
its float16 input, not a float32 copy of it. Counted with nvcc's PTX; numbers checked on the
SIMT runner against onnxruntime."""

from __future__ import annotations

import functools

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper
from stitch_helpers import compile_cuda, global_accesses, module_cuda_source, spills, stack_frames

from tvm_stitch import pipeline, verify
from tvm_stitch.frontend.onnx import import_model
from tvm_stitch.plan import StitchPlan, StorageLevel

F16 = TensorProto.FLOAT16


def _model(kind: str, shape: list[int]) -> onnx.ModelProto:
    """A float16 LayerNormalization (``ln``), RMSNorm from its ops (``rms``) or Softmax
    (``softmax``) over the last axis of ``shape``."""
    width = shape[-1]
    rng = np.random.default_rng(0)
    gamma = numpy_helper.from_array(rng.uniform(0.5, 1.5, width).astype(np.float16), "g")
    if kind == "ln":
        beta = numpy_helper.from_array(rng.uniform(-1, 1, width).astype(np.float16), "b")
        nodes = [helper.make_node("LayerNormalization", ["x", "g", "b"], ["y"], axis=-1,
                                  epsilon=1e-5)]
        inits = [gamma, beta]
    elif kind == "rms":
        nodes = [helper.make_node("Mul", ["x", "x"], ["sq"]),
                 helper.make_node("ReduceMean", ["sq", "axes"], ["ms"], keepdims=1),
                 helper.make_node("Add", ["ms", "eps"], ["t"]),
                 helper.make_node("Sqrt", ["t"], ["r"]),
                 helper.make_node("Div", ["x", "r"], ["n"]),
                 helper.make_node("Mul", ["n", "g"], ["y"])]
        inits = [gamma, numpy_helper.from_array(np.array([-1], np.int64), "axes"),
                 numpy_helper.from_array(np.array(1e-5, np.float16), "eps")]
    else:
        nodes = [helper.make_node("Softmax", ["x"], ["y"], axis=-1)]
        inits = []
    graph = helper.make_graph(nodes, kind, [helper.make_tensor_value_info("x", F16, shape)],
                              [helper.make_tensor_value_info("y", F16, shape)], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])


@functools.cache
def _lowered(kind: str, shape: tuple[int, ...]):
    model = _model(kind, list(shape))
    scheduled = pipeline.lower(import_model(model), "cuda:sm_90", "stitch")
    (group,) = StitchPlan.of_module(scheduled).groups
    return model, scheduled, group


# real widths: BERT/GPT-2 rows (2-D and the (batch, seq, hidden) form), LLaMA's 4096
NORMS = [("ln", (8192, 768)), ("ln", (8, 512, 768)), ("rms", (2048, 4096))]


@pytest.mark.nvcc
@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
@pytest.mark.parametrize(("kind", "shape"), NORMS)
def test_float16_norms_move_eight_halves_per_access(kind, shape, arch) -> None:
    _, scheduled, group = _lowered(kind, shape)
    assert group.mapping.vector == 8, group
    source = module_cuda_source(scheduled, arch)
    accesses = global_accesses(source, arch)
    # x, gamma (and beta) loaded, y stored, all 16 bytes at a time: no 8-byte vectors left
    assert "ld.global.nc.v4.u32" in accesses and "st.global.v4.u32" in accesses, accesses
    assert not {a for a in accesses if ".v2." in a or ".v4.u16" in a}, accesses
    report = compile_cuda(source, arch)
    assert all(s == (0, 0) for s in spills(report)) and not any(stack_frames(report)), report


@pytest.mark.parametrize(("kind", "shape"), [("ln", (256, 768)), ("ln", (2, 64, 1024)),
                                             ("rms", (256, 4096)), ("softmax", (256, 768))])
def test_float16_rows_match_onnxruntime(kind, shape) -> None:
    model, scheduled, group = _lowered(kind, shape)
    if kind != "softmax":
        assert group.mapping.vector == 8, group
    assert verify.run_simt(scheduled, model).ok


def test_float16_softmax_stages_its_float16_input() -> None:
    """The float32 cast of x is recomputed by its readers (inlined), so the block stages x
    itself: 2 bytes per element in shared memory, not 4."""
    _, _, group = _lowered("softmax", (8192, 768))
    assert "compute" in group.inlined, group.inlined
    staged = {b.name: b for b in group.buffers if b.level is StorageLevel.SHARED}
    assert "x" in staged, staged
    assert staged["x"].shared_bytes == 768 * 2 * group.mapping.rows_per_block, staged
