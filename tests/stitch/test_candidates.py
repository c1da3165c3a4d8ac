"""Any candidate of the candidate space gives right numbers: for every ci-size workload of
the zoo, the stitch flow with a random candidate (not the rules' kernel) for every group runs
on the SIMT runner and matches onnxruntime, and its CUDA compiles for sm_80 and sm_90 without
spills or stack frames (for sm_90 alone when a candidate takes thread-block clusters)."""

from __future__ import annotations

import zlib

import pytest
from stitch_helpers import (
    assert_matches,
    compile_cuda,
    import_onnx,
    module_cuda_source,
    reference,
    run_simt,
    spills,
    stack_frames,
)

from tvm_stitch import pipeline
from tvm_stitch.plan import Choices, StitchPlan
from tvm_stitch.schedule.decisions.choosing import choosing
from tvm_stitch.tuning.space import Sampling
from tvm_stitch.workloads import registry

DEFAULT_MODELS = ("gpt2_block_fp16",)
"""The model block sampled by default (a float16 decoder; the micro workloads have Global
groups); the others are slow (35-70 s each)."""

NAMES = [name if name in DEFAULT_MODELS or name in registry.names("micro")
         else pytest.param(name, marks=pytest.mark.slow) for name in registry.names()]


@pytest.mark.parametrize("name", NAMES)
def test_a_random_candidate_of_every_group_matches_onnxruntime(name: str) -> None:
    wl = registry.get(name)
    model, inputs = wl.model("ci"), wl.inputs("ci")
    sampling = Sampling(seed=zlib.crc32(name.encode()))
    with choosing(sampling):
        scheduled = pipeline.lower(import_onnx(model), "cuda", flow="stitch")
    plan = StitchPlan.of_module(scheduled)
    chosen = [g.choices for g in plan.groups if g.choices != Choices()]
    drawn = [c for c in sampling.drawn.values() if c is not None]
    print(f"{name}: {len(drawn)} candidates drawn, {len(chosen)} groups kept one: "
          + "; ".join(map(str, chosen)))
    if any(g.mapping is not None and g.mapping.rows > 1 for g in plan.groups):
        assert drawn, "no group had a candidate other than the rules' kernel"
    assert_matches(run_simt(model, scheduled, inputs), reference(model, inputs))
    clusters = any(g.cluster > 1 for g in plan.groups)  # built for sm_90 (the target) only
    for arch in ("sm_90",) if clusters else ("sm_80", "sm_90"):
        report = compile_cuda(module_cuda_source(scheduled, arch), arch)
        found = spills(report)
        assert found and all(s == (0, 0) for s in found), (arch, report)
        assert set(stack_frames(report)) == {0}, (arch, report)
