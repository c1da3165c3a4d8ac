"""Occupancy and launch configuration: the per-target table, blocks per wave, and the
assume-relax-apply register cap, checked against ``ptxas -v`` for sm_80 and sm_90."""

from __future__ import annotations

import functools
import re

import pytest
from stitch_helpers import import_onnx, stitched_functions
from tvm import tirx

from tvm_stitch import pipeline
from tvm_stitch.analysis import GPUS, gpu_of_arch, ptxas_resources
from tvm_stitch.lowering import lower
from tvm_stitch.plan import StitchPlan
from tvm_stitch.schedule.occupancy import (
    SIMT_DEVICE,
    blocks_per_sm,
    device_of,
    launch_config,
    max_registers,
)
from tvm_stitch.target import SIMT_CONCURRENT_BLOCKS, cuda_target, opencl_target
from tvm_stitch.workloads import registry


def test_one_table_gives_every_limit_per_architecture() -> None:
    assert {g.arch for g in GPUS.values()} == {"sm_70", "sm_80", "sm_90"}
    h200, a100 = gpu_of_arch("sm_90"), gpu_of_arch("sm_80")
    assert (h200.name, h200.sms, h200.shared_bytes_per_sm) == ("H200", 132, 228 * 1024)
    assert (a100.name, a100.sms, a100.shared_bytes_per_sm) == ("A100", 108, 164 * 1024)
    assert device_of(cuda_target("sm_80")) is a100
    assert device_of(opencl_target()) is SIMT_DEVICE
    assert SIMT_DEVICE.sms * SIMT_DEVICE.max_blocks_per_sm == SIMT_CONCURRENT_BLOCKS
    with pytest.raises(ValueError, match="sm_61"):
        gpu_of_arch("sm_61")


def test_blocks_per_sm_takes_the_tightest_limit() -> None:
    h200 = gpu_of_arch("sm_90")
    assert blocks_per_sm(h200, 256, 32, 0) == 8  # threads: 2048 / 256
    assert blocks_per_sm(h200, 32, 16, 0) == 32  # blocks per SM
    assert blocks_per_sm(h200, 256, 64, 0) == 4  # registers: 64 x 256 = 16K of 64K
    assert blocks_per_sm(h200, 256, 48, 0) == 5  # 1536 per warp: 10 in each 16K quarter
    assert blocks_per_sm(h200, 256, 32, 40 * 1024) == 5  # 228 KB / (40 KB + 1 KB)
    assert blocks_per_sm(h200, 256, 32, 49 * 1024) == 0  # over 48 KB of static shared
    assert blocks_per_sm(h200, 1024, 65, 0) == 0  # 65 x 1024 > 64K registers


def test_assume_relax_apply() -> None:
    h200 = gpu_of_arch("sm_90")
    # assumed 48 registers: 5 blocks of 256 threads; relaxed: 51 registers would need 1632
    # per warp (granules of 256), which 5 x 8 warps do not fit, so the cap stays 48
    launch = launch_config(h200, 256, 0, grid=1000)
    assert (launch.blocks_per_sm, launch.max_registers, launch.wave) == (5, 48, 660)
    # a grid of 100 blocks puts one on an SM: the bound asks no more, and a thread may take
    # all the registers it wants
    launch = launch_config(h200, 256, 0, grid=100)
    assert (launch.blocks_per_sm, launch.max_registers, launch.wave) == (1, 255, 132)
    # shared memory limits to 4 blocks (228 KB / 46 KB): registers relax to 64 per thread
    launch = launch_config(h200, 256, 45 * 1024)
    assert (launch.blocks_per_sm, launch.max_registers) == (4, 64)
    assert max_registers(h200, 1024, 1) == 64
    assert max_registers(h200, 32, 1) == 255
    with pytest.raises(ValueError, match="cannot launch"):
        launch_config(h200, 256, 60 * 1024)


CASES = ["softmax", "rowreduce_750000x32", "logsoftmax_nll", "layernorm_backward",
         "colsum_8192x1024"]


@functools.cache
def _scheduled(name: str, arch: str):
    model = registry.get(name).model("ci")
    return pipeline.lower(import_onnx(model), cuda_target(arch), flow="stitch")


@pytest.mark.nvcc
@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
@pytest.mark.parametrize("name", CASES)
def test_launch_bounds_hold_in_ptxas(name: str, arch: str) -> None:
    scheduled = _scheduled(name, arch)
    plan = StitchPlan.of_module(scheduled)
    gpu = gpu_of_arch(arch)
    for fname, func in stitched_functions(scheduled).items():
        launch = next(g for g in plan.groups if g.function == fname).launch
        lowered = lower(func, fname, cuda_target(arch))
        source = lowered.source()
        bounds = set(re.findall(r"__launch_bounds__\((\d+), (\d+)\)", source))
        assert bounds == {(str(launch.threads), str(launch.blocks_per_sm))}
        resources = ptxas_resources(source, arch)
        for k in lowered.launches:
            res = resources[k.kernel]
            assert res.registers <= launch.max_registers
            assert res.spill_store_bytes == res.spill_load_bytes == 0
            resident = blocks_per_sm(gpu, launch.threads, res.registers, res.shared_bytes)
            assert resident >= launch.blocks_per_sm
            assert res.shared_bytes <= launch.shared_bytes
            if plan.group(int(func.attrs["stitch.group"])).phases:  # a persistent grid
                (grid, _, _), _ = k.geometry(lowered.bind_shapes(_shapes(lowered)))
                assert grid == launch.grid <= gpu.sms * resident  # every block resident


def _shapes(lowered) -> list[tuple[int, ...]]:
    return [tuple(int(d) for d in p.shape) for p in lowered.params
            if isinstance(p.ty, tirx.BufferType)]
