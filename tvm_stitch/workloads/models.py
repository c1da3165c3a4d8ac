"""Real-architecture models exported to ONNX from torch, cached on disk.

Each is a stack of identical layers (``LAYERS``: 2 at ``ci``, 4 at ``real``), as users compile
them: identical layers must be stitched alike, and a depth knob (``spec(..., layers=N)``)
exports the same model at any depth.

``transformers`` models are built from config objects with seeded random weights (nothing is
downloaded). Files live outside git in ``$TVM_STITCH_MODEL_CACHE`` (default
``~/.cache/tvm-stitch/models``) as ``<name>-<size>.onnx``; a missing or stale file is exported on
first use when the ``models`` extra (torch, transformers, onnxscript) is installed.
"""

from __future__ import annotations

import hashlib
import io
import json
import logging
import os
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field, replace
from functools import partial
from importlib import metadata
from pathlib import Path
from typing import Any

import numpy as np
import onnx

from .inputs import Dist, get_metadata, integers, normal, prefix, set_input_dists, set_metadata
from .registry import SIZE_KEY, WORKLOAD_KEY, Workload, register

SEED = 0
# Bump when export settings change in a way the spec does not show, to re-export cached files.
SCHEMA = 1
LAYERS = {"ci": 2, "real": 4}
"""Layers of each model workload at each size."""
LAYER_KEYS = {"bert": "num_hidden_layers", "roberta": "num_hidden_layers", "gpt2": "n_layer",
              "llama": "num_hidden_layers",
              "t5": "num_layers", "dien": "layers", "mlp_backward": "layers",
              "swin": "depths", "convnext": "depths"}
"""The config entry that sets the depth of each architecture (for the vision models, the
depths of their one stage)."""
LAYER_PERIOD = {"swin": 2}
"""Architectures whose layers repeat in a cycle: Swin alternates plain and shifted windows."""
CACHE_ENV = "TVM_STITCH_MODEL_CACHE"
EXPORT_KEY = "tvm_stitch.export"
INSTALL_HINT = (
    "install the 'models' extra: pip install 'tvm-stitch[models]' "
    "(that is: pip install torch==2.13.0 transformers onnxscript)"
)


STATIC_ONLY = {
    "swin": "its window shapes fold to constants only with static inputs",
    "t5": "with a run-time sequence its relative-position buckets are computed at run time, "
          "int(log(distance / 8) / log(16) * 8), which is exactly 2 at distance 16: a log one "
          "unit in the last place low (OpenCL allows 3, PoCL's log(2) is one low; CUDA's "
          "fast-math log more) truncates to bucket 9, so both flows differ from onnxruntime "
          "above 16 tokens (0.078 at 32); the static export folds the buckets into constants",
}
"""Architectures exported with static shapes only, and why."""

TOKENS = ("batch", "seq")
"""The dynamic axes of a batch of sequences."""


class ModelsExtraMissing(ImportError):
    """Raised when a model must be exported but torch, transformers or onnxscript is missing."""


@dataclass(frozen=True)
class TensorSpec:
    """One graph input of an exported model."""

    name: str
    shape: tuple[int, ...]
    dtype: str
    dist: Dist = field(default_factory=normal)
    axes: tuple[str, ...] = ()  # the name of each dynamic axis, "" for a static one


