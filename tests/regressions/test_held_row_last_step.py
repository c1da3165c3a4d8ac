"""Fuzz seed 4242 graph 38 (``cases/stitch-s4242-g38``): a softmax over 2 rows of 30000
float32, a block of 1024 threads per row holding 30 elements of the row per thread in
registers, with three element-wise outputs, spilled 40-48 B on sm_80 and sm_90 at the 64
registers of its launch bound (rows of 29000 spilled 32-64 B, of 31000 40 B). The threads do
not divide the row (29 whole steps of 1024 and one of 304): every reader walked all of its
steps under the row-end guard, and nvcc, which does not bound ``threadIdx.x`` by the block
size, kept the guard (a branch) on each unrolled step. Fuzz seed 12027 graph 159: the same
on a persistent grid (a log-softmax and a floor over 64 rows of 30000 beside the rows'
minima summed over the rows), whose readers the earlier split of their walks skipped: 44 B
spilled on sm_80, 32 B on sm_90. Fuzz seed 12029 graph 422: a softmax, a log-softmax of it
and its minima over 2 rows of 30000 held the same way, five reductions each testing every
step: 8-24 B spilled. The readers of a held copy now state the guard per step
(``step < 29 or threadIdx.x < 304``), which nvcc folds to true on every unrolled step but
the last; a reduction's after its cross-thread reduction is lowered. Owner:
schedule/registers.py (``guard_last_steps``)."""

from __future__ import annotations

import numpy as np
import pytest
import tvm
import tvm_ffi
from onnx import helper
from regression_models import model, needs_stitch
from tvm import tirx
from tvm.sym import Analyzer

from tvm_stitch import verify
from tvm_stitch.lowering import lower
from tvm_stitch.plan import GROUP_ATTR, StitchPlan, StorageLevel
from tvm_stitch.target import cuda_target
from tvm_stitch.testing.differential import check_model

pytestmark = needs_stitch

THREADS = 1024


ROWS = 132
"""As many rows as the H200 has SMs: a block per row. Fewer (the saved case's 2) are split
over several blocks each (task splitting), which holds no row in registers."""


def _softmax_three_outputs(length: int) -> object:
    """The saved case's stitched group: x held in registers, read by the softmax's
    reductions and by three element-wise outputs."""
    nodes = [helper.make_node("Neg", ["x"], ["n"]),
             helper.make_node("Softmax", ["n"], ["s"], axis=-1),
             helper.make_node("Neg", ["n"], ["m"]),
             helper.make_node("Less", ["m", "x"], ["l"]),
             helper.make_node("Cast", ["l"], ["c"], to=1)]
    shape = [ROWS, length]
    return model(nodes, {"x": shape}, {"n": shape, "s": shape, "c": shape})


def _log_softmax_beside_rows_minimum(length: int) -> object:
    """Fuzz 12027:159 reduced: a persistent grid (the rows' minima summed over the rows)
    holding x in registers for a log-softmax and a floor, a block of 1024 threads a row."""
    nodes = [helper.make_node("LogSoftmax", ["x"], ["y"], axis=-1),
             helper.make_node("Floor", ["x"], ["f"]),
             helper.make_node("ReduceMin", ["x", "last"], ["m"], keepdims=1),
             helper.make_node("ReduceSum", ["m", "first"], ["s"], keepdims=1)]
    shape = [64, length]
    return model(nodes, {"x": shape}, {"y": shape, "f": shape, "s": [1, 1]},
                 {"last": np.array([1], np.int64), "first": np.array([0], np.int64)})


def _softmax_log_softmax_minimum(length: int) -> object:
    """Fuzz 12029:422: a softmax, a log-softmax of it and its row minima beside the mean of
    x, over 2 rows held in registers, a block of 1024 threads a row: five reductions over
    the held copy, each under the row guard."""
    nodes = [helper.make_node("Softmax", ["x"], ["s"], axis=-1),
             helper.make_node("LogSoftmax", ["s"], ["y"], axis=1),
             helper.make_node("ReduceMin", ["s", "last"], ["m"], keepdims=0),
             helper.make_node("ReduceMean", ["x", "last"], ["a"], keepdims=0)]
    return model(nodes, {"x": [2, length]}, {"y": [2, length], "m": [2], "a": [2]},
                 {"last": np.array([1], np.int64)})


def _guards_beyond_the_last_step(kernel: tirx.PrimFunc) -> int:
    """Row guards (conditions on a loop's step and the thread index) over stores inside a
    loop of more than one step (an output's, or a reduction's update in registers) that do
    not fold to true, for every step but the last, knowing nothing of the thread indices
    (what nvcc knows of them)."""
    found = 0

    def in_loop(loop: tirx.For) -> None:
        nonlocal found
        if not isinstance(loop.extent, tirx.IntImm) or int(loop.extent) < 2:
            return
        conditions: list[tirx.IfThenElse] = []
        tvm_ffi.structural_walk(loop.body, [(tirx.IfThenElse, conditions.append)])
        for condition in conditions:
            stores: list[tirx.BufferStore] = []
            tvm_ffi.structural_walk(condition.then_case, [(tirx.BufferStore, stores.append)])
            names: list[tvm.ir.Var] = []
            tvm_ffi.structural_walk(condition.condition, [(tvm.ir.Var, names.append)])
            if not stores or not any(v.same_as(loop.loop_var) for v in names) \
                    or not any(v.name.startswith("threadIdx") for v in names):
                continue
            for step in range(int(loop.extent) - 1):
                at_step = tvm_ffi.structural_map(condition.condition, [(
                    tvm.ir.Var, lambda v, k=step: tirx.IntImm(v.ty.dtype, k)
                    if v.same_as(loop.loop_var) else v)])
                if not Analyzer().can_prove(at_step):
                    found += 1
                    break

    tvm_ffi.structural_walk(kernel.body, [(tirx.For, in_loop)])
    return found


CASES = {"softmax, three outputs": _softmax_three_outputs,
         "persistent grid, log-softmax": _log_softmax_beside_rows_minimum,
         "five reductions": _softmax_log_softmax_minimum}


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("length", [29000, 30000])
def test_only_the_last_step_of_a_held_row_is_guarded(case: str, length: int) -> None:
    built = CASES[case](length)
    scheduled = verify.compile_model(built, "stitch")
    (group,) = StitchPlan.of_module(scheduled).groups
    steps = -(-length // THREADS)
    x = next(b for b in group.buffers if b.name == "x")
    assert group.mapping.threads_per_row == THREADS
    assert (x.level, x.note) == (StorageLevel.REGISTER,
                                 f"{steps} element(s) of the row per thread")
    (gv, func), = [(gv, f) for gv, f in scheduled.functions.items()
                   if isinstance(f, tirx.PrimFunc) and f.attrs is not None
                   and GROUP_ATTR in f.attrs]
    lowered = lower(func, gv.name_hint, cuda_target("sm_90"))
    for launch in lowered.launches:
        assert _guards_beyond_the_last_step(lowered.kernel(launch.kernel)) == 0
    outcome = check_model(built, "stitch", triage=False)  # onnxruntime on the SIMT runner
    assert outcome.kind == "ok", outcome.error
    assert outcome.violations == []  # ptxas on sm_80 and sm_90: no spills, no stack frame
