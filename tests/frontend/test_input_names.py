"""Graph inputs named like a torch export's internal values (``/model/.../Add_output_0``, a
constant turned input) compile: TVM's importer keeps ``/`` in parameter names, which reach
the CUDA source as identifiers; our import renames such inputs (``frontend.names``)."""

from __future__ import annotations

import onnx
import pytest
from onnx import TensorProto, helper
from tvm.relax.frontend.onnx import from_onnx

from tvm_stitch import pipeline, verify
from tvm_stitch.frontend.names import identifier_inputs
from tvm_stitch.frontend.onnx import import_model
from tvm_stitch.target import cuda_target
from tvm_stitch.testing.resources import check_resources

MASK = "/model/encoder/layers.0/attention/Add_output_0"
CLASH = "_model_encoder_layers_0_attention_Add_output_0"  # what MASK would become


def _model() -> onnx.ModelProto:
    """Attention scores as Swin's: softmax((q @ k + MASK) * CLASH) in 7x7 windows."""
    shape = [4, 3, 49, 49]
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["q", "k"], ["s"]),
         helper.make_node("Add", ["s", MASK], ["a"]),
         helper.make_node("Mul", ["a", CLASH], ["m"]),
         helper.make_node("Softmax", ["m"], ["y"], axis=-1)],
        "g",
        [helper.make_tensor_value_info("q", TensorProto.FLOAT, [4, 3, 49, 32]),
         helper.make_tensor_value_info("k", TensorProto.FLOAT, [4, 3, 32, 49]),
         *(helper.make_tensor_value_info(n, TensorProto.FLOAT, shape) for n in (MASK, CLASH))],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, shape)])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])


def test_inputs_that_are_no_identifiers_are_renamed_uniquely() -> None:
    model = _model()
    renamed, renames = identifier_inputs(model)
    assert renames == {MASK: CLASH + "_1"}
    assert [v.name for v in renamed.graph.input] == ["q", "k", CLASH + "_1", CLASH]
    assert list(renamed.graph.node[1].input) == ["s", CLASH + "_1"]
    assert identifier_inputs(renamed) == (renamed, {}), "nothing left to rename"
    assert model.graph.input[2].name == MASK, "the caller's model is untouched"


@pytest.mark.nvcc
@pytest.mark.parametrize("flow", ["baseline", "stitch"])
def test_both_flows_build_for_cuda_and_match_onnxruntime(flow: str) -> None:
    model = _model()
    scheduled = pipeline.lower(import_model(model), cuda_target(), flow)
    report = check_resources(scheduled, archs=("sm_90",))
    assert not report.violations and not report.tvm_violations, "nvcc builds every kernel"
    check = verify.summarize(scheduled, model)
    assert check["ok"], check


@pytest.mark.nvcc
def test_tvm_alone_gives_cuda_source_nvcc_rejects() -> None:
    """The bug worked around: TVM's import of the same model does not compile."""
    mod = from_onnx(_model(), keep_params_in_input=False)
    report = check_resources(pipeline.lower(mod, cuda_target(), "baseline"), archs=("sm_90",))
    assert any("does not build" in v for v in report.tvm_violations), report.tvm_violations