@dataclass(frozen=True)
class ExportSpec:
    """Everything that determines an exported file: architecture, config, inputs, exporter."""

    arch: str
    config: dict[str, Any]
    inputs: tuple[TensorSpec, ...]
    output: str
    summary: str
    dynamo: bool = True
    opset: int = 18
    fold: bool = False  # fold shape computations with onnxruntime's basic graph optimizer
    dynamic: bool = False  # export the inputs' named axes (TensorSpec.axes) dynamic

    @property
    def layers(self) -> int:
        """How many identical layers the model stacks."""
        depth = self.config[LAYER_KEYS[self.arch]]
        return int(depth[0] if isinstance(depth, list | tuple) else depth)

    @property
    def period(self) -> int:
        """How many layers make one repeating unit (1: every layer is alike)."""
        return LAYER_PERIOD.get(self.arch, 1)

    def deepened(self, layers: int) -> ExportSpec:
        """The same model with ``layers`` layers."""
        key = LAYER_KEYS[self.arch]
        depth = [layers] if isinstance(self.config[key], list | tuple) else layers
        config = {**self.config, key: depth}
        summary = self.summary.replace(f"{self.layers} layers, ", f"{layers} layers, ")
        return replace(self, config=config, summary=summary)

    def with_dynamic_axes(self) -> ExportSpec:
        """The same model exported with its batch and sequence axes dynamic (torch's
        ``dynamic_shapes``, ONNX dim_params); ValueError for a model whose export needs
        static shapes."""
        if self.arch in STATIC_ONLY:
            raise ValueError(f"{self.arch} exports with static shapes only: "
                             f"{STATIC_ONLY[self.arch]}")
        return replace(self, dynamic=True, summary=f"{self.summary}, dynamic "
                       + " and ".join(dict.fromkeys(a for t in self.inputs for a in t.axes
                                                    if a)))

    @property
    def example_dims(self) -> dict[str, int]:
        """The size of each named axis in the example inputs the model is exported with."""
        return {a: d for t in self.inputs for a, d in zip(t.axes, t.shape, strict=False) if a}

    def fingerprint(self) -> str:
        """A hash of the spec, the seed and SCHEMA, stored in the file to detect stale caches."""
        fields = asdict(self)
        if not self.dynamic:  # static exports keep the fingerprints they had before axes
            del fields["dynamic"]
            for t in fields["inputs"]:
                del t["axes"]
        data = json.dumps([SCHEMA, SEED, fields], sort_keys=True, default=str)
        return hashlib.sha256(data.encode()).hexdigest()[:16]


def _token_inputs(batch: int, seq: int, vocab: int, mask: bool = False) -> tuple[TensorSpec, ...]:
    ids = TensorSpec("input_ids", (batch, seq), "int64", integers(0, vocab), TOKENS)
    if not mask:
        return (ids,)
    return ids, TensorSpec("attention_mask", (batch, seq), "int64", prefix(0, 1), TOKENS)


def _transformer(arch: str, config: dict[str, Any], batch: int, seq: int, *, hidden: int,
                 heads: int, ffn: int, vocab: int, mask: bool = False, dynamo: bool = True,
                 opset: int = 18) -> ExportSpec:
    """The spec of a transformers model fed token ids of batch x seq."""
    layers = config[LAYER_KEYS[arch]]
    summary = (f"{layers} layers, batch {batch} x seq {seq}, hidden {hidden}, {heads} heads, "
               f"ffn {ffn}, vocab {vocab}")
    return ExportSpec(arch, config, _token_inputs(batch, seq, vocab, mask), "last_hidden_state",
                      summary, dynamo, opset)


def _half(spec: ExportSpec) -> ExportSpec:
    """``spec`` with float16 weights (and so float16 activations and output)."""
    return replace(spec, config={**spec.config, "dtype": "float16"},
                   summary=f"{spec.summary}, float16")


def _vision(arch: str, layers: int, batch: int, image: int, patch: int, width: int,
            heads: int = 0, window: int = 0) -> ExportSpec:
    """A one-stage transformers vision model fed batch x 3 x image x image."""
    config: dict[str, Any] = dict(image_size=image, patch_size=patch, num_channels=3,
                                  depths=[layers])
    tokens = image // patch
    summary = (f"{layers} layers, batch {batch} x {image}x{image} images, {tokens}x{tokens} "
               f"tokens of {width}")
    if arch == "swin":
        config.update(embed_dim=width, num_heads=[heads], window_size=window)
        summary += f", {heads} heads, window {window}"
    else:
        config.update(hidden_sizes=[width], num_stages=1)
    inputs = (TensorSpec("pixel_values", (batch, 3, image, image), "float32",
                         axes=("batch", "", "", "")),)
    # Swin exports with the legacy exporter only; its shape computations are then folded.
    return ExportSpec(arch, config, inputs, "last_hidden_state", summary,
                      dynamo=arch != "swin", opset=18 if arch != "swin" else 17,
                      fold=arch == "swin")


