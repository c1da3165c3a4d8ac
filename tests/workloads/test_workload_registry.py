"""The registry API, declared sizes, seeded inputs and ``python -m tvm_stitch.workloads``."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from tvm_stitch import workloads
from tvm_stitch.workloads import Dist, integers, prefix, uniform
from tvm_stitch.workloads.__main__ import main as list_main
from tvm_stitch.workloads.inputs import get_metadata, input_dists, set_input_dists

MICRO = [
    "softmax", "layer_norm", "add_layer_norm", "rms_norm", "bias_gelu", "scale_mask_softmax",
    "layernorm_softmax_add", "logsoftmax_nll", "cross_entropy_128256", "layernorm_backward",
    "batchnorm_train", "batchnorm_nchw_train",
    "adam_update", "rowreduce_750000x32", "softmax_64x30000", "colsum_8192x1024",
    "group_norm_silu",
]
MODELS = ["bert_layer", "gpt2_block", "llama_block", "t5_block", "dien_block", "swin_block",
          "convnext_block", "mlp_backward", "roberta_block", "gpt2_block_fp16",
          "llama_block_fp16"]


def test_registry_holds_every_design_workload() -> None:
    assert workloads.names("micro") == MICRO
    assert workloads.names("model") == MODELS
    assert workloads.names() == MICRO + MODELS
    assert [w.name for w in workloads.all_workloads()] == MICRO + MODELS
    for w in workloads.all_workloads():
        assert workloads.get(w.name) is w
        assert set(w.sizes) == {"ci", "real"} and w.description


def test_unknown_names_sizes_and_kinds_are_refused() -> None:
    with pytest.raises(KeyError, match="unknown workload 'nope'"):
        workloads.get("nope")
    with pytest.raises(ValueError, match="no size 'huge'"):
        workloads.get("softmax").model("huge")
    with pytest.raises(ValueError, match="kind"):
        workloads.names("macro")  # type: ignore[arg-type]


def _dims(value: onnx.ValueInfoProto) -> tuple[int, ...]:
    return tuple(d.dim_value for d in value.type.tensor_type.shape.dim)


@pytest.mark.parametrize("size", ["ci", "real"])
@pytest.mark.parametrize("name", MICRO)
def test_declared_micro_size_is_the_first_input_shape(name: str, size: str) -> None:
    w = workloads.get(name)
    model = w.model(size)
    declared = tuple(int(d) for d in w.sizes[size].split("x"))
    assert _dims(model.graph.input[0]) == declared
    assert get_metadata(model, "tvm_stitch.workload") == name
    assert get_metadata(model, "tvm_stitch.size") == size


def test_ci_micro_tensors_are_small() -> None:
    for name in MICRO:
        model = onnx.shape_inference.infer_shapes(workloads.get(name).model("ci"))
        values = [*model.graph.input, *model.graph.value_info, *model.graph.output]
        biggest = max(int(np.prod(_dims(v))) for v in values)
        assert biggest <= 65536, (name, biggest)


def test_inputs_are_seeded_and_follow_declared_ranges() -> None:
    model = workloads.get("layernorm_backward").model("ci")
    first, again, other = (workloads.inputs(model, seed) for seed in (0, 0, 1))
    assert list(first) == ["dy", "x", "gamma", "mean", "rstd"]
    for name in first:
        np.testing.assert_array_equal(first[name], again[name])
        assert first[name].dtype == np.float32
        assert not np.array_equal(first[name], other[name])
    assert first["rstd"].min() >= 0.5 and first["rstd"].max() < 2.0
    assert first["x"].min() < 0 < first["x"].max()
    assert abs(first["x"].std() - 1.0) < 0.05


def test_integer_targets_stay_below_the_class_count() -> None:
    model = workloads.get("logsoftmax_nll").model("ci")
    classes = _dims(model.graph.input[0])[1]
    assert input_dists(model)["targets"] == integers(0, classes)
    targets = workloads.inputs(model, seed=5)["targets"]
    assert targets.dtype == np.int64 and targets.shape == (32,)
    assert targets.min() >= 0 and targets.max() < classes and len(set(targets)) > 10


def test_attention_mask_is_a_padding_prefix() -> None:
    model = workloads.get("scale_mask_softmax").model("ci")
    mask = workloads.inputs(model, seed=7)["mask"]
    assert mask.shape == (2, 1, 1, 64)
    rows = mask.reshape(2, 64)
    assert set(np.unique(rows)) <= {-10000.0, 0.0}
    assert (rows[:, 0] == 0.0).all()  # at least one key is attended
    assert (np.diff(rows, axis=1) <= 0).all()  # 0 ... 0 then -10000 ... -10000


def test_dists_survive_serialisation_and_defaults_apply() -> None:
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 8])
    ids = helper.make_tensor_value_info("ids", TensorProto.INT64, [4, 8])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 8])
    graph = helper.make_graph([helper.make_node("Identity", ["x"], ["y"])], "g", [x, ids], [y])
    model = helper.make_model(graph)
    plain = workloads.inputs(model)
    assert set(np.unique(plain["ids"])) <= {0, 1} and plain["x"].dtype == np.float32
    set_input_dists(model, {"ids": integers(3, 9)})
    loaded = onnx.load_from_string(model.SerializeToString())
    assert input_dists(loaded) == {"ids": integers(3, 9)}
    ids_values = workloads.inputs(loaded)["ids"]
    assert ids_values.min() >= 3 and ids_values.max() < 9
    with pytest.raises(ValueError, match="no graph input 'nope'"):
        set_input_dists(model, {"nope": uniform(0, 1)})


@pytest.mark.parametrize("dist", [uniform(0.25, 0.5), integers(-2, 3), prefix(0, 1), Dist()])
def test_dist_text_round_trip(dist: Dist) -> None:
    assert Dist.decode(dist.encode()) == dist


def test_symbolic_shapes_are_refused() -> None:
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 8])
    graph = helper.make_graph([helper.make_node("Identity", ["x"], ["y"])], "g", [x],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    with pytest.raises(ValueError, match="non-static shape"):
        workloads.inputs(helper.make_model(graph))


def test_list_command_prints_every_workload() -> None:
    result = subprocess.run([sys.executable, "-m", "tvm_stitch.workloads", "--list"],
                            capture_output=True, text=True, check=True, timeout=120)
    lines = result.stdout.splitlines()
    assert len(lines) == len(MICRO) + len(MODELS)
    for line, name in zip(lines, MICRO + MODELS, strict=True):
        w = workloads.get(name)
        assert line.split()[:2] == [name, w.kind]
        assert f"ci: {w.sizes['ci']}" in line and f"real: {w.sizes['real']}" in line


def test_list_command_filters_by_kind(capsys: pytest.CaptureFixture[str]) -> None:
    assert list_main(["--list", "--kind", "model"]) == 0
    assert [line.split()[0] for line in capsys.readouterr().out.splitlines()] == MODELS
    assert list_main([]) == 2
