"""A reduction across a block's threads leaves its result in a shared slot that TVM's CUDA code
reads ``volatile``: every element of a LayerNorm's output loaded its three sums six times and
took a reciprocal square root, every element of a softmax a logarithm. And ptxas held those
loads of an unrolled loop in registers: LogSoftmax -> Erf -> LogSoftmax over (2048, 4096)
(fuzz graph 9420:11) spilled 8 B at the 48 registers of its launch bound on sm_90. Each reader
now copies a result into a register once per row. Owner: schedule/results.py."""

from __future__ import annotations

import re

import numpy as np
import onnx
import pytest
import tvm
from onnx import helper
from regression_models import model, needs_stitch
from tvm import tirx

from tvm_stitch import verify
from tvm_stitch.lowering import lower
from tvm_stitch.target import cuda_target
from tvm_stitch.testing.differential import check_model
from tvm_stitch.testing.resources import check_resources
from tvm_stitch.workloads import micro

pytestmark = needs_stitch

VOLATILE_READ = re.compile(r"\(\(volatile \w+\*\)(\w+)\)\[[^]]*\]")
"""A read or write of a volatile shared slot in TVM's CUDA source."""

COPY = re.compile(r"^\s*\w+\[[^]=]*\] = \(\(volatile \w+\*\)\w+\)\[[^]]*\];$")
"""A statement that copies such a slot (into a register, or out to global memory), and does
nothing else."""


def _cuda_lines(scheduled: tvm.IRModule) -> list[str]:
    return [line for gv, func in scheduled.functions_items() if isinstance(func, tirx.PrimFunc)
            for line in lower(func, gv.name_hint, cuda_target("sm_90")).source().splitlines()]


def _erf_between_log_softmaxes(rows: int) -> onnx.ModelProto:
    nodes = [helper.make_node("LogSoftmax", ["x"], ["a"], axis=-1),
             helper.make_node("Erf", ["a"], ["b"]),
             helper.make_node("LogSoftmax", ["b"], ["y"], axis=1)]
    return model(nodes, {"x": [rows, 4096]}, {"y": [rows, 4096]})


CASES = {
    "layer_norm": lambda: micro.layer_norm((512, 1024)),
    "layer_norm_split_rows": lambda: micro.layer_norm((64, 4096)),  # a persistent grid
    "softmax": lambda: micro.softmax((512, 1024)),
    "rms_norm": lambda: micro.rms_norm((512, 1024)),
    "erf_between_log_softmaxes": lambda: _erf_between_log_softmaxes(512),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_every_result_is_read_once_per_row_into_a_register(name: str) -> None:
    built = CASES[name]()
    lines = _cuda_lines(verify.compile_model(built, "stitch"))
    reads = [line for line in lines if VOLATILE_READ.search(line)
             and not line.strip().startswith(("if", "((volatile"))]
    assert reads, "no reduction across threads: the case no longer tests anything"
    assert all(COPY.match(line) for line in reads), "\n".join(
        line for line in reads if not COPY.match(line))
    outcome = check_model(built, "stitch", resources=False, triage=False)
    assert outcome.kind == "ok", outcome.error


def test_log_softmax_of_erf_does_not_spill() -> None:
    report = check_resources(verify.compile_model(_erf_between_log_softmaxes(2048), "stitch"))
    assert not report.violations, report.violations
    assert all(k.spill_bytes == 0 and k.stack_bytes == 0 for k in report.kernels)


def test_layer_norm_matches_with_rows_packed() -> None:
    # rows of 256 packed several to a block: the copies are made per row of the thread
    x = np.random.default_rng(1).standard_normal((96, 256)).astype(np.float32)
    built = micro.layer_norm((96, 256))
    outcome = check_model(built, "stitch", resources=True, triage=False,
                          feeds={built.graph.input[0].name: x})
    assert outcome.kind == "ok", outcome.error
