"""Compile small transformers models beyond the zoo with both flows and check them.

    python scripts/arch_sweep.py [vit roberta ...] [--out DIR]

Each architecture is built from a config with seeded random weights (two layers, hidden 64
to 128, batch 2 x 32 tokens or 64x64 images; nothing is downloaded), exported to ONNX (a text
model with its padding mask as a second input, fed random-length prefixes of ones: padded rows
are what a mask sets to float32's lowest value throughout), and compiled with the stitch and
baseline flows: one line per model with kernels,
memory-intensive kernels and global bytes of each flow, the stitch flow's fallbacks that are
not "nothing to stitch", and the check of the stitch flow against onnxruntime on the SIMT
runner (resources included). Needs the ``models`` extra. Exit status 1 if a check fails.
"""

from __future__ import annotations

import argparse
import io
import sys
from pathlib import Path
from typing import Any

import onnx

from tvm_stitch import verify
from tvm_stitch.analysis import analyze
from tvm_stitch.graph.grouping import NOTHING_TO_STITCH
from tvm_stitch.plan import StitchPlan
from tvm_stitch.testing.differential import check_model
from tvm_stitch.workloads.inputs import integers, prefix, set_input_dists
from tvm_stitch.workloads.models import quiet_exporter

BATCH, TOKENS, VOCAB, IMAGE = 2, 32, 512, 64


def _text(**config: Any) -> dict[str, Any]:
    """A two-layer text model of width 128 in 4 heads, and what else ``config`` sets."""
    return dict(hidden_size=128, num_hidden_layers=2, num_attention_heads=4, **config)


def _patches(**config: Any) -> dict[str, Any]:
    """A two-layer vision transformer of width 96 in 3 heads on 8x8 patches."""
    return dict(image_size=IMAGE, patch_size=8, hidden_size=96, num_hidden_layers=2,
                num_attention_heads=3, intermediate_size=384, **config)


TEXT: dict[str, tuple[str, str, dict[str, Any]]] = {
    "distilbert": ("DistilBertConfig", "DistilBertModel",
                   dict(dim=128, n_layers=2, n_heads=4, hidden_dim=512)),
    "roberta": ("RobertaConfig", "RobertaModel", _text(intermediate_size=512, pad_token_id=1)),
    "albert": ("AlbertConfig", "AlbertModel", _text(intermediate_size=512, embedding_size=64)),
    "convbert": ("ConvBertConfig", "ConvBertModel",
                 _text(intermediate_size=512, embedding_size=128)),
    "mistral": ("MistralConfig", "MistralModel",
                _text(num_key_value_heads=2, intermediate_size=352, sliding_window=16)),
    "qwen2": ("Qwen2Config", "Qwen2Model", _text(num_key_value_heads=2, intermediate_size=352)),
    "gemma": ("GemmaConfig", "GemmaModel",
              _text(num_key_value_heads=1, head_dim=32, intermediate_size=352)),
    "phi": ("PhiConfig", "PhiModel", _text(intermediate_size=512, partial_rotary_factor=0.5)),
    "gpt_neox": ("GPTNeoXConfig", "GPTNeoXModel", _text(intermediate_size=512, rotary_pct=0.25)),
    "opt": ("OPTConfig", "OPTModel", _text(ffn_dim=512, word_embed_proj_dim=128)),
    "bloom": ("BloomConfig", "BloomModel", dict(hidden_size=128, n_layer=2, n_head=4)),
    "falcon": ("FalconConfig", "FalconModel",
               _text(new_decoder_architecture=False, multi_query=True, parallel_attn=True)),
}
IMAGES: dict[str, tuple[str, str, dict[str, Any]]] = {
    "vit": ("ViTConfig", "ViTModel", _patches()),
    "deit": ("DeiTConfig", "DeiTModel", _patches()),
    "clip_vision": ("CLIPVisionConfig", "CLIPVisionModel", _patches()),
    "segformer": ("SegformerConfig", "SegformerModel",
                  dict(num_encoder_blocks=2, depths=[1, 1], sr_ratios=[2, 1],
                       hidden_sizes=[32, 64], num_attention_heads=[1, 2], patch_sizes=[7, 3],
                       strides=[4, 2], mlp_ratios=[4, 4])),
    "mobilevit": ("MobileViTConfig", "MobileViTModel",
                  dict(image_size=IMAGE, hidden_sizes=[48, 64, 80],
                       neck_hidden_sizes=[16, 24, 32, 48, 64, 80, 160])),
    "resnet": ("ResNetConfig", "ResNetModel",
               dict(embedding_size=32, hidden_sizes=[32, 64], depths=[1, 1],
                    layer_type="basic")),
}


