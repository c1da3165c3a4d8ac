"""Whole models at several depths: every layer is stitched like the others, and stitching never
needs more kernels or global bytes than TVM's own fusion. Model files come from the model cache
(exported there on first use, with the ``models`` extra)."""

from __future__ import annotations

import functools
from collections import Counter

import pytest

from tvm_stitch import pipeline
from tvm_stitch.analysis import analyze
from tvm_stitch.frontend.onnx import import_model
from tvm_stitch.plan import StitchPlan
from tvm_stitch.workloads import models, registry

MODELS = registry.names("model")


@functools.cache
def _compiled(name: str, layers: int, flow: str) -> tuple[int, int, Counter]:
    """Kernels, global bytes and the stitched groups' schedules (mapping and launch, no op
    names) of model ``name`` at ci size with ``layers`` layers. Global groups are left out
    of the schedules: remote stitching gives one persistent grid the independent column sums
    of every layer (mlp_backward's bias gradients), so it grows by a layer's ops."""
    scheduled = pipeline.lower(import_model(models.load_model(name, "ci", layers=layers)),
                               "cuda:sm_90", flow)
    report = analyze(scheduled, target="cuda:sm_90")
    plan = StitchPlan.of_module(scheduled) if flow == "stitch" else StitchPlan()
    schedules = Counter((len(g.ops), str(g.mapping), str(g.launch)) for g in plan.groups
                        if not g.phases)
    return len(report.kernels), report.global_bytes, schedules


@pytest.mark.parametrize("name", MODELS)
def test_stitching_needs_no_more_kernels_or_bytes_than_tvm(name: str) -> None:
    depth = models.LAYERS["ci"]
    kernels, global_bytes, _ = _compiled(name, depth, "stitch")
    base_kernels, base_bytes, _ = _compiled(name, depth, "baseline")
    assert kernels <= base_kernels and global_bytes <= base_bytes, (
        f"stitch {kernels} kernels / {global_bytes} B, baseline {base_kernels} / {base_bytes}")


DEPTH_SLOW = ("roberta_block", "t5_block", "llama_block_fp16")
"""Layers built like others' (BERT's, GPT-2's float16 one): their depths run with --runslow."""


@pytest.mark.parametrize("name", [pytest.param(n, marks=pytest.mark.slow) if n in DEPTH_SLOW
                                  else n for n in MODELS])
def test_every_layer_adds_the_same_kernels_and_schedules(name: str) -> None:
    """From the second layer on: with one layer, what the layers share (the attention mask,
    DIEN's behaviour mask) has one consumer and fuses into it; with more, it is computed once
    on its own, in both flows. Swin's layers repeat in pairs (plain, shifted windows)."""
    period = models.spec(name, "ci").period
    (k2, b2, s2), (k3, b3, s3), (k4, b4, s4) = (_compiled(name, n * period, "stitch")
                                                for n in (2, 3, 4))
    assert k4 - k3 == k3 - k2 > 0
    assert b4 - b3 == b3 - b2 > 0
    assert s4 - s3 == s3 - s2 and sum((s3 - s2).values()) > 0
