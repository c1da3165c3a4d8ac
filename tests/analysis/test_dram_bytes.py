"""Re-reads of small broadcast operands count as L2 hits, real re-reads as DRAM traffic: the
counts tell one from the other at the sizes models have."""

from __future__ import annotations

import pytest

from tvm_stitch import analysis, pipeline
from tvm_stitch.analysis.traffic import L2_RESIDENT_BYTES
from tvm_stitch.frontend.onnx import import_model
from tvm_stitch.plan import Choices
from tvm_stitch.schedule.decisions.choosing import FixedChoices, choosing
from tvm_stitch.workloads import micro


def _report(model, flow: str = "stitch"):
    return analysis.analyze(pipeline.lower(import_model(model), "cuda:sm_90", flow))


@pytest.mark.parametrize(("model", "width"), [(micro.layer_norm((8192, 768)), 768),
                                             (micro.bias_gelu((8192, 3072)), 3072)])
def test_broadcast_operands_reach_dram_once(model, width: int) -> None:
    report = _report(model)
    (kernel,) = report.kernels
    small = [b for b in kernel.traffic.buffers.values() if b.size_bytes == width * 4]
    assert small and all(b.read_bytes > b.size_bytes for b in small), "re-read per block"
    assert all(b.l2_bytes == b.read_bytes - b.size_bytes for b in small)
    assert report.traffic_ratio > report.dram_ratio  # the re-reads are accessed, from L2
    assert report.dram_ratio == pytest.approx(1.0, abs=1e-3)
    assert report.to_dict()["dram_ratio"] == report.dram_ratio


def test_a_large_buffer_read_in_two_passes_is_dram_traffic() -> None:
    """Rows of 60000 split in 4 on 512 threads: a sub-row does not fit a block's shared
    memory, so each of the two phases of the online softmax reads it (the rules split them
    in 10 on 256 threads and keep them on chip)."""
    with choosing(FixedChoices(Choices(split_parts=4, threads_per_row=512))):
        report = _report(micro.softmax((64, 60000)))
    (kernel,) = report.kernels
    x = kernel.traffic.buffers["x"]
    assert x.size_bytes > L2_RESIDENT_BYTES and x.read_bytes == 2 * x.size_bytes  # 2 passes
    assert x.l2_bytes == 0
    assert report.dram_ratio > 1.49  # the split rows' small partial sums are L2 hits