def _mlp_backward(layers: int, batch: int, seq: int, hidden: int, ffn: int) -> ExportSpec:
    inputs = (TensorSpec("x", (batch, seq, hidden), "float32", axes=("batch", "seq", "")),
              TensorSpec("dy", (batch, seq, hidden), "float32", axes=("batch", "seq", "")))
    summary = f"{layers} layers, batch {batch} x seq {seq}, hidden {hidden}, ffn {ffn}"
    return ExportSpec("mlp_backward", dict(hidden=hidden, ffn=ffn, layers=layers), inputs,
                      "dx", summary)


def _bert(layers: int, batch: int, seq: int, hidden: int, heads: int, ffn: int, vocab: int,
          positions: int) -> ExportSpec:
    config = dict(vocab_size=vocab, hidden_size=hidden, num_attention_heads=heads,
                  intermediate_size=ffn, max_position_embeddings=positions,
                  num_hidden_layers=layers, attn_implementation="eager")
    return _transformer("bert", config, batch, seq, hidden=hidden, heads=heads, ffn=ffn,
                        vocab=vocab, mask=True)


def _roberta(layers: int, batch: int, seq: int, hidden: int, heads: int, ffn: int,
             vocab: int) -> ExportSpec:
    # Position ids count the non-padding tokens (a CumSum of the mask), from pad + 1.
    config = dict(vocab_size=vocab, hidden_size=hidden, num_attention_heads=heads,
                  intermediate_size=ffn, max_position_embeddings=seq + 2, pad_token_id=1,
                  num_hidden_layers=layers, attn_implementation="eager")
    return _transformer("roberta", config, batch, seq, hidden=hidden, heads=heads, ffn=ffn,
                        vocab=vocab, mask=True)


def _gpt2(layers: int, batch: int, seq: int, hidden: int, heads: int, vocab: int,
          positions: int) -> ExportSpec:
    config = dict(vocab_size=vocab, n_embd=hidden, n_head=heads, n_positions=positions,
                  n_layer=layers, bos_token_id=vocab - 1, eos_token_id=vocab - 1,
                  attn_implementation="eager")
    return _transformer("gpt2", config, batch, seq, hidden=hidden, heads=heads, ffn=4 * hidden,
                        vocab=vocab)


def _llama(layers: int, batch: int, seq: int, hidden: int, heads: int, kv_heads: int,
           ffn: int, vocab: int, positions: int) -> ExportSpec:
    config = dict(vocab_size=vocab, hidden_size=hidden, num_attention_heads=heads,
                  num_key_value_heads=kv_heads, intermediate_size=ffn,
                  max_position_embeddings=positions, num_hidden_layers=layers,
                  attn_implementation="eager")
    spec = _transformer("llama", config, batch, seq, hidden=hidden, heads=heads, ffn=ffn,
                        vocab=vocab)
    return replace(spec, summary=f"{spec.summary}, {kv_heads} kv head{'s' * (kv_heads > 1)}")


def _t5(layers: int, batch: int, seq: int, hidden: int, heads: int, head_dim: int, ffn: int,
        vocab: int) -> ExportSpec:
    config = dict(vocab_size=vocab, d_model=hidden, d_kv=head_dim, num_heads=heads, d_ff=ffn,
                  num_layers=layers, attn_implementation="eager")
    # The dynamo exporter fails on T5's relative position buckets; the legacy one works at 17.
    return _transformer("t5", config, batch, seq, hidden=hidden, heads=heads, ffn=ffn,
                        vocab=vocab, dynamo=False, opset=17)


