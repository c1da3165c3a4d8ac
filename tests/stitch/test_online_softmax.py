"""Online softmax (``transform.online_softmax``): a row's maximum and its sum of
exponentials as one reduction of (sum, maximum) pairs, so the row is read once for both.

A cross-entropy over an LLM's vocabulary (rows of 50257-128256 logits) fell back to TVM's
five kernels at four times its compulsory bytes: its row is too long for shared memory and
for the registers that would hold it between the two passes. Online, the kernel reads each
logit once, then the target's. A softmax whose row is on chip stays in two passes (fewer
exponentials for the same bytes) unless a chooser asks."""

from __future__ import annotations

import functools

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper
from stitch_helpers import (
    assert_matches,
    compile_cuda,
    compiled_choosing,
    reference,
    single_task,
    spills,
    stitched_functions,
)
from test_packed_long_rows import _float16

from tvm_stitch import verify
from tvm_stitch.analysis import analyze
from tvm_stitch.lowering import lower
from tvm_stitch.plan import Choices
from tvm_stitch.schedule.blocks import prepare
from tvm_stitch.schedule.decisions import decide
from tvm_stitch.schedule.rows import Unstitchable
from tvm_stitch.simt import SimtModule
from tvm_stitch.target import cuda_target
from tvm_stitch.transform.online_softmax import find_online_pairs
from tvm_stitch.tuning.space import choice_space
from tvm_stitch.workloads import micro


def _compiled(model: onnx.ModelProto, online: bool | None = None):
    return compiled_choosing(model, None if online is None else Choices(online_softmax=online))


@functools.cache
def _cross_entropy(shape: tuple[int, int]):
    model = micro.logsoftmax_nll(shape)
    return (model, *_compiled(model))


def _model(nodes: list, inputs: list, output_shape: list[int]) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, "g", inputs, [helper.make_tensor_value_info(
        "y", TensorProto.FLOAT, output_shape)])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])


def test_the_pair_of_a_softmax_and_of_a_log_softmax() -> None:
    (pair,) = find_online_pairs(prepare(single_task(micro.softmax((8, 1000))).func))
    assert (pair.maximum, pair.total, pair.exponentials) == (
        "T_softmax_maxelem", "T_softmax_expsum", "T_softmax_exp")
    (pair,) = find_online_pairs(prepare(single_task(micro.logsoftmax_nll((8, 1000))).func))
    assert pair.maximum == "T_softmax_maxelem"


