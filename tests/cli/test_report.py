"""tvm-stitch report: the node -> kernel mapping, measured times, and the page itself loaded
in a real headless browser (Debian's chromium; scripts/ensure_chromium.sh installs it, and
CI=true fails here without it rather than skip)."""

from __future__ import annotations

import json
import os
import shutil
import struct
import subprocess
import zlib
from pathlib import Path

import onnx
import pytest

from tvm_stitch import cli, workloads
from tvm_stitch.inspect_model import inspect_onnx
from tvm_stitch.report import NodePlace, load_measured, map_nodes, write_report

RESULTS = Path(__file__).resolve().parents[2] / "docs" / "results" / "gpu-2026-11-29-h200.json"
BROWSER_S = 60


@pytest.fixture(scope="module")
def bert() -> onnx.ModelProto:
    """The zoo's BERT layer at ci size, tagged with its workload name and size."""
    return workloads.get("bert_layer").model("ci")


@pytest.fixture(scope="module")
def ci_results(tmp_path_factory) -> Path:
    """A results JSON in gpu_check.py's format with an entry for bert_layer at ci size."""
    doc = json.loads(RESULTS.read_text())
    entry = next(w for w in doc["workloads"] if w["name"] == "bert_layer")
    doc["workloads"] = [{**entry, "size": "ci"}]
    path = tmp_path_factory.mktemp("results") / "results.json"
    path.write_text(json.dumps(doc))
    return path


@pytest.fixture(scope="module")
def page(bert, ci_results, tmp_path_factory) -> Path:
    """The report of the BERT layer, with measured times."""
    out = tmp_path_factory.mktemp("report") / "report.html"
    return write_report(bert, out, measured=ci_results)


def test_every_bert_node_maps_to_the_plan_entry_of_its_bindings(bert) -> None:
    (stitch,) = inspect_onnx(bert, flows=("stitch",)).flows
    mapping = map_nodes(bert, stitch.plan)
    assert len(mapping.nodes) == len(bert.graph.node) and mapping.mapped_fraction == 1.0
    assert mapping.unmatched_ops == ()  # every op of the plan is some node's binding
    by_type: dict[str, set[NodePlace]] = {}
    for node in mapping.nodes:
        by_type.setdefault(node.op_type, set()).add(node.place)
        if node.main is not None:
            ops = {op.split(":")[0] for op in _entry_ops(stitch.plan, node.main)}
            assert ops & set(node.bindings)  # the entry holds one of the node's bindings
    assert by_type["Softmax"] == by_type["LayerNormalization"] == {NodePlace.STITCHED}
    assert by_type["MatMul"] == {NodePlace.COMPUTE}
    # the attention mask's cast and gather make one kernel, cut from the And and Where
    # that broadcast its result over the query rows
    (cast,) = [n for n in mapping.nodes if n.op_type == "Cast"]
    (gather,) = [n for n in mapping.nodes if n.op_type == "GatherND"]
    (where,) = [n for n in mapping.nodes if n.op_type == "Where"]
    assert cast.place is gather.place is where.place is NodePlace.STITCHED
    assert cast.main.index == gather.main.index != where.main.index


def test_a_node_left_to_tvm_maps_to_its_fallback() -> None:
    graph = onnx.helper.make_graph(
        [onnx.helper.make_node("Neg", ["x"], ["y"])], "g",
        [onnx.helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [4, 8])],
        [onnx.helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [4, 8])])
    model = onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", 18)])
    (stitch,) = inspect_onnx(model, flows=("stitch",)).flows
    (node,) = map_nodes(model, stitch.plan).nodes
    assert node.place is NodePlace.FALLBACK
    assert node.main.reason == stitch.plan.fallbacks[0].reason == \
        "a single injective op: nothing to stitch"


def _entry_ops(plan, place) -> tuple[str, ...]:
    if place.kind is NodePlace.STITCHED:
        return plan.group(place.index).ops
    if place.kind is NodePlace.FALLBACK:
        return plan.fallbacks[place.index].ops
    comp = plan.compute[place.index]
    return (comp.op, *comp.epilogue, *comp.absorbed)


def test_measured_times_are_found_by_workload_and_size(ci_results) -> None:
    real = load_measured(RESULTS, "bert_layer", "real")
    assert set(real.times_us) >= {"stitch", "baseline"} and not real.missing
    other_size = load_measured(RESULTS, "bert_layer", "ci")
    assert other_size.times_us == {} and "at size 'real', not at 'ci'" in other_size.missing
    assert "no entry" in load_measured(ci_results, "softmax", None).missing


def test_cli_writes_the_page_and_refuses_a_foreign_results_file(bert, tmp_path,
                                                                capsys) -> None:
    model = tmp_path / "bert_layer.onnx"
    onnx.save(bert, model)
    bad = tmp_path / "bad.json"
    bad.write_text("[1, 2]")
    assert cli.main(["report", str(model), "-o", str(tmp_path / "r.html"),
                     "--measured", str(bad)]) == 2
    assert "not a results JSON" in capsys.readouterr().err
    assert not (tmp_path / "r.html").exists()


def test_demo_writes_the_report_and_prints_its_path(tmp_path, capsys) -> None:
    out = tmp_path / "report.html"
    assert cli.main(["demo", "--workload", "softmax", "--report", str(out)]) == 0
    assert f"report written to {out.resolve()}" in capsys.readouterr().out
    assert 'id="graph"' in out.read_text()


def _chromium() -> str:
    found = shutil.which("chromium") or shutil.which("chromium-browser")
    if found is None:
        why = "needs Debian's chromium (scripts/ensure_chromium.sh installs it)"
        if os.environ.get("CI") == "true":
            pytest.fail(f"{why}; CI=true: CI must have it", pytrace=False)
        pytest.skip(why)
    return found


def _headless(browser: str, profile: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([browser, "--headless", "--no-sandbox", "--disable-gpu",
                           f"--user-data-dir={profile}", "--virtual-time-budget=5000", *args],
                          capture_output=True, text=True, timeout=BROWSER_S, check=True)


def test_page_loads_offline_in_a_headless_browser(page, tmp_path) -> None:
    browser = _chromium()
    assert "<script src" not in page.read_text()  # every script inline: nothing fetched
    dom = _headless(browser, tmp_path / "profile", "--dump-dom", page.as_uri()).stdout
    assert '<pre id="page-errors"></pre>' in dom  # no script error, no console.error
    assert dom.count('class="node"') == 79
    for chart in ("kernel-chart", "roofline", "measured-chart"):  # plotly drew each one
        start = dom.index(f'id="{chart}"')
        assert "main-svg" in dom[start:start + 4000], chart
    assert 'id="summary"' in dom and 'id="estimated-speedup"' in dom
    assert 'id="measured-speedup"' in dom and "no per-kernel times" in dom
    shot = tmp_path / "shot.png"
    _headless(browser, tmp_path / "profile", "--window-size=1200,900",
              f"--screenshot={shot}", page.as_uri())
    assert len(set(_png_bytes(shot.read_bytes()))) > 32  # not one colour


def _png_bytes(png: bytes) -> bytes:
    """The decompressed (still filtered) scanlines of a PNG file."""
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    pos, data = 8, b""
    while pos < len(png):
        (length,) = struct.unpack(">I", png[pos:pos + 4])
        kind = png[pos + 4:pos + 8]
        if kind == b"IDAT":
            data += png[pos + 8:pos + 8 + length]
        pos += 12 + length
    return zlib.decompress(data)