def _dien(layers: int, batch: int, seq: int, dim: int, attention_hidden: tuple[int, ...],
          mlp_hidden: tuple[int, ...]) -> ExportSpec:
    inputs = (
        TensorSpec("user", (batch, dim), "float32", axes=("batch", "")),
        TensorSpec("target", (batch, dim), "float32", axes=("batch", "")),
        TensorSpec("behaviors", (batch, seq, dim), "float32", axes=(*TOKENS, "")),
        TensorSpec("behavior_mask", (batch, seq), "float32", prefix(0.0, 1.0), TOKENS),
    )
    config = dict(dim=dim, attention_hidden=attention_hidden, mlp_hidden=mlp_hidden,
                  layers=layers)
    summary = (f"{layers} layers, batch {batch} x seq {seq}, embedding {dim}, attention MLP "
               f"{'-'.join(map(str, attention_hidden))}, MLP {'-'.join(map(str, mlp_hidden))}")
    return ExportSpec("dien", config, inputs, "ctr", summary)


SPECS: dict[str, tuple[str, dict[str, ExportSpec]]] = {
    "bert_layer": (
        "BERT encoder layer with embeddings and padding mask (transformers BertModel)",
        {
            "ci": _bert(LAYERS["ci"], 2, 32, hidden=64, heads=2, ffn=256, vocab=100,
                        positions=64),
            "real": _bert(LAYERS["real"], 8, 128, hidden=768, heads=12, ffn=3072, vocab=30522,
                          positions=512),
        },
    ),
    "gpt2_block": (
        "GPT-2 decoder block with embeddings, causal attention (transformers GPT2Model)",
        {
            "ci": _gpt2(LAYERS["ci"], 2, 32, hidden=64, heads=2, vocab=100, positions=64),
            "real": _gpt2(LAYERS["real"], 8, 512, hidden=768, heads=12, vocab=50257,
                          positions=1024),
        },
    ),
    "llama_block": (
        "LLaMA decoder block: RMSNorm, rotary, grouped-query attention, SiLU-gated MLP",
        {
            "ci": _llama(LAYERS["ci"], 2, 32, hidden=64, heads=2, kv_heads=1, ffn=176,
                         vocab=100, positions=64),
            # TinyLlama-1.1B's layer shape.
            "real": _llama(LAYERS["real"], 8, 512, hidden=2048, heads=32, kv_heads=4,
                           ffn=5632, vocab=32000, positions=2048),
        },
    ),
    "t5_block": (
        "T5 encoder block: RMS-style LayerNorm, relative position bias, ReLU MLP",
        {
            "ci": _t5(LAYERS["ci"], 2, 32, hidden=64, heads=2, head_dim=32, ffn=256,
                      vocab=100),
            "real": _t5(LAYERS["real"], 8, 512, hidden=768, heads=12, head_dim=64, ffn=3072,
                        vocab=32128),
        },
    ),
    "dien_block": (
        "DIEN-like interest block: target attention over behaviours, masked softmax, MLP",
        {
            "ci": _dien(LAYERS["ci"], 16, 16, dim=32, attention_hidden=(80, 40),
                        mlp_hidden=(200, 80)),
            "real": _dien(LAYERS["real"], 512, 100, dim=36, attention_hidden=(80, 40),
                          mlp_hidden=(200, 80)),
        },
    ),
    "swin_block": (
        "Swin transformer stage: windowed and shifted-window attention, patch embedding",
        {
            "ci": _vision("swin", LAYERS["ci"], 2, 32, 2, 32, heads=2, window=4),
            # Swin-T's first stage at 224x224.
            "real": _vision("swin", LAYERS["real"], 8, 224, 4, 96, heads=3, window=7),
        },
    ),
    "convnext_block": (
        "ConvNeXt stage: depthwise 7x7 conv, channels-last LayerNorm, GELU MLP, layer scale",
        {
            "ci": _vision("convnext", LAYERS["ci"], 2, 32, 4, 32),
            "real": _vision("convnext", LAYERS["real"], 8, 224, 4, 96),
        },
    ),
    "mlp_backward": (
        "Training: the backward of pre-LN transformer MLP blocks (input and weight gradients)",
        {
            "ci": _mlp_backward(LAYERS["ci"], 2, 32, hidden=64, ffn=256),
            "real": _mlp_backward(LAYERS["real"], 8, 512, hidden=768, ffn=3072),
        },
    ),
    "roberta_block": (
        "RoBERTa encoder layer: position ids counted from the padding mask (a CumSum)",
        {
            "ci": _roberta(LAYERS["ci"], 2, 32, hidden=64, heads=2, ffn=256, vocab=100),
            "real": _roberta(LAYERS["real"], 8, 128, hidden=768, heads=12, ffn=3072,
                             vocab=50265),
        },
    ),
}
for _model in ("gpt2_block", "llama_block"):
    SPECS[f"{_model}_fp16"] = (f"{SPECS[_model][0]}, in float16",
                               {size: _half(s) for size, s in SPECS[_model][1].items()})


