"""Identical layers are decided once: within one stitch pass, a fused function and group
decided before (a model's later layers, the pass's later rounds) get the first's decisions
without deciding again (``schedule.decisions.memo``), and the compiled module is the one
deciding every group anew gives."""

from __future__ import annotations

import contextlib

import pytest

from tvm_stitch import pipeline
from tvm_stitch.frontend.onnx import import_model
from tvm_stitch.plan import StitchPlan
from tvm_stitch.schedule import decisions
from tvm_stitch.transform import stitch_fuse
from tvm_stitch.workloads.graph import GraphBuilder


def _layers(count: int) -> object:
    """``count`` layers of LayerNorm, a projection, a softmax and a residual add."""
    g = GraphBuilder("layers")
    x = g.input("x", (64, 128))
    for i in range(count):
        normed = g.op("LayerNormalization", x, g.weight(f"gamma{i}", (128,)),
                      g.weight(f"beta{i}", (128,)), axis=-1)
        scores = g.op("MatMul", normed, g.weight(f"w{i}", (128, 128), std=0.1))
        x = g.op("Add", x, g.op("Softmax", scores, axis=-1))
    return g.model([x])


def _compile(count: int, monkeypatch: pytest.MonkeyPatch) -> tuple[str, StitchPlan, int]:
    """The scheduled module's script, its plan, and how many groups were really decided."""
    decided = []
    real = decisions._decide_vectors

    def counting(*args, **kwargs):
        decided.append(args[1].ops)
        return real(*args, **kwargs)

    monkeypatch.setattr(decisions, "_decide_vectors", counting)
    scheduled = pipeline.lower(import_model(_layers(count)), "cuda:sm_90", "stitch")
    return scheduled.script(), StitchPlan.of_module(scheduled), len(decided)


def test_later_layers_are_not_decided_again(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each softmax and residual add joins the next layer's LayerNorm: LN, then (softmax,
    add, LN) per later layer, then (softmax, add); two layers more add two such groups and
    nothing to decide."""
    _, plan, decided = _compile(3, monkeypatch)
    _, deeper, deeper_decided = _compile(5, monkeypatch)
    assert len(plan.groups) == 4 and len(deeper.groups) == 6
    assert deeper_decided == decided <= 3


def test_remembered_decisions_compile_what_deciding_anew_does(
        monkeypatch: pytest.MonkeyPatch) -> None:
    script, plan, decided = _compile(3, monkeypatch)
    monkeypatch.setattr(stitch_fuse, "remembering", contextlib.nullcontext)
    anew_script, anew_plan, anew = _compile(3, monkeypatch)
    assert anew > decided
    assert plan == anew_plan and script == anew_script
