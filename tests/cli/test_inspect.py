"""tvm-stitch inspect: the plan, the per-kernel table of each flow, fallbacks with their
reasons, and the totals side by side, counted as tvm_stitch.analysis counts."""

from __future__ import annotations

import json
from pathlib import Path

import onnx
import pytest

from tvm_stitch import analysis, cli, pipeline
from tvm_stitch.frontend.onnx import ModelError, import_model
from tvm_stitch.inspect_model import KernelKind, inspect_onnx
from tvm_stitch.workloads.graph import GraphBuilder


@pytest.fixture(scope="module")
def matmul_softmax(tmp_path_factory) -> str:
    """A matmul with a bias (TVM's path) feeding a softmax (stitched)."""
    g = GraphBuilder("matmul_softmax")
    x = g.input("x", [64, 32])
    logits = g.op("Add", g.op("MatMul", x, g.weight("w", [32, 128])), g.weight("b", [128]))
    path = tmp_path_factory.mktemp("models") / "matmul_softmax.onnx"
    onnx.save(g.model([g.op("Softmax", logits, axis=-1)]), path)
    return str(path)


@pytest.fixture(scope="module")
def symbolic_softmax(tmp_path_factory) -> str:
    """A softmax over the first axis, of symbolic length ``n``: a column reduction over a
    symbolic length whose four column sums a block of 32 threads would sum in place over a
    wave of row tiles, which falls back to TVM's fusion."""
    g = GraphBuilder("symbolic_softmax")
    x = g.input("x", ["n", 4])
    path = tmp_path_factory.mktemp("models") / "symbolic_softmax.onnx"
    onnx.save(g.model([g.op("Softmax", g.op("Exp", x), axis=0)]), path)
    return str(path)


def test_kernels_of_both_flows_are_told_apart_and_counted(matmul_softmax) -> None:
    inspection = inspect_onnx(matmul_softmax)
    stitch, baseline = inspection.flows
    assert (stitch.flow, baseline.flow) == ("stitch", "baseline")
    assert inspection.gpu.name == "H200"
    assert [k.kind for k in stitch.kernels] == [KernelKind.COMPUTE, KernelKind.STITCHED]
    assert [k.kind for k in baseline.kernels] == [KernelKind.COMPUTE, KernelKind.FUSED]
    (group,) = stitch.plan.groups
    assert stitch.kernels[1].group == group.id and stitch.kernels[1].func == group.function
    assert baseline.plan is None and all(k.group is None for k in baseline.kernels)
    counted = analysis.analyze(pipeline.lower(import_model(matmul_softmax), "cuda:sm_90",
                                              "stitch"))
    for row, kernel in zip(stitch.kernels, counted.kernels, strict=True):
        assert row.accessed_bytes == kernel.traffic.global_bytes
        assert row.dram_bytes == kernel.traffic.dram_bytes
        assert row.estimated_us == kernel.roofline_us()["H200"]
        assert row.threads == kernel.threads_per_block and row.grid == kernel.grid
    totals = stitch.totals()
    assert totals["kernels"] == 2 and totals["stitched_kernels"] == 1
    assert totals["accessed_bytes"] == counted.global_bytes
    assert totals["compulsory_bytes"] == baseline.totals()["compulsory_bytes"]
    assert totals["accessed_bytes"] < baseline.totals()["accessed_bytes"]


def test_the_text_report_has_the_plan_the_tables_and_the_totals(matmul_softmax,
                                                                capsys) -> None:
    assert cli.main(["inspect", matmul_softmax]) == 0
    out = capsys.readouterr().out
    assert out.startswith("matmul_softmax.onnx for sm_90: estimates for the H200")
    assert out.index("== stitch ==") < out.index("== baseline ==") < out.index("== totals ==")
    assert "StitchPlan: 1 stitched group(s)" in out
    assert "no stitch plan: TVM's fusion" in out
    header = "#  kernel                   kind        grid  threads  accessed     DRAM  H200 us"
    assert header in out
    assert "stitch0_softmax_kernel   stitched 0" in out and "compute" in out
    totals = out[out.index("== totals =="):].splitlines()
    assert totals[1].split() == ["stitch", "baseline"]
    assert totals[2].split() == ["kernels", "2", "2"]
    assert any(line.startswith("estimated H200 us") for line in totals)


def test_json_and_a_single_flow(matmul_softmax, capsys) -> None:
    assert cli.main(["inspect", matmul_softmax, "--pipeline", "baseline", "--json",
                     "--target", '{"kind": "cuda", "arch": "sm_80"}']) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["gpu"] == "A100" and data["target"]["arch"] == "sm_80"
    assert list(data["flows"]) == ["baseline"]
    flow = data["flows"]["baseline"]
    assert flow["plan"] is None and flow["fallbacks"] == []
    assert [k["kind"] for k in flow["kernels"]] == ["compute", "fused"]
    assert set(flow["totals"]["estimated_us"]) == {"H200", "A100", "V100"}
    assert {"name", "grid", "block", "threads", "accessed_bytes", "dram_bytes",
            "estimated_us"} <= set(flow["kernels"][0])


def test_fallbacks_show_their_reasons_at_the_sizes_given(symbolic_softmax, capsys) -> None:
    assert cli.main(["inspect", symbolic_softmax, "--dim", "n=1000", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["dims"] == {"n": 1000}
    stitch = data["flows"]["stitch"]
    reasons = {op: f["reason"] for f in stitch["fallbacks"] for op in f["ops"]}
    assert "symbolic row count" in reasons["gv:softmax"]
    assert all(k["kind"] == "fused" for k in stitch["kernels"])
    assert stitch["totals"]["compulsory_bytes"] == 2 * 4 * 1000 * 4, "x in, y out, at n=1000"
    assert cli.main(["inspect", symbolic_softmax, "--dim", "n=1000",
                     "--pipeline", "stitch"]) == 0
    out = capsys.readouterr().out
    assert "counted at n=1000" in out and "fallbacks: 1, left to TVM's fusion" in out
    assert "gv:softmax: symbolic row count" in out


def test_a_symbolic_dimension_needs_a_size_and_refusals_exit_2(symbolic_softmax, tmp_path,
                                                               capsys) -> None:
    with pytest.raises(ModelError, match="n need a size"):
        inspect_onnx(symbolic_softmax)
    assert cli.main(["inspect", symbolic_softmax]) == 2
    assert "--dim NAME=SIZE" in capsys.readouterr().err
    assert cli.main(["inspect", symbolic_softmax, "--dim", "n=8", "--dim", "m=2"]) == 2
    assert "no input has a symbolic dimension named 'm'" in capsys.readouterr().err
    assert cli.main(["inspect", symbolic_softmax, "--dim", "n=8", "--target",
                     "cuda:sm_86"]) == 2
    assert "no GPU of architecture 'sm_86'" in capsys.readouterr().err
    missing = Path(tmp_path) / "missing.onnx"
    assert cli.main(["inspect", str(missing)]) == 2
    assert "missing.onnx" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        cli.main(["inspect", symbolic_softmax, "--target", "cuda -arch=sm_90"])
    assert "old string form" in capsys.readouterr().err