def spec(name: str, size: str, layers: int | None = None, dynamic: bool = False
         ) -> ExportSpec:
    """The export spec of model workload ``name`` at ``size`` (with ``layers`` layers instead
    of the size's ``LAYERS``; with ``dynamic``, its batch and sequence axes dynamic)."""
    if name not in SPECS:
        raise KeyError(f"unknown model workload {name!r}; known: {', '.join(SPECS)}")
    sizes = SPECS[name][1]
    if size not in sizes:
        raise ValueError(f"{name} has no size {size!r}; sizes: {', '.join(sizes)}")
    found = sizes[size]
    found = found if layers is None or layers == found.layers else found.deepened(layers)
    return found.with_dynamic_axes() if dynamic else found


def cache_dir() -> Path:
    """Where exported models are cached: ``$TVM_STITCH_MODEL_CACHE`` or
    ``~/.cache/tvm-stitch/models``."""
    override = os.environ.get(CACHE_ENV)
    return Path(override) if override else Path.home() / ".cache" / "tvm-stitch" / "models"


def cached_path(name: str, size: str, directory: Path | None = None,
                layers: int | None = None, dynamic: bool = False) -> Path:
    """The cache file of model ``name`` at ``size`` (in ``directory``, default cache_dir());
    a depth other than the size's own, and dynamic axes, are named in the file name."""
    depth = "" if layers is None or layers == LAYERS[size] else f"-{layers}layers"
    axes = "-dynamic" if dynamic else ""
    return (directory or cache_dir()) / f"{name}-{size}{depth}{axes}.onnx"


def _require_extra(name: str) -> None:
    try:
        import onnxscript  # noqa: F401
        import torch  # noqa: F401
        import transformers  # noqa: F401
    except ImportError as err:
        raise ModelsExtraMissing(
            f"exporting model workload {name!r} needs torch, transformers and onnxscript; "
            f"{INSTALL_HINT}. ({err})"
        ) from err


@contextmanager
def quiet_exporter() -> Iterator[None]:
    """Silence the exporters' warnings and progress logs (missing torchvision, constant folding
    attempts), which say nothing about the exported model."""
    loggers = [logging.getLogger(name) for name in ("torch.onnx", "onnxscript")]
    levels = [logger.level for logger in loggers]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for logger in loggers:
            logger.setLevel(logging.ERROR)
        try:
            yield
        finally:
            for logger, level in zip(loggers, levels, strict=True):
                logger.setLevel(level)


