"""Fuzz seed 1 graph 6 (``cases/stitch-s1-g6``): a column softmax of (8, 64) float16, one block
of 64 threads, was planned at 21 blocks per SM with 48 registers per thread, but
``__launch_bounds__(64, 21)`` made ptxas cap it at 40 registers and it spilled 16 B (an 8 B
stack frame) on sm_80 and sm_90. The register file is four sub-partitions of 16K registers and
a warp's registers all come from one (CUDA's occupancy calculator counts warps per
sub-partition); the model divided the whole 64K among the blocks, so where the warps do not
spread evenly it promised more registers than ptxas gives. Owner: schedule/occupancy.py
(``blocks_per_sm``, ``max_registers``)."""

from __future__ import annotations

from pathlib import Path

import onnx
import pytest
from regression_models import needs_stitch

from tvm_stitch import verify
from tvm_stitch.analysis import gpu_of_arch, ptxas_resources
from tvm_stitch.plan import StitchPlan
from tvm_stitch.schedule.occupancy import blocks_per_sm, max_registers

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
def test_column_softmax_launch_keeps_the_registers_it_was_planned_for() -> None:
    (group,) = StitchPlan.of_module(verify.compile_model(onnx.load(CASE), "stitch")).groups
    launch = group.launch
    # one tile of 8 rows keeps 16 re-read halves per thread: 24 + 2 x 16 registers wanted,
    # so the persistent grid takes 18 blocks per SM (tiles.tiles_for_cached), each thread 56
    assert (launch.threads, launch.blocks_per_sm, launch.max_registers) == (64, 18, 56)
    assert launch.max_registers == max_registers(gpu_of_arch("sm_90"), 64, 18)