def test_no_pair_of_a_maximum_and_another_sum() -> None:
    """The exponentials of another tensor less the maximum, or a plain sum, are no softmax."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [8, 64])
    z = helper.make_tensor_value_info("z", TensorProto.FLOAT, [8, 64])
    axes = helper.make_tensor("axes", TensorProto.INT64, [1], [1])
    for summed in (["e"], ["x"]):
        nodes = [helper.make_node("ReduceMax", ["x", "axes"], ["m"], keepdims=1),
                 helper.make_node("Sub", ["z", "m"], ["d"]),
                 helper.make_node("Exp", ["d"], ["e"]),
                 helper.make_node("ReduceSum", [*summed, "axes"], ["s"], keepdims=1),
                 helper.make_node("Add", ["s", "m"], ["y"])]
        model = _model(nodes, [x, z], [8, 1])
        model.graph.initializer.append(axes)
        assert find_online_pairs(prepare(single_task(model).func)) == []


def test_cross_entropy_over_llama3s_vocabulary_reads_each_logit_once() -> None:
    """2048 tokens of a 128256-word vocabulary (1 GB of logits): one kernel, the logits
    read once (TVM's fusion: five kernels, four times the compulsory bytes)."""
    _, scheduled, plan = _cross_entropy((2048, 128256))
    (group,) = plan.groups
    assert not plan.fallbacks and group.online == ("T_softmax_maxelem",), str(plan)
    assert "online softmax: T_softmax_maxelem" in str(plan)
    report = analyze(scheduled)
    (kernel,) = report.kernels
    logits = kernel.traffic.buffers["logits"]
    assert logits.size_bytes == 2048 * 128256 * 4
    assert logits.read_bytes == logits.size_bytes + 2048 * 4  # and each row's target's
    assert report.traffic_ratio <= 1.01


@pytest.mark.parametrize("shape", [(16, 50257), (4, 128256)])
def test_cross_entropy_matches_onnxruntime(shape: tuple[int, int]) -> None:
    """GPT-2's vocabulary (odd: scalar accesses) and LLaMA 3's."""
    model, scheduled, plan = _cross_entropy(shape)
    assert plan.groups[0].online, str(plan)
    check = verify.run_simt(scheduled, model)
    assert check.ok, check


def test_a_softmax_on_chip_stays_in_two_passes() -> None:
    for shape in [(64, 1000), (8192 // 64, 1024)]:
        _, plan = _compiled(micro.softmax(shape))
        assert plan.groups[0].online == (), str(plan)


def test_split_rows_combine_their_pairs_after_one_grid_barrier() -> None:
    """64 rows of 30000 split over four blocks each: the two passes need a grid barrier
    after the partial maxima and another after the partial sums; online, one after the
    partial (sum, maximum) pairs, for no more bytes. The rules take it, and it matches."""
    model = micro.softmax((64, 30000))
    scheduled, plan = _compiled(model)
    (group,) = plan.groups
    assert group.online == ("T_softmax_maxelem",) and group.row_split == 4, str(plan)
    assert group.grid_barriers == 1, str(plan)
    two_pass, two_pass_plan = _compiled(model, online=False)
    assert two_pass_plan.groups[0].row_split == 4
    assert two_pass_plan.groups[0].grid_barriers == 2, str(two_pass_plan)
    # and fewer bytes: the two passes read the partial maxima again with the partial sums
    assert analyze(scheduled).global_bytes < analyze(two_pass).global_bytes
    check = verify.run_simt(scheduled, model)
    assert check.ok, check


@pytest.mark.parametrize(("name", "shape", "half"), [
    ("softmax", (64, 1000), False),
    ("softmax", (64, 1000), True),
    ("softmax", (4, 8192), False),  # rows split over blocks: pairs combined after a barrier
    ("softmax", (4, 8192), True),
    ("scale_mask_softmax", (2, 4, 64, 64), False),
    ("logsoftmax_nll", (64, 1000), False),
])
def test_chosen_online_softmax_matches_onnxruntime(name, shape, half) -> None:
    model = getattr(micro, name)(shape)
    model = _float16(model) if half else model
    scheduled, plan = _compiled(model, online=True)
    assert plan.groups[0].online, str(plan)
    check = verify.run_simt(scheduled, model)
    assert check.ok, check


def test_rows_masked_to_minus_infinity() -> None:
    """A causal mask's -inf (rows starting with masked elements, and a row masked whole,
    NaN in onnxruntime as in TVM's two passes): the pairs start from the lowest finite
    float, so no combination subtracts two infinities the two passes would not."""
    n = 96
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [8, n])
    keep = helper.make_tensor_value_info("keep", TensorProto.BOOL, [8, n])
    minus_inf = helper.make_tensor("minus_inf", TensorProto.FLOAT, [], [-np.inf])
    nodes = [helper.make_node("Where", ["keep", "x", "minus_inf"], ["masked"]),
             helper.make_node("Softmax", ["masked"], ["y"], axis=-1)]
    model = _model(nodes, [x, keep], [8, n])
    model.graph.initializer.append(minus_inf)
    scheduled, plan = _compiled(model, online=True)
    assert plan.groups[0].online, str(plan)
    rng = np.random.default_rng(0)
    feeds = {"x": rng.standard_normal((8, n)).astype("float32"),
             "keep": np.tril(np.ones((8, n), bool), k=n - 8)[::-1].copy()}
    feeds["keep"][3] = False
    outs = SimtModule(scheduled)(feeds["x"], feeds["keep"])
    refs = reference(model, feeds)
    assert np.isnan(refs[0][3]).all() and np.isnan(outs[0][3]).all()
    assert_matches(outs, refs)


def test_online_is_a_choice_and_refused_without_a_softmax() -> None:
    softmax = single_task(micro.softmax((64, 1000)))
    rules = decide(softmax.func, softmax.group, softmax.rows, softmax.target).group
    assert Choices(online_softmax=True) in choice_space(rules, 1024)
    entropy = single_task(micro.logsoftmax_nll((8, 128256)))
    rules = decide(entropy.func, entropy.group, entropy.rows, entropy.target).group
    assert rules.online and Choices(online_softmax=False) in choice_space(rules, 1024)
    norm = single_task(micro.layer_norm((64, 256)))
    with pytest.raises(Unstitchable, match="no maximum and sum of exponentials"):
        decide(norm.func, norm.group, norm.rows, norm.target, Choices(online_softmax=True))


@pytest.mark.nvcc
@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
def test_online_kernels_compile_without_spills(arch: str) -> None:
    kernels = [_cross_entropy((2048, 128256))[1],
               _compiled(micro.softmax((64, 1000)), online=True)[0],
               _compiled(micro.softmax((64, 30000)))[0]]  # rows split over blocks
    for scheduled in kernels:
        for name, func in stitched_functions(scheduled).items():
            report = compile_cuda(lower(func, name, cuda_target(arch)).source(), arch)
            found = spills(report)
            assert found and all(s == (0, 0) for s in found), report