def _torch_export(module: Any, example: tuple[Any, ...], spec: ExportSpec) -> onnx.ModelProto:
    import torch

    names = dict(input_names=[t.name for t in spec.inputs],
                 output_names=getattr(module, "output_names", [spec.output]))
    axes = [{i: a for i, a in enumerate(t.axes) if a} if spec.dynamic else {}
            for t in spec.inputs]
    with torch.no_grad(), quiet_exporter():
        if spec.dynamo:
            dims = {a: torch.export.Dim(a) for t in axes for a in t.values()}
            shapes = tuple({i: dims[a] for i, a in t.items()} or None for t in axes)
            if getattr(module, "packs_inputs", False):
                shapes = (shapes,)
            program = torch.onnx.export(module, example, None, dynamo=True, verbose=False,
                                        opset_version=spec.opset, external_data=False,
                                        dynamic_shapes=shapes if spec.dynamic else None,
                                        **names)
            return program.model_proto
        buffer = io.BytesIO()
        dynamic_axes = {t.name: a for t, a in zip(spec.inputs, axes, strict=True) if a}
        torch.onnx.export(module, example, buffer, dynamo=False, opset_version=spec.opset,
                          dynamic_axes=dynamic_axes or None, **names)
        return onnx.load_from_string(buffer.getvalue())


def _fold_shapes(model: onnx.ModelProto) -> onnx.ModelProto:
    """``model`` after onnxruntime's basic (semantics-preserving) graph optimizations: the
    legacy exporter computes Swin's window shapes and paddings at run time (Shape, Range,
    ConstantOfShape chains) that TVM's importer cannot follow; with static inputs they fold
    into constants."""
    import tempfile

    import onnxruntime as ort

    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
    with tempfile.TemporaryDirectory() as tmp:
        options.optimized_model_filepath = os.path.join(tmp, "folded.onnx")
        ort.InferenceSession(model.SerializeToString(), options,
                             providers=["CPUExecutionProvider"])
        return onnx.load(options.optimized_model_filepath)


def export_model(name: str, size: str, path: Path | None = None,
                 layers: int | None = None, dynamic: bool = False) -> onnx.ModelProto:
    """Export model workload ``name`` at ``size`` (``layers`` deep, default the size's; with
    ``dynamic``, its batch and sequence axes dynamic) with seeded weights; also save it at
    ``path``.

    Deterministic: the same spec, seed and library versions give byte-identical files.
    Raises ModelsExtraMissing when torch, transformers or onnxscript is not installed.
    """
    export = spec(name, size, layers, dynamic)
    _require_extra(name)
    import torch

    from . import torch_modules

    torch.manual_seed(SEED)
    module = torch_modules.build(export.arch, export.config).eval()
    rng = np.random.default_rng(SEED)
    example = tuple(
        torch.from_numpy(t.dist.sample(rng, t.shape, np.dtype(t.dtype))) for t in export.inputs
    )
    model = _torch_export(torch_modules.exportable(module, example, export.dynamic), example,
                          export)
    if export.fold:
        model = _fold_shapes(model)
    set_input_dists(model, {t.name: t.dist for t in export.inputs})
    set_metadata(model, EXPORT_KEY, export.fingerprint())
    set_metadata(model, WORKLOAD_KEY, name)
    set_metadata(model, SIZE_KEY, size)
    set_metadata(model, "tvm_stitch.exported_with", ", ".join(
        f"{pkg} {metadata.version(pkg)}" for pkg in ("torch", "transformers", "onnxscript")))
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        partial_file = path.with_name(f"{path.name}.{os.getpid()}.tmp")
        onnx.save(model, partial_file)
        os.replace(partial_file, path)
    return model


def load_model(name: str, size: str, directory: Path | None = None,
               layers: int | None = None, dynamic: bool = False) -> onnx.ModelProto:
    """Model workload ``name`` at ``size`` (``layers`` deep, default the size's; ``dynamic``
    as for export_model) from the cache (``directory``, default cache_dir()), exported there
    first if missing or stale (see export_model)."""
    path = cached_path(name, size, directory, layers, dynamic)
    if path.exists():
        model = onnx.load(path)
        if get_metadata(model, EXPORT_KEY) == spec(name, size, layers, dynamic).fingerprint():
            return model
    return export_model(name, size, path, layers, dynamic)


for _name, (_description, _sizes) in SPECS.items():
    register(
        Workload(
            name=_name,
            kind="model",
            description=_description,
            sizes={size: s.summary for size, s in _sizes.items()},
            build=partial(load_model, _name),
        )
    )
