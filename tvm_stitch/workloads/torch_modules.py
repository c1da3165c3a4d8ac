"""The torch modules behind the model workloads. Imported only to export (needs ``torch``)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

# arch -> (config class, model class, model constructor kwargs, call kwargs), from transformers
TRANSFORMERS_ARCHS: dict[str, tuple[str, str, dict[str, Any], dict[str, Any]]] = {
    "bert": ("BertConfig", "BertModel", {"add_pooling_layer": False}, {}),
    "roberta": ("RobertaConfig", "RobertaModel", {"add_pooling_layer": False}, {}),
    "gpt2": ("GPT2Config", "GPT2Model", {}, {"use_cache": False}),
    "llama": ("LlamaConfig", "LlamaModel", {}, {"use_cache": False}),
    "t5": ("T5Config", "T5EncoderModel", {}, {}),
    "swin": ("SwinConfig", "SwinModel", {"add_pooling_layer": False}, {}),
    "convnext": ("ConvNextConfig", "ConvNextModel", {}, {}),
}
IMAGE_ARCHS = frozenset({"swin", "convnext"})
"""Architectures fed images (``pixel_values``) rather than token ids."""


class LastHiddenState(nn.Module):
    """Calls a transformers model by keyword and returns ``last_hidden_state``.

    Keyword calls are required: positional ones clash with ``use_cache`` in transformers 5.
    """

    def __init__(self, model: nn.Module, call_kwargs: dict[str, Any]) -> None:
        super().__init__()
        self.model = model
        self.call_kwargs = call_kwargs

    def forward(self, input_ids: torch.Tensor,
                attention_mask: torch.Tensor | None = None) -> torch.Tensor:
        """The encoder/decoder output for ``input_ids`` (and the padding mask, if given)."""
        masks = {} if attention_mask is None else {"attention_mask": attention_mask}
        return self.model(input_ids=input_ids, **masks, **self.call_kwargs).last_hidden_state


class ImageHiddenState(nn.Module):
    """Calls a transformers vision model on ``pixel_values`` and returns
    ``last_hidden_state``."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, pixel_values: torch.Tensor) -> torch.Tensor:
        """The last stage's features for a batch of images."""
        return self.model(pixel_values=pixel_values).last_hidden_state


class MLPStack(nn.Module):
    """``layers`` pre-LayerNorm transformer MLP blocks: x + fc2(gelu(fc1(layer_norm(x))))."""

    def __init__(self, hidden: int, ffn: int, layers: int) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(
            nn.Sequential(nn.LayerNorm(hidden), nn.Linear(hidden, ffn), nn.GELU(),
                          nn.Linear(ffn, hidden)) for _ in range(layers))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """The stack's output for ``x`` (batch x seq x hidden)."""
        for block in self.blocks:
            x = x + block(x)
        return x


