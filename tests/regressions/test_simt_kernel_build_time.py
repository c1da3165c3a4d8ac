"""The SIMT runner builds kernels in seconds, not minutes. PoCL compiles each kernel for its
work-group size at the first launch; optimised, LLVM's loop unroller spent minutes on the
warp-per-row kernel of two LayerNormalizations on (2048, 31) (four tree reductions, 28
barriers), so a model holding it looked like a hang to the fuzzer (scripts/fuzz.py --seed 2026,
graph 87, shrunk: cases/stitch-s2026-g87-hang). No kernel deadlocked: the runner now builds
unoptimised (``simt.kernel.BUILD_OPTIONS``). The worker compiles with an empty PoCL kernel
cache, since a cached build would hide the compile time.
Owner: simt/."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from onnx import helper
from regression_models import model, needs_stitch

from tvm_stitch.target import DEFAULT_TARGET
from tvm_stitch.testing.fuzz import Checker

pytestmark = needs_stitch

BUILD_TIMEOUT = 60.0  # seconds; the model takes a few with a cold cache, over 180 before


def test_two_layer_norms_build_without_a_warm_kernel_cache(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("POCL_CACHE_DIR", str(tmp_path))
    scale = np.linspace(0.5, 1.5, 31).astype(np.float32)
    nodes = [helper.make_node("LayerNormalization", ["x", "scale"], ["y"], axis=1),
             helper.make_node("Neg", ["x"], ["n"]),
             helper.make_node("LayerNormalization", ["n", "scale"], ["z"], axis=1)]
    built = model(nodes, {"x": [2048, 31]}, {"y": [2048, 31], "z": [2048, 31]},
                  {"scale": scale})
    checker = Checker("stitch", DEFAULT_TARGET, resources=False, timeout=BUILD_TIMEOUT,
                      triage=False)
    try:
        outcome = checker(built)
    finally:
        checker.close()
    assert outcome["kind"] == "ok", outcome["error"]
