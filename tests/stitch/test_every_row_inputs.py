"""Inputs every row reads alike (a LayerNorm's gamma and beta) staged once per thread block
where the row count leaves a partial last block: a symbolic batch (a model exported with
dynamic axes) or a count the block's rows do not divide. Such a block used to read them
again for every row (twice the compulsory bytes of a LayerNorm); the data does not depend
on the row, so the last block stages it like the others. Inputs read alike by runs of rows
(a mask per batch) depend on the rows past the end and are still re-read."""

from __future__ import annotations

import functools

import numpy as np
import onnx
import pytest
from stitch_helpers import (
    assert_matches,
    compile_cuda,
    lower_stitch,
    reference,
    spills,
    stitched_functions,
)
from test_dynamic_rows import symbolic_batch

from tvm_stitch.analysis import analyze
from tvm_stitch.lowering import lower
from tvm_stitch.plan import Group, MappingKind, StitchPlan, StorageLevel
from tvm_stitch.simt import SimtModule
from tvm_stitch.target import cuda_target
from tvm_stitch.workloads import micro

# name: (workload, shape with the batch first, rows per block, most traffic ratio): BERT-base's
# LayerNorm over (batch, 768) and its residual form over (batch, 128, 768), eight rows of 64
# threads per block; a LayerNorm of 256, eight warps; RMSNorm at LLaMA's width, whose row
# and gamma take a third of the shared memory each (a block per row: gamma is read per row,
# as before; walking rows in sequence needs a row count)
CASES = {
    "layer_norm-768": ("layer_norm", (64, 768), 8, 1.13),
    "add_layer_norm-128x768": ("add_layer_norm", (2, 128, 768), 8, 1.09),
    "layer_norm-256": ("layer_norm", (64, 256), 8, 1.13),
    "rms_norm-4096": ("rms_norm", (16, 4096), 1, 1.51),
}

SIZES = (1, 7, 37)
"""Batches each compiled module runs at: one row, partial blocks."""


@functools.cache
def _compiled(case: str) -> tuple[onnx.ModelProto, object, StitchPlan]:
    name, shape, _, _ = CASES[case]
    model = symbolic_batch(getattr(micro, name)(shape))
    scheduled, plan = lower_stitch(model, "cuda:sm_90")
    return model, scheduled, plan


def _per_block(group: Group) -> list:
    return [b for b in group.buffers if b.per_block]


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_symbolic_batch_stages_gamma_once_per_block(case: str) -> None:
    _, _, plan = _compiled(case)
    (group,) = plan.groups
    mapping = group.mapping
    assert mapping.rows_expr and mapping.rows_per_block == CASES[case][2], str(plan)
    staged = _per_block(group)
    assert staged and all(b.level is StorageLevel.SHARED for b in staged), str(plan)
    assert all("read alike by every row: once per block of "
               f"{mapping.rows_per_block} rows" in b.note for b in staged), str(plan)
    assert not any(b.level is StorageLevel.GLOBAL and "read alike" in b.note
                   for b in group.buffers), str(plan)


@pytest.mark.parametrize("case", sorted(CASES))
def test_one_module_runs_every_batch(case: str) -> None:
    model, scheduled, _ = _compiled(case)
    runner = SimtModule(scheduled)
    rng = np.random.default_rng(0)
    for n in SIZES:
        inputs = {}
        for value in model.graph.input:
            dims = [n] + [d.dim_value for d in value.type.tensor_type.shape.dim[1:]]
            inputs[value.name] = rng.standard_normal(dims).astype("float32")
        outs = runner(*(inputs[i.name] for i in model.graph.input))
        assert_matches(outs, reference(model, inputs))


@pytest.mark.parametrize("case", sorted(CASES))
def test_gamma_and_beta_move_once_per_block_at_any_batch(case: str) -> None:
    """Global bytes at a batch of 4099 (a partial last block): the inputs and the output
    once, each per-block input once per block."""
    name, shape, _, ratio = CASES[case]
    _, scheduled, plan = _compiled(case)
    (group,) = plan.groups
    batch = 4099
    row_elements = int(np.prod(shape[1:]))
    rows = batch * row_elements // group.mapping.row_length
    blocks = -(-rows // group.mapping.rows_per_block)
    inputs = 2 if name == "add_layer_norm" else 1
    staged = sum(b.shared_bytes for b in _per_block(group))
    expected = (inputs + 1) * batch * row_elements * 4 + blocks * staged
    report = analyze(scheduled, shape_vars={"batch": batch})
    assert report.global_bytes == expected
    assert report.traffic_ratio <= ratio


def test_long_rows_of_a_symbolic_batch_are_packed() -> None:
    """Rows of 768 take a block of 64 threads each; with gamma and beta staged per block,
    eight share one (512 threads), so each read of them serves eight rows."""
    (group,) = _compiled("layer_norm-768")[2].groups
    mapping = group.mapping
    assert mapping.kind is MappingKind.BLOCK_PER_ROW
    assert (mapping.rows_per_block, mapping.threads_per_row) == (8, 64)


def test_a_mask_per_batch_is_still_read_again() -> None:
    """A mask read alike by the rows of one batch (runs of rows) would be staged from rows
    past the end in a partial last block: it stays in global memory, with the reason."""
    model = micro.scale_mask_softmax((2, 4, 64, 64))
    _, plan = lower_stitch(symbolic_batch(model), "cuda:sm_90")
    (group,) = plan.groups
    mask = [b for b in group.buffers if "read alike by" in b.note]
    assert mask and all(b.level is StorageLevel.GLOBAL and "symbolic row count" in b.note
                        for b in mask), str(plan)


def test_a_static_count_with_a_partial_last_block() -> None:
    """1001 rows of 256 walk 7 rows per block, fewer than half a wave of blocks sharing
    gamma would have wanted; they are staged for those 7 (were read per row). A chosen
    packing the row count does not divide: ``test_packed_long_rows``."""
    rows = 1001
    model = micro.layer_norm((rows, 256))
    scheduled, plan = lower_stitch(model, "cuda:sm_90")
    (group,) = plan.groups
    staged = _per_block(group)
    assert len(staged) == 2, str(plan)
    assert group.mapping.rows_per_block * group.mapping.row_steps > 1
    rng = np.random.default_rng(1)
    x = rng.standard_normal((rows, 256)).astype("float32")
    assert_matches(SimtModule(scheduled)(x), reference(model, {"x": x}))
    assert analyze(scheduled).traffic_ratio < 1.2


@pytest.mark.nvcc
@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
def test_kernels_compile_without_spills(arch: str) -> None:
    for case in CASES:
        for name, func in stitched_functions(_compiled(case)[1]).items():
            report = compile_cuda(lower(func, name, cuda_target(arch)).source(), arch)
            found = spills(report)
            assert found and all(s == (0, 0) for s in found), (case, report)
