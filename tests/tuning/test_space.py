"""Choices fix what they name and nothing else, an illegal one is refused, and the candidate
space offers only kernels that decide built, the rules' first."""

from __future__ import annotations

import functools

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper
from tvm import s_tir, tirx

from tvm_stitch import pipeline, verify
from tvm_stitch.analysis.ptxas import lowered_resources
from tvm_stitch.analysis.report import lowered_reports
from tvm_stitch.frontend.onnx import import_model
from tvm_stitch.plan import BufferRole, Choices, MappingKind, StitchPlan, StorageLevel
from tvm_stitch.schedule.decisions import decide
from tvm_stitch.schedule.decisions.choosing import FixedChoices, Task, choosing
from tvm_stitch.schedule.rows import Unstitchable
from tvm_stitch.tuning.space import candidates, choice_space
from tvm_stitch.tuning.tasks import extract_tasks
from tvm_stitch.workloads import all_workloads, micro

TARGET = "cuda:sm_90"


@functools.cache
def _task(kind: str) -> Task:
    model = {"rows": micro.layer_norm((64, 1024)), "flat": micro.bias_gelu((64, 1024)),
             "split": micro.softmax((8, 8192)), "global": micro.layernorm_backward((256, 128)),
             "sum": micro.row_sum((2000, 32))}[kind]
    (task, *_) = extract_tasks(import_model(model), TARGET)
    return task


def _decide(kind: str, choices: Choices):
    task = _task(kind)
    return decide(task.func, task.group, task.rows, task.target, choices).group


def test_row_choices_are_what_the_kernel_takes() -> None:
    group = _decide("rows", Choices(threads_per_row=128, vector=2, row_steps=2))
    assert group.mapping.kind is MappingKind.BLOCK_PER_ROW
    assert (group.mapping.threads_per_row, group.mapping.vector, group.mapping.row_steps) == \
        (128, 2, 2)
    assert group.choices == Choices(threads_per_row=128, vector=2, row_steps=2)
    packed = _decide("rows", Choices(threads_per_row=32, rows_per_block=4)).mapping
    assert (packed.kind, packed.rows_per_block, packed.threads_per_row) == \
        (MappingKind.WARP_PER_ROW, 4, 32)
    long_rows = _decide("rows", Choices(threads_per_row=128, rows_per_block=2)).mapping
    assert (long_rows.kind, long_rows.rows_per_block, long_rows.threads_per_row) == \
        (MappingKind.BLOCK_PER_ROW, 2, 128)


def test_flat_and_split_choices() -> None:
    flat = _decide("flat", Choices(block_threads=128, vector=1)).mapping
    assert (flat.threads_per_block, flat.vector) == (128, 1)
    assert _decide("split", Choices()).row_split > 1
    assert _decide("split", Choices(split_parts=1)).row_split == 1


def test_staging_choices() -> None:
    rules = _decide("rows", Choices())
    assert [b.name for b in rules.staged if b.role is BufferRole.INPUT] == ["x"]
    reread = _decide("rows", Choices(reread=("x",)))
    assert [b.level for b in reread.buffers if b.name == "x"] == [StorageLevel.GLOBAL]
    held = _decide("rows", Choices(held=("x",)))
    assert [b.level for b in held.buffers if b.name == "x"] == [StorageLevel.REGISTER]
    assert held.shared_bytes < rules.shared_bytes


@pytest.mark.parametrize(("kind", "choices", "why"), [
    ("rows", Choices(threads_per_row=48), "not a power of two"),
    ("rows", Choices(threads_per_row=2048), "not a power of two up to 1024"),
    ("rows", Choices(threads_per_row=16, rows_per_block=128), "more than 1024 threads"),
    ("rows", Choices(threads_per_row=8, rows_per_block=24, row_steps=2), "do not divide"),
    ("rows", Choices(vector=8), "at most 4"),
    ("rows", Choices(row_steps=3), "do not divide"),
    ("rows", Choices(reread=("nothing",)), "not staged"),
    ("rows", Choices(held=("const1",)), "not staged per row"),
    ("global", Choices(held=("dy",)), "no choice of held"),
    ("rows", Choices(vector_reads=True), "no reduction reads its inputs in whole aligned"),
    ("global", Choices(vector_reads=True), "no choice of vector_reads"),
    ("rows", Choices(block_threads=64), "no choice of block_threads"),
    ("flat", Choices(threads_per_row=64), "no choice of threads_per_row"),
    ("flat", Choices(block_threads=256, vector=16), "do not split"),
    ("global", Choices(rows_per_block=2), "no choice of rows_per_block"),
    ("global", Choices(column_tiles=3), "column tiles"),
    ("split", Choices(split_parts=7), "cannot be split"),
])
def test_an_illegal_choice_is_refused(kind: str, choices: Choices, why: str) -> None:
    with pytest.raises(Unstitchable, match=why):
        _decide(kind, choices)


@pytest.mark.parametrize("kind", ["rows", "flat", "split", "global"])
def test_candidates_are_distinct_legal_kernels_the_rules_first(kind: str) -> None:
    task = _task(kind)
    found = candidates(task, 6)
    assert found[0].choices == Choices()
    assert len(found) > 1, choice_space(found[0].group, 1024)
    groups = [c.group for c in found]
    assert len({g.mapping for g in groups} | {g.buffers for g in groups}) > 1
    for c in found[1:]:
        again = decide(task.func, task.group, task.rows, task.target, c.choices).group
        assert again == c.group


@pytest.mark.parametrize("choices", [Choices(held=("x",)), Choices(reread=("x",)),
                                     Choices(threads_per_row=8, rows_per_block=8, vector=1)])
