"""The EAGLE head pieces both layouts and the training wing share: ``family_config`` (the target's config for an
N-layer stack), ``EagleHead`` (the EAGLE-1 head module: ``fc`` + the family's decoder layers) and ``HeadLogits`` (the
target's LM head, whole or restricted to a draft sub-vocabulary). The EAGLE-1 drafter is ``eagle1.py``."""

from __future__ import annotations

import copy

import torch
from torch import nn

from specbench.models.cache import cache_argument
from specbench.models.target import Target


def family_config(target_config, layers: int):
    """The target's config for an N-layer head stack: no vocabulary of its own (inputs are embeddings)."""
    config = copy.deepcopy(target_config)
    config.num_hidden_layers = int(layers)
    config.vocab_size = 1
    config.pad_token_id = None
    config.tie_word_embeddings = False
    return config


class EagleHead(nn.Module):
    """``fc`` + the family's decoder layers; ``forward(features, token_embeddings, cache) -> features``.

    The stack is the target family's base model built with N layers (its mask, rotary and cache
    handling), fed ``inputs_embeds``; its final norm and its first layer's input norm are identities
    (EAGLE-1). Parameters: ``fc.*`` and ``layers.*`` only.
    """

    def __init__(self, target_model: nn.Module, layers: int = 1, dtype: torch.dtype | None = None):
        super().__init__()
        base = target_model.base_model
        hidden = int(target_model.config.hidden_size)
        config = family_config(base.config, layers)
        stack = type(base)(config)
        stack.norm = nn.Identity()
        first = stack.layers[0]
        if hasattr(first, "input_layernorm"):
            first.input_layernorm = nn.Identity()
        stack.embed_tokens = None
        self.fc = nn.Linear(2 * hidden, hidden, bias=True)
        self.layers = stack.layers
        self._stack = [stack]  # not a submodule: its parameters are ``layers``
        self.n_layers = int(layers)
        self._cache_kw = cache_argument(stack)
        self.to(
            dtype=dtype or next(target_model.parameters()).dtype,
            device=next(target_model.parameters()).device,
        )
        stack.to(device=next(target_model.parameters()).device)

    def forward(
        self, features: torch.Tensor, embeddings: torch.Tensor, cache=None, mask: dict | None = None
    ) -> torch.Tensor:
        """``features`` ``[B, T, H]`` (``f_t``), ``embeddings`` ``[B, T, H]`` (of ``x_{t+1}``) -> ``[B, T, H]``,
        in the head's dtype (inputs of another dtype, e.g. a bf16 target's, are cast). ``mask``: a token tree's
        ``attention_mask`` and ``position_ids`` (``models.cache.mask_arguments``) for the new positions."""
        kwargs = {} if cache is None else {self._cache_kw: cache, "use_cache": True}
        kwargs.update(mask or {})
        return self.stack(inputs_embeds=self.inputs(features, embeddings), **kwargs).last_hidden_state

    def inputs(self, features: torch.Tensor, embeddings: torch.Tensor) -> torch.Tensor:
        """What the stack is fed for ``(f_t, x_{t+1})`` pairs: ``fc([embed(x_{t+1}), f_t])``, in the head's dtype."""
        dtype = self.fc.weight.dtype
        return self.fc(torch.cat([embeddings.to(dtype), features.to(dtype)], dim=-1))

    @property
    def stack(self) -> nn.Module:
        """The decoder stack (a base model fed ``inputs_embeds``; a batch drafts through it, ``drafters/batched.py``)."""
        return self._stack[0]


class HeadLogits:
    """The target's LM head restricted to a sub-vocabulary (``d2t``), or the whole head.

    ``dtype``: the dtype the logits are computed in (None: the LM head's own). Another dtype (float32
    to train a head on a bf16 target) takes a copy of the rows in that dtype; the input is cast to it.
    """

    def __init__(self, target: Target, d2t: torch.Tensor | None, dtype: torch.dtype | None = None):
        self.lm_head = target.model.get_output_embeddings()
        self.vocab_size = target.vocab_size
        self.d2t = d2t
        weight = self.lm_head.weight
        self.dtype = dtype or weight.dtype
        bias = getattr(self.lm_head, "bias", None)
        if d2t is None and self.dtype == weight.dtype:
            self.weight = self.bias = None  # the LM head itself
        else:
            rows = weight if d2t is None else weight[d2t]
            self.weight = rows.detach().to(self.dtype).clone()
            self.bias = (
                None if bias is None else (bias if d2t is None else bias[d2t]).detach().to(self.dtype).clone()
            )

    @property
    def key(self) -> tuple:
        """Equal for heads whose logits are one and the same product (the target's LM head in its own dtype,
        no sub-vocabulary), so that their rows may be computed together; ``(None, id)`` otherwise."""
        return (id(self.lm_head), self.dtype) if self.weight is None else (None, id(self))

    def __call__(self, h: torch.Tensor) -> torch.Tensor:
        """``[..., H]`` -> float32 logits over the draft vocabulary (``[..., N]``, or ``[..., V]``)."""
        h = h.to(self.dtype)
        if self.weight is None:
            return self.lm_head(h)[..., : self.vocab_size].float()
        logits = torch.nn.functional.linear(h, self.weight, self.bias)
        return (logits if self.d2t is not None else logits[..., : self.vocab_size]).float()

    def to_full(self, rows: torch.Tensor, fill: float) -> torch.Tensor:
        """Place ``[..., N]`` values in the full vocabulary (``fill`` elsewhere)."""
        if self.d2t is None:
            return rows
        out = rows.new_full((*rows.shape[:-1], self.vocab_size), fill)
        out[..., self.d2t] = rows
        return out
