"""Fuzz seed 1 graph 6 (``cases/stitch-s1-g6``): a column softmax of (8, 64) float16, one block
of 64 threads, was planned at 21 blocks per SM with 48 registers per thread, but
``__launch_bounds__(64, 21)`` made ptxas cap it at 40 registers and it spilled 16 B (an 8 B
stack frame) on sm_80 and sm_90. The register file is four sub-partitions of 16K registers and
a warp's registers all come from one (CUDA's occupancy calculator counts warps per
sub-partition); the model divided the whole 64K among the blocks, so where the warps do not
spread evenly it promised more registers than ptxas gives. Owner: schedule/occupancy.py
(``blocks_per_sm``, ``max_registers``)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import numpy as np
import onnx
import pytest
from regression_models import needs_stitch

from tvm_stitch import verify
from tvm_stitch.analysis import gpu_of_arch, ptxas_resources
from tvm_stitch.frontend.onnx import import_model
from tvm_stitch.plan import StitchPlan
from tvm_stitch.schedule.decisions import _settle_launch, decide
from tvm_stitch.schedule.occupancy import blocks_per_sm, launch_config, max_registers
from tvm_stitch.testing.differential import check_model
from tvm_stitch.tuning.tasks import extract_tasks
from tvm_stitch.workloads.graph import GraphBuilder

CASE = Path(__file__).parent / "cases" / "stitch-s1-g6.onnx"

# (threads, blocks per SM): where the whole file and its sub-partitions give different caps
# (the first six), and where they agree
BOUNDS = [(64, 21), (96, 14), (224, 3), (352, 2), (544, 1), (672, 1), (256, 5), (1024, 1)]

# Wants more registers than any of BOUNDS allows: 128 values live from the loads to the stores.
HUNGRY = r"""
extern "C" __global__ void __launch_bounds__({threads}, {blocks}) hungry(
    float* __restrict__ a, float* __restrict__ b) {{
  float v[128];
#pragma unroll
  for (int i = 0; i < 128; ++i) v[i] = a[i * 1024 + threadIdx.x];
  float s = 0.f;
#pragma unroll
  for (int i = 0; i < 128; ++i) s += v[i] * v[(i * 7) % 128];
#pragma unroll
  for (int i = 0; i < 128; ++i) b[i * 1024 + threadIdx.x] = v[i] * s;
}}
"""


def test_registers_are_counted_per_sub_partition() -> None:
    h200 = gpu_of_arch("sm_90")
    assert blocks_per_sm(h200, 64, 48, 0) == 20  # 10 warps of 1536 registers in each 16K
    assert max_registers(h200, 64, 21) == 40  # 42 warps: 11 in the fullest sub-partition
    assert max_registers(h200, 64, 20) == 48


@pytest.mark.nvcc
@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
def test_max_registers_is_the_cap_ptxas_applies(arch: str) -> None:
    gpu = gpu_of_arch(arch)
    for threads, blocks in BOUNDS:
        (used,) = ptxas_resources(HUNGRY.format(threads=threads, blocks=blocks), arch).values()
        assert used.registers == max_registers(gpu, threads, blocks), (threads, blocks)


@needs_stitch
@pytest.mark.usefixtures("global_at_any_cost")
def test_column_softmax_launch_keeps_the_registers_it_was_planned_for() -> None:
    (group,) = StitchPlan.of_module(verify.compile_model(onnx.load(CASE), "stitch")).groups
    launch = group.launch
    # one tile of 8 rows keeps 16 re-read halves per thread: 24 + 2 x 16 registers wanted,
    # so the persistent grid took 18 blocks per SM (tiles.tiles_for_cached), each thread 56;
    # its grid now leaves a thread all it may have: of one block, or of 4 since the
    # normalising phase after the column sums takes tasks of 2 rows
    # (``global_stitch._rows_after_columns``)
    assert (launch.threads, launch.grid, launch.blocks_per_sm) == (64, 4, 1)
    assert launch.max_registers == max_registers(gpu_of_arch("sm_90"), 64, 1) >= 56



def _middle_axis_softmax() -> onnx.ModelProto:
    # fuzz graph 12012:253, shrunk: a float16 softmax over the middle axis of (2, 3136, 96)
    # after a chain of element-wise ops, stitched as strided rows of its transposed view
    g = GraphBuilder("middle_axis_softmax")
    x = g.input("x", (2, 3136, 96), dtype=np.float16)
    shifted = g.op("Add", g.op("Abs", g.op("Neg", x)), g.constant(0.5, dtype=np.float16))
    return g.model([g.op("Abs", g.op("Softmax", g.op("Reciprocal", shifted), axis=1))])


def _layer_norm_beside_a_division() -> onnx.ModelProto:
    # fuzz graph 12014:310, shrunk: a float16 LayerNorm of |x| (eight lanes normalised in
    # float32) beside 1 / (|x| + 0.5) + s, over 8 rows of 256 halves
    g = GraphBuilder("layer_norm_beside_a_division")
    x, s = g.input("x", (8, 256), dtype=np.float16), g.input("s", (), dtype=np.float16)
    a = g.op("Abs", x)
    b = g.op("Add", a, g.constant(0.5, dtype=np.float16))
    scale = g.constant(np.linspace(0.5, 1.5, 256), "scale", np.float16)
    return g.model([a, g.op("Add", g.op("Reciprocal", b), s),
                    g.op("LayerNormalization", a, scale, axis=-1)])


@needs_stitch
@pytest.mark.parametrize(("built", "blocks"), [(_middle_axis_softmax, 2),
                                               (_layer_norm_beside_a_division, 1)])
def test_a_launch_bound_asks_no_more_blocks_per_sm_than_the_grid_puts_there(
        built: Callable[[], onnx.ModelProto], blocks: int) -> None:
    # 192 blocks of 128 threads were bound to 10 per SM (48 registers) and spilled 16 B on
    # sm_80 and 24 B on sm_90; 8 blocks of 256 threads bound to 5 per SM spilled 16 B on
    # sm_80. On 132 SMs such grids put 2 and 1 blocks on an SM.
    model = built()
    (group, *_) = StitchPlan.of_module(verify.compile_model(model, "stitch")).groups
    assert group.launch.blocks_per_sm == blocks
    outcome = check_model(model, "stitch", triage=False)
    assert outcome.kind == "ok" and not outcome.fallbacks, (outcome.error, outcome.fallbacks)
    assert outcome.violations == []


@needs_stitch
def test_a_settled_launch_keeps_the_register_cap_the_plan_was_made_under() -> None:
    # Shared memory the built kernel declares below the plan's estimate lets more blocks
    # share an SM, each with fewer registers; the plan's unrolling and cached elements were
    # sized to its cap (the softmax above planned 25344 B, 8 blocks per SM and 64 registers
    # at 768 blocks and more, and declared 12800 B: 10 per SM would leave 48).
    (task,) = extract_tasks(import_model(_middle_axis_softmax()), "cuda:sm_90")
    done = decide(task.func, task.group, task.rows, task.target)
    h200 = gpu_of_arch("sm_90")
    planned = launch_config(h200, 128, 25344, grid=3000)
    assert (planned.blocks_per_sm, planned.max_registers) == (8, 64)
    settled = _settle_launch(replace(done.group, launch=planned), done.lowered, h200).launch
    assert settled.shared_bytes < planned.shared_bytes
    assert settled.max_registers == 64 and settled.blocks_per_sm == 8
