"""Model workloads: the cache, the missing-extra error, and exports run in onnxruntime."""

from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from tvm_stitch import workloads
from tvm_stitch.workloads import models
from tvm_stitch.workloads.inputs import set_metadata

EXTRA = ("torch", "transformers", "onnxscript")
MISSING = [name for name in EXTRA if importlib.util.find_spec(name) is None]
needs_extra = pytest.mark.skipif(
    bool(MISSING), reason=f"models extra not installed (missing {', '.join(MISSING)})"
)


def _run(model: onnx.ModelProto, seed: int = 0) -> list[np.ndarray]:
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, workloads.inputs(model, seed))


def test_cache_location_follows_the_environment(cache: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    assert workloads.cached_path("bert_layer", "ci") == cache / "bert_layer-ci.onnx"
    monkeypatch.delenv(models.CACHE_ENV)
    assert workloads.cache_dir() == Path.home() / ".cache" / "tvm-stitch" / "models"


def test_missing_extra_says_how_to_install(cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "torch", None)  # makes `import torch` raise ImportError
    with pytest.raises(workloads.ModelsExtraMissing, match=r"pip install 'tvm-stitch\[models\]'"):
        workloads.get("dien_block").model("ci")
    assert not list(cache.iterdir())


def test_stale_cache_file_is_re_exported(cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    stale = onnx.helper.make_model(onnx.helper.make_graph([], "old", [], []))
    set_metadata(stale, models.EXPORT_KEY, "not-the-fingerprint")
    onnx.save(stale, workloads.cached_path("t5_block", "ci"))
    calls = []

    def fake_export(name: str, size: str, path: Path | None = None,
                    layers: int | None = None, dynamic: bool = False) -> onnx.ModelProto:
        calls.append((name, size, path))
        fresh = onnx.helper.make_model(onnx.helper.make_graph([], "new", [], []))
        set_metadata(fresh, models.EXPORT_KEY, models.spec(name, size).fingerprint())
        return fresh

    monkeypatch.setattr(models, "export_model", fake_export)
    assert workloads.get("t5_block").model("ci").graph.name == "new"
    assert calls == [("t5_block", "ci", cache / "t5_block-ci.onnx")]


def test_specs_differ_by_size_and_fingerprints_are_stable() -> None:
    for name in workloads.names("model"):
        ci, real = models.spec(name, "ci"), models.spec(name, "real")
        assert ci.fingerprint() == models.spec(name, "ci").fingerprint()
        assert ci.fingerprint() != real.fingerprint()
        assert ci.summary != real.summary


@needs_extra
def test_bert_layer_ci_exports_into_the_cache_and_runs(cache: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    model = workloads.get("bert_layer").model("ci")
    path = cache / "bert_layer-ci.onnx"
    assert path.is_file()
    assert [(i.name, i.type.tensor_type.elem_type) for i in model.graph.input] == [
        ("input_ids", onnx.TensorProto.INT64), ("attention_mask", onnx.TensorProto.INT64)]
    feeds = workloads.inputs(model)
    assert feeds["input_ids"].max() < 100 and set(np.unique(feeds["attention_mask"])) == {0, 1}
    (hidden,) = _run(model)
    assert hidden.shape == (2, 32, 64) and np.isfinite(hidden).all()
    # The block ends in a LayerNorm initialised to gamma=1, beta=0: every token is normalised.
    np.testing.assert_allclose(hidden.mean(-1), 0.0, atol=1e-4)
    np.testing.assert_allclose(hidden.std(-1), 1.0, atol=1e-2)

    def no_export(*args: object) -> None:
        raise AssertionError("a current cache file must not be re-exported")

    monkeypatch.setattr(models, "export_model", no_export)
    cached = workloads.get("bert_layer").model("ci")
    assert cached.SerializeToString() == model.SerializeToString()
    monkeypatch.undo()
    # Deterministic: a fresh export gives the same bytes as the cached file.
    again = models.export_model("bert_layer", "ci")
    assert again.SerializeToString() == onnx.load(path).SerializeToString()


@pytest.mark.slow
@needs_extra
@pytest.mark.parametrize("name", workloads.names("model"))
def test_model_ci_export_matches_torch(name: str, shared_cache: Path) -> None:
    """Every ci model exports, runs in onnxruntime and agrees with the torch module."""
    import torch

    from tvm_stitch.workloads import torch_modules

    model = workloads.get(name).model("ci")
    onnx.checker.check_model(model)
    spec = models.spec(name, "ci")
    assert [(i.name, tuple(d.dim_value for d in i.type.tensor_type.shape.dim))
            for i in model.graph.input] == [(t.name, t.shape) for t in spec.inputs]
    batch = int(re.search(r"batch (\d+)", spec.summary).group(1))
    assert spec.inputs[0].shape[0] == batch and f"{spec.layers} layers" in spec.summary
    got = _run(model, seed=3)
    torch.manual_seed(models.SEED)
    module = torch_modules.build(spec.arch, spec.config).eval()
    with torch.no_grad():
        want = module(*(torch.from_numpy(a) for a in workloads.inputs(model, 3).values()))
    want = list(want) if isinstance(want, tuple) else [want]
    assert len(got) == len(want)
    for g, w in zip(got, want, strict=True):
        tol = 1e-2 if g.dtype == np.float16 else 1e-4
        assert np.isfinite(g).all()
        np.testing.assert_allclose(g, w.numpy(), rtol=tol, atol=tol)


def test_dynamic_exports_have_their_own_fingerprint_and_file() -> None:
    static, dynamic = models.spec("bert_layer", "ci"), models.spec("bert_layer", "ci",
                                                                  dynamic=True)
    assert dynamic.dynamic and "dynamic batch and seq" in dynamic.summary
    assert static.fingerprint() != dynamic.fingerprint()
    assert workloads.cached_path("bert_layer", "ci", dynamic=True).name == \
        "bert_layer-ci-dynamic.onnx"
    assert [t.axes for t in dynamic.inputs] == [("batch", "seq")] * 2
