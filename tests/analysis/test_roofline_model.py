"""The roofline model charges launches and lack of parallelism, not only bytes."""

import pytest

from tvm_stitch import pipeline
from tvm_stitch.analysis import (
    GPUS,
    KernelWork,
    analyze,
    effective_bandwidth,
    kernel_time_us,
    waves,
)
from tvm_stitch.frontend.onnx import import_model
from tvm_stitch.workloads import micro

MB64 = 64 << 20


def _work(blocks: int, threads: int = 256, nbytes: int = MB64, access: int = 4) -> KernelWork:
    return KernelWork(nbytes, nbytes // access, blocks, threads)


def test_one_table_of_three_gpus() -> None:
    assert set(GPUS) == {"H200", "A100", "V100"}
    assert GPUS["H200"].bandwidth == 4.8e12 and GPUS["H200"].sms == 132
    assert GPUS["A100"].bandwidth == 2.0e12 and GPUS["A100"].sms == 108
    assert GPUS["V100"].bandwidth == 0.9e12 and GPUS["V100"].sms == 80
    for gpu in GPUS.values():
        assert 2.0 <= gpu.launch_overhead_us <= 10.0


@pytest.mark.parametrize("gpu", GPUS.values(), ids=list(GPUS))
def test_big_streaming_kernel_runs_at_peak_bandwidth(gpu) -> None:
    work = _work(blocks=MB64 // 4 // 256 // 4)  # four float accesses per thread
    expected = gpu.launch_overhead_us + MB64 / gpu.bandwidth * 1e6
    assert kernel_time_us(gpu, work) == pytest.approx(expected)


@pytest.mark.parametrize("gpu", GPUS.values(), ids=list(GPUS))
def test_fewer_blocks_than_sms_is_slower(gpu) -> None:
    idle = kernel_time_us(gpu, _work(blocks=gpu.sms // 2))
    full = kernel_time_us(gpu, _work(blocks=gpu.sms * 8))
    assert idle > full
    # Half the SMs idle and each busy SM starved of concurrency: at most half the bandwidth.
    assert effective_bandwidth(gpu, _work(blocks=gpu.sms // 2)) <= gpu.bandwidth / 2


@pytest.mark.parametrize("gpu", GPUS.values(), ids=list(GPUS))
def test_two_launches_cost_more_than_one_with_the_same_bytes(gpu) -> None:
    one = kernel_time_us(gpu, _work(blocks=4096))
    two = 2 * kernel_time_us(gpu, _work(blocks=4096, nbytes=MB64 // 2))
    assert two == pytest.approx(one + gpu.launch_overhead_us)


@pytest.mark.parametrize("gpu", GPUS.values(), ids=list(GPUS))
def test_each_grid_barrier_costs_its_figure(gpu) -> None:
    plain = _work(blocks=gpu.sms)
    two = KernelWork(plain.global_bytes, plain.accesses, plain.blocks, plain.threads_per_block,
                     grid_barriers=2)
    assert kernel_time_us(gpu, two) == pytest.approx(kernel_time_us(gpu, plain)
                                                     + 2 * gpu.grid_barrier_us)
    assert 1.0 <= gpu.grid_barrier_us <= 3.0


def test_a_report_charges_the_grid_barriers_of_its_kernel() -> None:
    # a batch norm's column mean and variance: row tiles, a column phase, the output rows
    scheduled = pipeline.lower(import_model(micro.batchnorm_train((4096, 512))), "cuda:sm_90",
                               "stitch")
    (kernel,) = analyze(scheduled).kernels
    assert kernel.grid_barriers == 2 and kernel.to_dict()["grid_barriers"] == 2
    gpu = GPUS["H200"]
    free = KernelWork(**{**vars(kernel.work), "grid_barriers": 0})
    assert kernel.roofline_us()["H200"] == pytest.approx(kernel_time_us(gpu, free)
                                                         + 2 * gpu.grid_barrier_us)


def test_too_few_threads_in_flight_cannot_cover_latency() -> None:
    gpu = GPUS["H200"]
    warp_per_block = kernel_time_us(gpu, _work(blocks=gpu.sms, threads=32))
    full_block = kernel_time_us(gpu, _work(blocks=gpu.sms, threads=1024))
    assert warp_per_block > 4 * full_block


def test_wider_accesses_need_fewer_threads() -> None:
    gpu = GPUS["H200"]
    scalar = effective_bandwidth(gpu, _work(blocks=gpu.sms, threads=128, access=4))
    vector = effective_bandwidth(gpu, _work(blocks=gpu.sms, threads=128, access=16))
    assert vector == pytest.approx(4 * scalar)


def test_faster_memory_is_faster_for_big_kernels() -> None:
    times = [kernel_time_us(GPUS[g], _work(blocks=16384)) for g in ("H200", "A100", "V100")]
    assert times == sorted(times)


def test_waves_use_thread_limited_occupancy() -> None:
    gpu = GPUS["H200"]
    assert waves(gpu, 128, 256) == pytest.approx(128 / (132 * 8))
    assert waves(gpu, 132 * 2, 1024) == pytest.approx(1.0)
    assert waves(gpu, 132 * 32, 32) == pytest.approx(1.0)  # capped at 32 blocks per SM


def test_empty_kernel_costs_its_launch() -> None:
    gpu = GPUS["A100"]
    assert kernel_time_us(gpu, KernelWork(0, 0, 1, 32)) == gpu.launch_overhead_us
