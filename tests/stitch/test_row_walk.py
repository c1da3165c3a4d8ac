"""Element-wise groups that walk rows (``schedule/decisions/row_walk``): an input read alike
by runs of rows (a bias, a per-batch mask row) is loaded into each thread's registers once
for all the rows it walks, not once per element as a flat kernel reads it."""

from __future__ import annotations

import contextlib
import functools

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from tvm_stitch import pipeline, verify
from tvm_stitch.analysis import analyze
from tvm_stitch.frontend.onnx import import_model
from tvm_stitch.plan import BufferRole, Choices, MappingKind, StitchPlan, StorageLevel
from tvm_stitch.schedule.decisions import decide
from tvm_stitch.schedule.decisions.choosing import FixedChoices, choosing
from tvm_stitch.schedule.rows import Unstitchable
from tvm_stitch.testing.resources import check_resources
from tvm_stitch.tuning.space import candidates
from tvm_stitch.tuning.tasks import extract_tasks
from tvm_stitch.workloads import registry


def _bias_silu(shape: list[int], dtype: int = TensorProto.FLOAT, bias_shape: list | None = None
               ) -> object:
    """h = x + b; y = h * Sigmoid(h), b of ``bias_shape`` (the last axis of ``shape``)."""
    x = helper.make_tensor_value_info("x", dtype, shape)
    y = helper.make_tensor_value_info("y", dtype, shape)
    bias_shape = bias_shape or shape[-1:]
    values = np.linspace(-1, 1, int(np.prod(bias_shape))).reshape(bias_shape)
    b = numpy_helper.from_array(
        values.astype(np.float32 if dtype == TensorProto.FLOAT else np.float16), "b")
    nodes = [helper.make_node("Add", ["x", "b"], ["h"]),
             helper.make_node("Sigmoid", ["h"], ["s"]),
             helper.make_node("Mul", ["h", "s"], ["y"])]
    graph = helper.make_graph(nodes, "bias_silu", [x], [y], [b])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])


@functools.cache
def _lowered(shape: tuple[int, ...], dtype: int = TensorProto.FLOAT,
             bias_shape: tuple[int, ...] | None = None, forced: bool = False):
    model = _bias_silu(list(shape), dtype, list(bias_shape) if bias_shape else None)
    with choosing(FixedChoices(Choices(walk_rows=True))) if forced else contextlib.nullcontext():
        scheduled = pipeline.lower(import_model(model), "cuda:sm_90", "stitch")
    return model, scheduled, StitchPlan.of_module(scheduled)


CASES = [((64, 256), TensorProto.FLOAT, None, True),  # four rows of 64 threads per block
         ((4, 196, 768), TensorProto.FLOAT, None, True),  # a ViT-S MLP's (B, HW, C)
         ((1024, 1024), TensorProto.FLOAT16, None, True),  # four halves: a kept intermediate
         ((512, 64), TensorProto.FLOAT, None, True),  # sixteen rows of 16 threads
         ((8192, 768), TensorProto.FLOAT, None, False),  # the rules' walk: steps of 4 rows
         ((4096, 3072), TensorProto.FLOAT, None, False),  # three blocks a row
         ((2, 300, 64), TensorProto.FLOAT, (2, 1, 64), True),  # runs of 300 rows per batch
         ((32, 2048, 64), TensorProto.FLOAT16, (32, 1, 64), False)]  # halves, runs of 2048


@pytest.mark.parametrize(("shape", "dtype", "bias_shape", "forced"), CASES)
def test_the_walk_matches_onnxruntime(shape, dtype, bias_shape, forced) -> None:
    model, scheduled, plan = _lowered(shape, dtype, bias_shape, forced)
    (group,) = plan.groups
    assert group.mapping.kind is MappingKind.ROW_WALK
    (bias,) = [b for b in group.buffers if b.name == "b" or b.per_block]
    assert bias.level is StorageLevel.REGISTER and bias.per_block
    assert verify.run_simt(scheduled, model).ok


