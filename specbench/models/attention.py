"""Grouped-query attention that never expands K and V (issue 68), registered through transformers' attention
interface.

transformers' SDPA attention handles a grouped-query model (several query heads per key/value head) in three ways:
with no mask it lets SDPA broadcast the groups (``enable_gqa``); for one query token it folds the group's query heads
into the query axis (``pack_gqa``); for more query tokens with a mask, every verification forward, it copies K and V
to every query head (``repeat_kv``: ``groups`` times the cache, each layer, each forward). ``packed_sdpa`` folds the
groups into the query axis for any number of query tokens: the query ``[B, Hq, q, D]`` becomes ``[B, Hkv, groups *
q, D]`` (query head ``h`` attends key/value head ``h // groups``, as ``repeat_kv`` lays them out), the mask is
repeated ``groups`` times along its query axis (it is shared by the heads: ``q x kv`` entries, not the cache), and
the output is unfolded. Equal to the ``repeat_kv`` path to fp32 rounding (a test). Anything else (one group, no mask,
per-head masks, dropout, a position bias, a soft cap) goes to transformers' own SDPA function unchanged.

``pack(model)`` switches a model whose attention is SDPA to it (``set_attn_implementation``); a model on another
implementation, or a transformers without the interface, keeps its own, said once.
"""

from __future__ import annotations

import contextlib
import functools
import logging

import torch

log = logging.getLogger(__name__)

PACKED = "specbench_sdpa"  # the name it is registered under (config._attn_implementation)


@functools.cache
def said(reason: str) -> None:
    log.info("attention: %s; verification forwards copy K and V to every query head (repeat_kv)", reason)


def _stock():
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    return sdpa_attention_forward


def packed_sdpa(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    **kwargs,
):
    """transformers' attention-function signature (``dropout``, ``scaling``, ``is_causal`` and the rest by keyword):
    ``(output [B, q, Hq, Dv], None)`` (the module's docstring)."""
    dropout, scaling = kwargs.get("dropout", 0.0), kwargs.get("scaling")
    groups = int(getattr(module, "num_key_value_groups", 1) or 1)
    b, hq, q, d = query.shape
    plain = (
        groups == 1
        or attention_mask is None
        or q == 1
        or dropout
        or attention_mask.dim() != 4
        or attention_mask.shape[1] != 1
        or kwargs.get("position_bias") is not None
        or kwargs.get("softcap") is not None
        or kwargs.get("output_attentions", False)
        or key.shape[1] * groups != hq
    )
    if plain:
        return _stock()(module, query, key, value, attention_mask, **kwargs)
    hkv, kv = key.shape[1], key.shape[2]
    packed = query.reshape(b, hkv, groups * q, d)
    mb = attention_mask.shape[0]
    mask = attention_mask[:, :, None, :, :kv].expand(mb, 1, groups, q, kv).reshape(mb, 1, groups * q, kv)
    out = torch.nn.functional.scaled_dot_product_attention(packed, key, value, attn_mask=mask, scale=scaling)
    return out.reshape(b, hq, q, value.shape[-1]).transpose(1, 2).contiguous(), None


@functools.cache
def register() -> bool:
    """``packed_sdpa`` and SDPA's mask builder registered under ``PACKED`` (once); False where transformers has no
    attention interface."""
    try:
        from transformers import AttentionInterface
        from transformers.masking_utils import AttentionMaskInterface, sdpa_mask
    except ImportError:
        said("this transformers has no attention interface")
        return False
    AttentionInterface.register(PACKED, packed_sdpa)
    AttentionMaskInterface.register(PACKED, sdpa_mask)
    return True


def pack(model: torch.nn.Module) -> bool:
    """Switch ``model`` (and its sub-models) from SDPA to ``packed_sdpa``; True when it runs it (now or already)."""
    impl = getattr(getattr(model, "config", None), "_attn_implementation", None)
    if impl == PACKED:
        return True
    if impl != "sdpa":
        if impl is not None:
            said(f"{type(model).__name__} runs '{impl}' attention")
        return False
    if not register() or not hasattr(model, "set_attn_implementation"):
        return False
    try:
        model.set_attn_implementation(PACKED)
    except (ValueError, KeyError, ImportError) as exc:
        said(f"{type(model).__name__} cannot switch its attention ({exc})")
        return False
    return getattr(model.config, "_attn_implementation", None) == PACKED


@contextlib.contextmanager
def stock_attention(model: torch.nn.Module):
    """Inside it ``model`` runs transformers' own SDPA attention (a library baseline, Hugging Face ``generate``, is
    timed as the library ships it), and ``packed_sdpa`` again after."""
    if getattr(getattr(model, "config", None), "_attn_implementation", None) != PACKED:
        yield model
        return
    model.set_attn_implementation("sdpa")
    try:
        yield model
    finally:
        model.set_attn_implementation(PACKED)


__all__ = ["PACKED", "pack", "packed_sdpa", "register", "stock_attention"]
