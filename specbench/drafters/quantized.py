"""``quantized``: the target itself with int8 linear layers, built at load time (no download).

Schemes:
- ``dynamic_int8`` (CPU): ``torch.ao`` dynamic quantization: int8 weights (per output channel)
  and int8 activations quantized on the fly per call, run by fbgemm/onednn int8 GEMMs. Fastest on
  CPUs.
- ``weight_int8`` (CPU or CUDA): weight-only int8 with per-output-channel scales; activations
  stay in the model's dtype (the weight is dequantized inside the matmul).
"""

from __future__ import annotations

import copy
import warnings

import torch
import torch.nn.functional as F

from specbench.drafters.base import ModelDrafter
from specbench.errors import SpecbenchError
from specbench.models.target import Target

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
        self.bias = None if linear.bias is None else torch.nn.Parameter(linear.bias.detach().clone(), requires_grad=False)

    def forward(self, x):
        y = F.linear(x, self.weight.to(x.dtype)) * self.scale.to(x.dtype)
        return y if self.bias is None else y + self.bias


def _replace_linears(model: torch.nn.Module) -> int:
    n = 0
    for name, module in list(model.named_modules()):
        for child_name, child in list(module.named_children()):
            if type(child) is torch.nn.Linear:
                setattr(module, child_name, WeightInt8Linear(child))
                n += 1
    return n


def quantize(model: torch.nn.Module, scheme: str) -> torch.nn.Module:
    if scheme not in SCHEMES:
        raise SpecbenchError(f"unknown quantization scheme '{scheme}'", f"use one of {list(SCHEMES)}")
    device = next(model.parameters()).device
    if scheme == "dynamic_int8":
        if device.type != "cpu":
            raise SpecbenchError("scheme dynamic_int8 runs on CPU only", "use scheme=weight_int8 on CUDA")
        if model.dtype != torch.float32:
            raise SpecbenchError(f"scheme dynamic_int8 needs a float32 target, got {model.dtype}",
                                 "use target.dtype=float32, or scheme=weight_int8")
        try:
            from torch.ao.quantization import per_channel_dynamic_qconfig, quantize_dynamic
        except ImportError as exc:  # removed from a future torch
            raise SpecbenchError("this torch has no torch.ao.quantization.quantize_dynamic",
                                 "use scheme=weight_int8") from exc
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            # Per-output-channel weight scales: the default per-tensor scale costs acceptance.
            spec = {torch.nn.Linear: per_channel_dynamic_qconfig}
            return quantize_dynamic(copy.deepcopy(model), spec, dtype=torch.qint8).eval()
    clone = copy.deepcopy(model)
    _replace_linears(clone)
    return clone.eval()


def weight_bytes(model: torch.nn.Module, int8_linears: bool) -> float:
    """Bytes of weights read per token: int8 linear weights count 1 byte per entry."""
    total = 0.0
    seen = set()
    for mod in model.modules():
        for pname, p in mod.named_parameters(recurse=False):
            if id(p) in seen:
                continue
            seen.add(id(p))
            per = 1 if (int8_linears and isinstance(mod, torch.nn.Linear) and pname == "weight") else p.element_size()
            total += p.numel() * per
    return total


def build(target: Target, name: str, scheme: str = "dynamic_int8", cost: float | None = None) -> ModelDrafter:
    qmodel = quantize(target.model, scheme)
    if cost is None:
        cost = weight_bytes(target.model, int8_linears=True) / weight_bytes(target.model, int8_linears=False)
    return ModelDrafter(name, qmodel, target.vocab_size, cost)