def export(name: str) -> onnx.ModelProto:
    """Architecture ``name`` with seeded random weights, exported to ONNX (``x`` in, and a
    text model's padding mask ``mask``; the last hidden state ``y`` out)."""
    import torch
    import transformers

    config_cls, model_cls, config = {**TEXT, **IMAGES}[name]
    torch.manual_seed(0)
    model = getattr(transformers, model_cls)(getattr(transformers, config_cls)(
        **({"vocab_size": VOCAB} if name in TEXT else {}), **config,
        attn_implementation="eager")).eval()
    text = name in TEXT
    if text:
        mask = torch.ones(BATCH, TOKENS, dtype=torch.int64)
        mask[1, TOKENS // 2:] = 0
        example: tuple[torch.Tensor, ...] = (torch.randint(0, VOCAB, (BATCH, TOKENS)), mask)
    else:
        example = (torch.randn(BATCH, 3, IMAGE, IMAGE),)

    class Hidden(torch.nn.Module):
        def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
            out = model(input_ids=x, attention_mask=mask) if text else model(pixel_values=x)
            return out.last_hidden_state

    names = dict(input_names=["x", "mask"][:len(example)], output_names=["y"])
    with torch.no_grad(), quiet_exporter():
        try:
            exported = torch.onnx.export(Hidden(), example, None, dynamo=True,
                                         opset_version=18, external_data=False, verbose=False,
                                         **names).model_proto
        except Exception:  # noqa: BLE001 - some export only with the legacy exporter
            buffer = io.BytesIO()
            torch.onnx.export(Hidden(), example, buffer, dynamo=False, opset_version=17,
                              **names)
            exported = onnx.load_from_string(buffer.getvalue())
    if text:
        set_input_dists(exported, {"x": integers(0, VOCAB), "mask": prefix(0, 1)})
    return exported


def _counts(model: onnx.ModelProto, flow: str) -> str:
    try:
        report = analyze(verify.compile_model(model, flow))
    except Exception as err:  # noqa: BLE001 - TVM's own flow fails on some models
        return f"{flow}: fails ({type(err).__name__})"
    return (f"{flow}: {len(report.kernels)} kernels, {report.mem_kernels} memory-intensive, "
            f"{report.global_bytes} B")


def main(argv: list[str] | None = None) -> int:
    """Sweep the named architectures (default all); exit status 1 if a check fails."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("archs", nargs="*", metavar="ARCH",
                        help=f"architectures to sweep (default all): {', '.join(TEXT)}, "
                             f"{', '.join(IMAGES)}")
    parser.add_argument("--out", type=Path, help="also save each exported model here")
    args = parser.parse_args(argv)
    unknown = set(args.archs) - {*TEXT, *IMAGES}
    if unknown:
        parser.error(f"unknown architectures: {', '.join(sorted(unknown))}")
    failed = False
    for name in args.archs or [*TEXT, *IMAGES]:
        model = export(name)
        if args.out:
            args.out.mkdir(parents=True, exist_ok=True)
            onnx.save(model, args.out / f"{name}.onnx")
        plan = StitchPlan.of_module(verify.compile_model(model, "stitch"))
        outcome = check_model(model, "stitch")
        ok = outcome.kind == "ok" and not outcome.violations
        failed |= not ok
        print(f"{name}: {_counts(model, 'stitch')}; {_counts(model, 'baseline')}; check "
              f"{outcome.kind}{'' if ok else ': ' + (outcome.error or str(outcome.violations))}",
              flush=True)
        for f in plan.fallbacks:
            if f.reason not in NOTHING_TO_STITCH:
                print(f"  fallback {', '.join(f.ops)}: {f.reason}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
