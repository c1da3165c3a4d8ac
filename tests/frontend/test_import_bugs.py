"""The known bugs of TVM 0.27's import and pipeline that our front end repairs or refuses
(``frontend.repairs.KNOWN_IMPORT_BUGS``): each still happens with TVM alone, so the list
cannot go stale, and each of its ONNX node tests passes through our import, or is refused
with the node named."""

from __future__ import annotations

import pytest
from tvm.relax.frontend.onnx import from_onnx

from tvm_stitch import pipeline
from tvm_stitch.frontend.repairs import KNOWN_IMPORT_BUGS, Repair
from tvm_stitch.simt import SimtModule
from tvm_stitch.target import DEFAULT_TARGET
from tvm_stitch.testing.differential import compare, default_flow
from tvm_stitch.testing.node import case_named, prepare, run_case

CASES = [(key, case) for key, bug in KNOWN_IMPORT_BUGS.items() for case in bug.node_cases]


def _tvm_alone(name: str) -> str:
    """What TVM's importer and default pipeline do with a node test, without our front end:
    "right", or how they fail."""
    model, feeds, expected = prepare(case_named(name))
    try:
        mod = from_onnx(model, keep_params_in_input=False)
        outputs = SimtModule(pipeline.lower(mod, DEFAULT_TARGET, "baseline"))(*feeds.values())
    except Exception as err:  # noqa: BLE001 - any crash of TVM's is what we look for
        return f"crash: {type(err).__name__}: {err}"
    return "right" if compare(outputs, expected).ok else "wrong numbers"


@pytest.mark.parametrize("key", list(KNOWN_IMPORT_BUGS))
def test_the_bug_is_still_in_tvm(key: str) -> None:
    """If this fails, TVM fixed the bug: remove its entry and its repair."""
    bug = KNOWN_IMPORT_BUGS[key]
    seen = _tvm_alone(bug.node_cases[0])
    assert seen != "right", f"{key}: TVM gets {bug.node_cases[0]} right now"
    assert ("crash" in bug.tvm_does) == seen.startswith("crash:"), (bug.tvm_does, seen)


@pytest.mark.parametrize(("key", "name"), CASES, ids=[name for _, name in CASES])
def test_our_import_repairs_or_refuses(key: str, name: str) -> None:
    result = run_case(case_named(name), default_flow())
    if KNOWN_IMPORT_BUGS[key].repair is Repair.REWRITTEN:
        assert result.status == "passed", result.reason
    else:
        assert result.status == "skipped" and result.reason.startswith("front end: ModelError")
        assert "node #0 (Split)" in result.reason and "not supported" in result.reason
