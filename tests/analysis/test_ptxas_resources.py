"""Registers and shared memory come from ptxas on real TVM-generated kernels."""

import subprocess

import pytest
from shared_kernels import Softmax768

from tvm_stitch import pipeline
from tvm_stitch.analysis import analyze, ptxas
from tvm_stitch.analysis.ptxas import KernelResources, parse_ptxas

SAMPLE = """\
ptxas info    : 0 bytes gmem
ptxas info    : Compiling entry function 'softmax_kernel' for 'sm_80'
ptxas info    : Function properties for softmax_kernel
    8 bytes stack frame, 4 bytes spill stores, 12 bytes spill loads
ptxas info    : Used 40 registers, used 1 barriers, 1088 bytes smem, 364 bytes cmem[0]
ptxas info    : Compiling entry function 'add_kernel' for 'sm_80'
ptxas info    : Function properties for add_kernel
    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 10 registers, used 0 barriers, 360 bytes cmem[0]
"""




def test_parse_reads_registers_shared_memory_and_spills() -> None:
    assert parse_ptxas(SAMPLE) == {
        "softmax_kernel": KernelResources(40, 1088, 4, 12, 8),
        "add_kernel": KernelResources(10, 0, 0, 0, 0),
    }


def test_bad_architecture_is_refused() -> None:
    with pytest.raises(ValueError, match="sm_XX"):
        ptxas.ptxas_resources("", "compute_80")


@pytest.mark.nvcc
@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
def test_dlight_softmax_compiles_without_spills(arch: str) -> None:
    report = analyze(pipeline.lower(Softmax768, f"cuda:{arch}"), target=f"cuda:{arch}",
                     resources=True)
    (kernel,) = report.kernels
    res = kernel.resources
    assert res is not None
    assert 0 < res.registers <= 255
    assert res.spill_store_bytes == res.spill_load_bytes == 0
    assert res.shared_bytes > 0  # the cross-warp reduction stages partial results in shared
    assert "regs" in report.render()
    assert report.to_dict()["per_kernel"][0]["registers"] == res.registers


@pytest.mark.nvcc
def test_results_are_cached_by_source(monkeypatch: pytest.MonkeyPatch) -> None:
    report = analyze(pipeline.lower(Softmax768, "cuda"), resources=True)

    def no_compiler(*args, **kwargs):
        raise AssertionError("nvcc ran again for a source it had compiled")

    monkeypatch.setattr(subprocess, "run", no_compiler)
    again = analyze(pipeline.lower(Softmax768, "cuda"), resources=True)
    assert again.kernels[0].resources == report.kernels[0].resources