@pytest.mark.parametrize(("shape", "dtype", "bias_shape", "forced"), CASES)
def test_the_walk_reads_its_bias_once_per_thread(shape, dtype, bias_shape, forced) -> None:
    """Global bytes: the input, the output, and the bias once per thread of each block."""
    _, scheduled, plan = _lowered(shape, dtype, bias_shape, forced)
    (group,) = plan.groups
    mapping = group.mapping
    item = 4 if dtype == TensorProto.FLOAT else 2
    per_block = mapping.rows_per_block * mapping.threads_per_row * mapping.vector * item
    bias_rows = mapping.rows // (1 if bias_shape is None else bias_shape[0])
    assert mapping.rows_per_block * mapping.row_steps <= bias_rows
    assert forced or mapping.row_steps > 1
    expected = 2 * int(np.prod(shape)) * item + mapping.blocks * per_block
    assert analyze(scheduled).global_bytes == expected


def test_real_bias_gelu_is_within_five_percent_of_compulsory() -> None:
    """The stitching issue's target: bias + GELU on (8192, 3072) moved 1.5x its compulsory
    bytes as a flat kernel (the bias read at every element), 1.02x walking rows."""
    scheduled = pipeline.lower(import_model(registry.get("bias_gelu").model("real")),
                               "cuda:sm_90", "stitch")
    (group,) = StitchPlan.of_module(scheduled).groups
    assert group.mapping.kind is MappingKind.ROW_WALK
    report = analyze(scheduled)
    assert report.traffic_ratio <= 1.05
    kernels = check_resources(scheduled)
    assert not kernels.violations, kernels.violations


def test_few_rows_stay_flat() -> None:
    """Bias + SiLU on (64, 256): a wave of blocks needs every row a block of its own, so
    each thread would read the bias for one row, as a flat kernel does on more threads."""
    (group,) = _lowered((64, 256), TensorProto.FLOAT)[2].groups
    assert group.mapping.kind is MappingKind.FLAT


def test_walking_kernels_keep_registers() -> None:
    for shape, dtype, bias_shape, forced in CASES[1:3] + CASES[-1:]:
        report = check_resources(_lowered(shape, dtype, bias_shape, forced)[1])
        assert not report.violations, report.violations
        assert all(k.spill_bytes == 0 for k in report.kernels)


def test_no_input_read_alike_stays_flat() -> None:
    """x + y of one shape: nothing is read alike by rows, the rules keep it flat, and a
    walk asked for is refused."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [64, 256])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [64, 256])
    z = helper.make_tensor_value_info("z", TensorProto.FLOAT, [64, 256])
    nodes = [helper.make_node("Add", ["x", "y"], ["s"]), helper.make_node("Relu", ["s"], ["z"])]
    model = helper.make_model(helper.make_graph(nodes, "add_relu", [x, y], [z]),
                              opset_imports=[helper.make_opsetid("", 18)])
    (task,) = extract_tasks(import_model(model), "cuda:sm_90")
    assert decide(task.func, task.group, task.rows, task.target).group.mapping.kind \
        is MappingKind.FLAT
    with pytest.raises(Unstitchable, match="read alike by runs of rows"):
        decide(task.func, task.group, task.rows, task.target, Choices(walk_rows=True))


def test_candidates_offer_flat_and_other_row_steps() -> None:
    model, _, _ = _lowered((4096, 3072))
    (task,) = extract_tasks(import_model(model), "cuda:sm_90")
    found = candidates(task)
    kinds = {c.group.mapping.kind for c in found}
    assert kinds == {MappingKind.ROW_WALK, MappingKind.FLAT}
    steps = {c.group.mapping.row_steps for c in found
             if c.group.mapping.kind is MappingKind.ROW_WALK}
    assert len(steps) > 2
    for c in found:
        if c.group.mapping.kind is MappingKind.FLAT:
            assert all(b.role is not BufferRole.INPUT or b.level is not StorageLevel.REGISTER
                       for b in c.group.buffers if b.per_block)