class Gradients(nn.Module):
    """The backward pass of a training step through ``inner``: for an input ``x`` and the
    gradient ``dy`` of the loss with respect to ``inner(x)``, the gradients with respect to
    ``x`` and to every parameter (the LayerNorm, GELU and bias gradients, row and column
    reductions, that a training graph runs between its matmuls)."""

    def __init__(self, inner: nn.Module) -> None:
        super().__init__()
        self.inner = inner
        self.output_names = ["dx"] + [f"d_{n.replace('.', '_')}"
                                      for n, _ in inner.named_parameters()]

    def forward(self, x: torch.Tensor, dy: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """``(dx, *dparams)``."""
        with torch.enable_grad():
            x = x.detach().requires_grad_(True)
            y = self.inner(x)
            return torch.autograd.grad(y, [x, *self.inner.parameters()], dy)


class _Traced(nn.Module):
    packs_inputs = True
    """Its inputs arrive as one tuple (``*inputs``): torch.export's ``dynamic_shapes`` must
    nest theirs in one."""

    def __init__(self, graph: nn.Module, output_names: list[str]) -> None:
        super().__init__()
        self.traced = graph
        self.output_names = output_names

    def forward(self, *inputs: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return tuple(self.traced(*inputs))


def exportable(module: nn.Module, example: tuple[torch.Tensor, ...],
               dynamic: bool = False) -> nn.Module:
    """``module`` in a form torch's ONNX exporter takes: a Gradients module traced into plain
    aten ops first (make_fx), since the exporter cannot export ``torch.autograd.grad``; with
    ``dynamic``, traced with symbolic shapes, so that the graph holds for every batch and
    sequence length (its parameters stay real tensors, as constants of the graph)."""
    if not isinstance(module, Gradients):
        return module
    from torch.fx.experimental.proxy_tensor import make_fx

    tracer = make_fx(module, tracing_mode="symbolic", _allow_non_fake_inputs=True) \
        if dynamic else make_fx(module)
    return _Traced(tracer(*example), module.output_names)


def _mlp(widths: Sequence[int], activation: type[nn.Module]) -> nn.Sequential:
    """Linear layers through ``widths``, each followed by ``activation``, then a Linear to 1."""
    layers: list[nn.Module] = []
    for width_in, width_out in zip(widths[:-1], widths[1:], strict=True):
        layers += [nn.Linear(width_in, width_out), activation()]
    layers.append(nn.Linear(widths[-1], 1))
    return nn.Sequential(*layers)


class DienBlock(nn.Module):
    """A GRU-free DIEN/DIN-style interest block on already-embedded features.

    An attention MLP scores every behaviour against the target item; a masked softmax over the
    sequence weights the behaviours into one interest vector; user, target, interest and
    target * interest are concatenated into a PReLU MLP ending in a sigmoid (click probability).
    With ``layers`` > 1 the interest is refined in hops (as in multi-hop memory attention):
    each further layer's attention MLP scores the behaviours against the previous interest.
    """

    def __init__(self, dim: int, attention_hidden: Sequence[int],
                 mlp_hidden: Sequence[int], layers: int = 1) -> None:
        super().__init__()
        self.hops = nn.ModuleList(_mlp([4 * dim, *attention_hidden], nn.Sigmoid)
                                  for _ in range(layers))
        self.head = _mlp([4 * dim, *mlp_hidden], nn.PReLU)

    def forward(self, user: torch.Tensor, target: torch.Tensor, behaviors: torch.Tensor,
                behavior_mask: torch.Tensor) -> torch.Tensor:
        """Click probability (batch x 1); ``behavior_mask`` is 1 for real behaviours, 0 for
        padding."""
        interest = target
        for attention in self.hops:
            query = interest.unsqueeze(1).expand_as(behaviors)
            features = torch.cat([query, behaviors, query - behaviors, query * behaviors],
                                 dim=-1)
            scores = attention(features).squeeze(-1) + (behavior_mask - 1.0) * 10000.0
            weights = torch.softmax(scores, dim=-1)
            interest = (weights.unsqueeze(-1) * behaviors).sum(dim=1)
        joint = torch.cat([user, target, interest, target * interest], dim=-1)
        return torch.sigmoid(self.head(joint))


def build(arch: str, config: dict[str, Any]) -> nn.Module:
    """A freshly initialised module for ``arch`` (a key of TRANSFORMERS_ARCHS, ``dien`` or
    ``mlp_backward``); a ``dtype`` entry of ``config`` casts its weights (``float16``).

    Weights come from torch's global RNG: seed it first for a deterministic module.
    """
    config = dict(config)
    dtype = getattr(torch, config.pop("dtype", "float32"))
    if arch == "dien":
        return DienBlock(**config)
    if arch == "mlp_backward":
        return Gradients(MLPStack(**config))
    import transformers

    config_cls, model_cls, model_kwargs, call_kwargs = TRANSFORMERS_ARCHS[arch]
    model = getattr(transformers, model_cls)(
        getattr(transformers, config_cls)(**config), **model_kwargs
    ).to(dtype)
    if arch in IMAGE_ARCHS:
        return ImageHiddenState(model)
    return LastHiddenState(model, call_kwargs)
