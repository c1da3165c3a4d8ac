"""scripts/access_widths.py: bytes per global access of each stitched kernel, from nvcc's
PTX (``analysis.ptxas.global_accesses``)."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

import pytest

from tvm_stitch.analysis.ptxas import access_bytes

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))
access_widths = importlib.import_module("access_widths")


@pytest.mark.parametrize(("instruction", "size"), [
    ("ld.global.nc.v4.u32", 16), ("st.global.v4.f32", 16), ("ld.global.nc.v2.u32", 8),
    ("st.global.v4.u16", 8), ("ld.global.nc.f32", 4), ("ld.global.nc.u16", 2),
    ("ld.global.u64", 8)])
def test_access_bytes(instruction: str, size: int) -> None:
    assert access_bytes(instruction) == size


@pytest.mark.nvcc
def test_each_stitched_kernel_is_listed_with_its_widths(capsys: pytest.CaptureFixture[str]
                                                         ) -> None:
    """LLaMA at ci size: one line per kind of stitched kernel; its RMSNorm with the
    residual add moves four floats per access."""
    assert access_widths.main(["llama_block", "--size", "ci"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("== llama_block (ci, 1 layer(s), sm_90)")
    assert len(lines) > 3 and all("narrowest" in line for line in lines[1:]), lines
    norm = next(line for line in lines if "_multiply_mean_add#_tir_sqrt_divide" in line)
    assert "narrowest 16 B" in norm, norm