def test_chosen_kernels_match_onnxruntime(choices: Choices) -> None:
    model = micro.softmax((64, 1024))
    with choosing(FixedChoices(choices)):
        scheduled = pipeline.lower(import_model(model), TARGET, flow="stitch")
    (group,) = StitchPlan.of_module(scheduled).groups
    assert group.choices == choices
    assert verify.run_simt(scheduled, model).ok


def test_reductions_read_vectors_when_chosen() -> None:
    """A row sum reading its input a float4 at a time: a quarter of the memory accesses,
    the same numbers, no stack frame."""
    task = _task("sum")
    rules = decide(task.func, task.group, task.rows, task.target)
    chosen = decide(task.func, task.group, task.rows, task.target, Choices(vector_reads=True))
    assert rules.group.vector_reads == () and chosen.group.vector_reads == ("x_red",)
    (before,), (after,) = lowered_reports(rules.lowered), lowered_reports(chosen.lowered)
    assert after.traffic.global_bytes == before.traffic.global_bytes
    assert after.traffic.accesses * 3 < before.traffic.accesses
    assert "float4" in chosen.lowered.source()
    for arch in ("sm_80", "sm_90"):
        (resources,) = lowered_resources(chosen.lowered, arch).values()
        assert resources.stack_bytes == resources.spill_store_bytes == 0
    model = micro.row_sum((2000, 32))
    with choosing(FixedChoices(Choices(vector_reads=True))):
        scheduled = pipeline.lower(import_model(model), TARGET, flow="stitch")
    assert StitchPlan.of_module(scheduled).groups[0].vector_reads == ("x_red",)
    assert verify.run_simt(scheduled, model).ok


def test_a_group_normalisations_split_rows_are_searched_over_parts_and_threads() -> None:
    """Stable Diffusion's group normalisation + SiLU, (2, 320, 64, 64) in 32 groups: the
    rules split each group's rows in 2 parts of 1024 threads, which ran at 0.51x of TVM's
    kernels on an H200 (docs/results/gpu-2026-12-04-h200.md); the space offers the other
    part counts its whole channels allow and other block sizes, and no split at all, and
    each of them builds (checked on three, not the whole space: it is slow to build)."""
    workload = {w.name: w for w in all_workloads()}["group_norm_silu"]
    (task,) = extract_tasks(import_model(workload.model("real")), TARGET)
    rules = decide(task.func, task.group, task.rows, task.target).group
    space = choice_space(rules, 1024)
    assert len({c.split_parts for c in space if c.split_parts}) >= 5, space
    for parts, threads in [(2, 1024), (10, 256), (1, 256)]:
        choices = Choices(split_parts=parts, threads_per_row=threads)
        assert choices in space
        built = decide(task.func, task.group, task.rows, task.target, choices).group
        assert (built.row_split, built.mapping.threads_per_row) == (parts, threads)


def test_packed_rows_with_a_guarded_last_block_keep_a_weight_as_long_as_the_rows() -> None:
    """RMSNorm of 64 rows of 64, 6 rows per block (the last block guarded): the weight (64,)
    is staged once per block and must not be indexed by row because it is as long as the
    row count (it was: 6 slots held the 64 weights; T5's weights of ones hid it in the zoo)."""
    model = micro.rms_norm((64, 64))
    choices = Choices(threads_per_row=32, rows_per_block=6, vector=1)
    with choosing(FixedChoices(choices)):
        scheduled = pipeline.lower(import_model(model), TARGET, flow="stitch")
    (group,) = StitchPlan.of_module(scheduled).groups
    assert group.mapping.rows_per_block == 6 and group.choices == choices
    assert verify.run_simt(scheduled, model).ok


def test_a_rows_token_id_is_copied_by_every_thread_of_the_row() -> None:
    """An embedding row (Gather) then RMSNorm, rows packed 4 per block: a thread that reads
    its row's staged id must have written it itself. Written by the row's first thread
    alone, the other threads read it with no barrier between (TVM inserts none for accesses
    of the same index): a stale id, and on an H200 an illegal address (t5_block's tuning
    candidates, docs/results/gpu-2026-12-04-h200.md)."""
    rows, width, vocab = 64, 256, 50
    graph = helper.make_graph(
        [helper.make_node("Gather", ["table", "ids"], ["e"]),
         helper.make_node("Mul", ["e", "e"], ["sq"]),
         helper.make_node("ReduceMean", ["sq", "axes"], ["ms"], keepdims=1),
         helper.make_node("Add", ["ms", "eps"], ["v"]),
         helper.make_node("Sqrt", ["v"], ["r"]),
         helper.make_node("Div", ["e", "r"], ["y"])],
        "embed_norm",
        [helper.make_tensor_value_info("ids", TensorProto.INT64, [rows])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [rows, width])],
        [numpy_helper.from_array(np.random.default_rng(0).standard_normal(
            (vocab, width)).astype(np.float32), "table"),
         numpy_helper.from_array(np.array([-1], np.int64), "axes"),
         numpy_helper.from_array(np.array(1e-6, np.float32), "eps")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    with choosing(FixedChoices(Choices(threads_per_row=64, rows_per_block=4, row_steps=1))):
        scheduled = pipeline.lower(import_model(model), TARGET, flow="stitch")
    (group,) = StitchPlan.of_module(scheduled).groups
    assert group.mapping.rows_per_block == 4
    func = next(f for f in scheduled.functions.values()
                if isinstance(f, tirx.PrimFunc) and "ids_shared" in f.script())
    sch = s_tir.Schedule(func)
    bound = [sch.get(loop).thread_binding for loop in sch.get_loops(sch.get_sblock("ids_shared"))]
    assert "threadIdx.x" not in {b.thread_tag for b in bound if b is not None}
    assert verify.run_simt(scheduled, model).ok
