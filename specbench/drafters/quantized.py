"""``quantized``: the target itself with int8 linear layers, built at load time (no download).

Schemes:
- ``dynamic_int8`` (CPU): ``torch.ao`` dynamic quantization: int8 weights (per output channel)
  and int8 activations quantized on the fly per call, run by fbgemm/onednn int8 GEMMs. Fastest on
  CPUs.
- ``weight_int8`` (CPU or CUDA): weight-only int8 with per-output-channel scales; activations
  stay in the model's dtype (the weight is dequantized inside the matmul).

Any target dtype: ``weight_int8`` computes in the target's dtype (bf16 / fp16 scales); ``dynamic_int8``
quantizes from a float32 copy of the weights (its int8 kernels take float32 activations), so under a
bf16 or fp16 target the drafter runs in float32 + int8 with its own KV cache (and, encoder-decoder, its
own encoder pass). A plain embedding table is not copied: it stays the target's own tensor, in the
target's dtype, and its rows are cast to float32 when read (exact). Its logits reach the loop as
float32 like every drafter's.
"""

from __future__ import annotations

import copy
import warnings
from typing import Annotated

import torch
import torch.nn.functional as F

from specbench.drafters.base import Confidence, ModelDrafter, TreeDraft, with_tree
from specbench.errors import SpecbenchError
from specbench.models.target import Target
from specbench.validate import list_of, text

SCHEMES = ("dynamic_int8", "weight_int8")


class WeightInt8Linear(torch.nn.Module):
    """y = (x @ Wq^T) * s + b with Wq int8 and s the per-output-channel scale."""

    def __init__(self, linear: torch.nn.Linear):
        super().__init__()
        w = linear.weight.detach().float()
        scale = w.abs().amax(dim=1).clamp(min=1e-8) / 127.0
        # Named ``weight`` because some modeling code inspects ``linear.weight.dtype`` (T5 skips its
        # dtype cast for int8 weights).
        self.register_buffer("weight", torch.round(w / scale[:, None]).clamp(-127, 127).to(torch.int8))
        self.register_buffer("scale", scale.to(linear.weight.dtype))
        self.bias = (
            None
            if linear.bias is None
            else torch.nn.Parameter(linear.bias.detach().clone(), requires_grad=False)
        )

    def forward(self, x):
        y = F.linear(x, self.weight.to(x.dtype)) * self.scale.to(x.dtype)
        return y if self.bias is None else y + self.bias.to(y.dtype)


class FloatEmbedding(torch.nn.Embedding):
    """An embedding bound to another table's tensor (no copy, its dtype kept) whose rows come out as
    float32: the input layer of a float32 drafter built from a bf16 / fp16 target."""

    def __init__(self, source: torch.nn.Embedding):
        super().__init__(
            source.num_embeddings,
            source.embedding_dim,
            padding_idx=source.padding_idx,
            max_norm=source.max_norm,
            norm_type=source.norm_type,
            scale_grad_by_freq=source.scale_grad_by_freq,
            sparse=source.sparse,
            _weight=source.weight.detach(),
            _freeze=True,
        )

    def forward(self, ids):
        return super().forward(ids).float()


def _replace_linears(model: torch.nn.Module, skip: list[str]) -> None:
    for name in _linear_names(model, skip):
        owner, _, attr = name.rpartition(".")
        parent = model.get_submodule(owner)
        setattr(parent, attr, WeightInt8Linear(getattr(parent, attr)))


def _linear_names(model: torch.nn.Module, skip: list[str]) -> list[str]:
    """Names of the nn.Linear modules to quantize: all but those whose name ends with a ``skip`` entry."""
    return [
        n
        for n, m in model.named_modules()
        if type(m) is torch.nn.Linear and not any(n.endswith(s) for s in skip)
    ]


def quantize(model: torch.nn.Module, scheme: str, skip: list[str] | None = None) -> torch.nn.Module:
    """A quantized copy of ``model``; linear layers named in ``skip`` (suffixes) keep full precision."""
    if scheme not in SCHEMES:
        raise SpecbenchError(f"unknown quantization scheme '{scheme}'", f"use one of {list(SCHEMES)}")
    device = next(model.parameters()).device
    if scheme == "dynamic_int8":
        if device.type != "cpu":
            raise SpecbenchError("scheme dynamic_int8 runs on CPU only", "use scheme=weight_int8 on CUDA")
        try:
            from torch.ao.quantization import per_channel_dynamic_qconfig, quantize_dynamic
        except ImportError as exc:  # removed from a future torch
            raise SpecbenchError(
                "this torch has no torch.ao.quantization.quantize_dynamic", "use scheme=weight_int8"
            ) from exc
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            # Per-output-channel weight scales: the default per-tensor scale costs acceptance.
            # Its int8 GEMMs take float32 activations: quantize from a float32 copy (a no-op copy for a
            # float32 target; for bf16 / fp16 the weights' values are kept exactly, then rounded to int8).
            clone = copy.deepcopy(model).float()
            spec = {name: per_channel_dynamic_qconfig for name in _linear_names(clone, skip or [])}
            qmodel = quantize_dynamic(clone, spec, dtype=torch.qint8).eval()
        if model.dtype != torch.float32:
            _share_embedding(qmodel, model)
        return qmodel
    clone = copy.deepcopy(model)
    _replace_linears(clone, skip or [])
    return clone.eval()


def _share_embedding(qmodel: torch.nn.Module, model: torch.nn.Module) -> None:
    """Swap the float32 copy of a plain input embedding for the target's own table (read in its dtype,
    rows cast to float32: the same values), so the drafter neither holds nor is charged a second,
    float32 table. A subclass with its own forward (a scaled embedding) keeps its copy."""
    source = model.get_input_embeddings()
    if type(source) is torch.nn.Embedding and type(qmodel.get_input_embeddings()) is torch.nn.Embedding:
        qmodel.set_input_embeddings(FloatEmbedding(source))


def weight_bytes(model: torch.nn.Module) -> float:
    """Bytes of weights read per token, counting each tensor once: parameters and buffers at their
    element size, torch.ao packed int8 linears at one byte per weight entry."""
    total, seen = 0.0, set()
    for mod in model.modules():
        packed = getattr(mod, "weight", None)
        if callable(packed) and not isinstance(packed, torch.Tensor):  # torch.ao dynamic Linear
            w = packed()
            total += w.numel() * w.element_size()
        for t in [*mod.parameters(recurse=False), *mod.buffers(recurse=False)]:
            if id(t) not in seen:
                seen.add(id(t))
                total += t.numel() * t.element_size()
    return total


def build(
    target: Target,
    name: str,
    scheme: Annotated[str, text()] = "dynamic_int8",
    skip: Annotated[list[str] | None, list_of(text(), null=True)] = None,
    confidence_threshold: Confidence = 0.0,
    tree: TreeDraft = None,
) -> ModelDrafter:
    qmodel = quantize(target.model, scheme, skip)
    cost = weight_bytes(qmodel) / weight_bytes(
        target.model
    )  # against the target's own bytes (2 a weight in bf16)
    drafter = ModelDrafter(name, qmodel, target.vocab_size, cost, confidence_threshold)
    # dynamic int8 scales each forward's whole input at once: a catch-up over many tokens computes other
    # probabilities than one token at a time, so a trace replays its Block Divergence only approximately
    drafter.history_free = drafter.history_free and scheme != "dynamic_int8"
    return with_tree(drafter, tree, name)
