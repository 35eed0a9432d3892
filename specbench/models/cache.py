"""A model plus its KV cache, advanced by appending tokens and cut back by cropping.

``CachedLM`` is shared by the target and every model drafter, for decoder-only and
encoder-decoder models alike. It remembers which token ids its cache covers, so bringing it up to
date with any committed sequence (``sync``) is one comparison and one forward.
"""

from __future__ import annotations

import inspect

import torch
from transformers import DynamicCache, EncoderDecoderCache

from specbench.errors import SpecbenchError
from specbench.models import frontier
from specbench.models.attention import PACKED, pack
from specbench.models.frontier import FrontierCache


def crop_cache(cache, keep: int) -> None:
    """Crop a transformers cache to its first ``keep`` positions.

    A negative argument means "remove that many tokens" in transformers 4.x and 5.x alike.
    """
    current = cache.get_seq_length()
    if keep < current:
        cache.crop(keep - current)


def cache_argument(model: torch.nn.Module) -> str:
    """The forward keyword for the KV cache: ``cache`` (transformers 5) or ``past_key_values`` (4.x)."""
    params = inspect.signature(model.forward).parameters
    return "cache" if "cache" in params else "past_key_values"


def keep_argument(model: torch.nn.Module) -> str | None:
    """The forward keyword that limits logits to the last positions, if the model has one."""
    params = inspect.signature(model.forward).parameters
    return next((k for k in ("logits_to_keep", "num_logits_to_keep") if k in params), None)


def common_prefix(a: list[int], b: list[int]) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


class CachedLM:
    """One model, one KV cache, and the token ids that cache holds.

    For encoder-decoder models the encoder runs once per query in ``reset`` and the cache covers
    the decoder tokens. ``vocab_size`` trims padded logit rows so every model in a pool yields
    distributions over the same ids. A decoder-only model's cache is written in place (``models/frontier.py``: a
    forward copies only its new keys and values, a crop moves a length) and its grouped-query attention never
    expands K and V (``models/attention.py``); where either cannot be used, transformers' own (said once).
    """

    def __init__(self, model: torch.nn.Module, vocab_size: int | None = None):
        self.model = model
        self.device = next(model.parameters()).device
        self.is_encoder_decoder = bool(getattr(model.config, "is_encoder_decoder", False))
        self.vocab_size = vocab_size
        self.cache = None
        self.cached: list[int] = []
        self.encoder_outputs = None
        self._cache_kw = cache_argument(model)
        self._keep_kw = keep_argument(model)
        pack(model)
        self._in_place = (not self.is_encoder_decoder) and frontier.supported(model)

    @torch.inference_mode()
    def reset(self, encoder_ids: list[int] | None = None, encoder_outputs=None) -> None:
        """Start a query: an empty cache; for encoder-decoder models, encode ``encoder_ids`` unless
        ``encoder_outputs`` (the same encoder's output, computed elsewhere) is given."""
        # An explicit cache object: transformers 4.x would otherwise return legacy tuples.
        self.cache = (
            EncoderDecoderCache(DynamicCache(), DynamicCache())
            if self.is_encoder_decoder
            else FrontierCache(1)
            if self._in_place
            else DynamicCache()
        )
        self.cached = []
        self.encoder_outputs = None
        if self.is_encoder_decoder:
            if encoder_outputs is not None:
                self.encoder_outputs = encoder_outputs
            else:
                ids = torch.tensor([encoder_ids], device=self.device)
                self.encoder_outputs = self.model.get_encoder()(input_ids=ids)

    @torch.inference_mode()
    def forward(
        self,
        ids: list[int],
        last_only: bool = False,
        hidden: bool = False,
        tree: torch.Tensor | None = None,
        depths: list[int] | None = None,
        attend: torch.Tensor | None = None,
        positions: list[int] | None = None,
    ):
        """Append ``ids`` to the cache; return float32 logits ``[len(ids), V]`` (``[1, V]`` with
        ``last_only``, which skips the LM head on the other positions where the model allows).

        With ``hidden`` return ``(logits, states)`` where ``states[l]`` ``[len(ids), H]`` is the
        (decoder's) residual stream after ``l`` layers (``states[0]``: the embeddings).

        With ``tree`` (``[len(ids), len(ids)]`` bool, which new position may attend which) and ``depths``
        (each new position's offset from the first), the new positions form a token tree: each sees every
        cached position and the new ones ``tree`` allows, at position ``cached + depth`` (decoder-only
        models that take a 4D attention mask and ``position_ids``, the Llama family among them).

        With ``attend`` (``[len(ids), cached + len(ids)]`` bool) and ``positions`` instead, each new position sees
        exactly the cached and new positions ``attend`` allows (a dynamic draft tree grown over several forwards,
        whose earlier depths are already cached: ``drafters/base.py``).
        """
        x = torch.tensor([ids], device=self.device)
        kwargs = {self._cache_kw: self.cache, "use_cache": True}
        if tree is not None:
            kwargs.update(tree_arguments(self.model, len(self.cached), tree, depths, self.device))
        elif attend is not None:
            kwargs.update(mask_arguments(self.model, attend.to(self.device), positions))
        if last_only and self._keep_kw:
            kwargs[self._keep_kw] = 1
        if hidden:
            kwargs["output_hidden_states"] = True
        if self.is_encoder_decoder:
            out = self.model(encoder_outputs=self.encoder_outputs, decoder_input_ids=x, **kwargs)
        else:
            out = self.model(input_ids=x, **kwargs)
        if self._in_place:
            self.cache.advance(len(ids))
        else:
            self.cache = out[self._cache_kw]
        self.cached.extend(ids)
        logits = out.logits[0, -1:] if last_only else out.logits[0]
        if self.vocab_size is not None and logits.shape[-1] != self.vocab_size:
            logits = fit_vocab(logits, self.vocab_size)
        if hidden:
            states = out.decoder_hidden_states if self.is_encoder_decoder else out.hidden_states
            return logits.float(), tuple(h[0] for h in states)
        return logits.float()

    def keep_positions(self, start: int, rows: list[int]) -> None:
        """Keep cache positions ``0 .. start - 1`` followed by positions ``rows`` (each >= ``start``, in order),
        dropping the rest: after a tree forward, the accepted path's entries move into place."""
        if rows == list(range(start, start + len(rows))):
            self.crop(start + len(rows))
            return
        if self._in_place:
            self.cache.keep(0, start, [r - start for r in rows])
        else:
            select_cache_positions(self.cache, start, rows)
        self.cached[start:] = [self.cached[r] for r in rows]

    def crop(self, keep: int) -> None:
        if keep < len(self.cached):
            if self._in_place:
                self.cache.set_length(0, keep)
            else:
                crop_cache(self.cache, keep)
        del self.cached[keep:]

    def keep_common(self, tokens: list[int], max_keep: int) -> None:
        """Crop to the longest prefix shared with ``tokens`` (at most ``max_keep`` positions)."""
        self.crop(min(common_prefix(self.cached, tokens), max_keep))

    def sync(self, tokens: list[int]) -> torch.Tensor:
        """Bring the cache up to ``tokens``; return the logits ``[V]`` that predict the next token.

        Positions already cached and still valid are kept; stale ones (rejected draft tokens, or
        tokens committed while this model was idle) are cropped and the rest is fed in one forward.
        """
        self.keep_common(tokens, len(tokens) - 1)
        return self.forward(tokens[len(self.cached) :], last_only=True)[-1]


TREE_ATTENTION = ("eager", "sdpa", PACKED)  # the attention implementations that read a custom 4D mask


def check_tree_attention(model: torch.nn.Module, who: str) -> None:
    """Refuse, before decoding, a model whose attention implementation ignores a custom 4D mask (flash-attention
    kernels take none): token trees would then attend across branches and break losslessness silently."""
    impl = getattr(getattr(model, "config", None), "_attn_implementation", None)
    if impl is not None and impl not in TREE_ATTENTION:
        raise SpecbenchError(
            f"{who} verifies or drafts token trees, which need an attention implementation that takes "
            f"a custom 4D mask ({' or '.join(TREE_ATTENTION)}); this model runs '{impl}'",
            "load the model with sdpa or eager attention (remove a flash-attention "
            "attn_implementation from its config.json: transformers then picks sdpa), or use chain "
            "methods (fixed:<drafter>, bandits) with tree=null on the drafters",
        )


def tree_arguments(
    model: torch.nn.Module, cached: int, tree: torch.Tensor, depths: list[int], device
) -> dict:
    """``attention_mask`` (4D, additive: 0 where allowed, the dtype's minimum elsewhere, so eager and SDPA
    attention read it alike) and ``position_ids`` for a tree of ``len(depths)`` new positions after ``cached``."""
    q = tree.shape[0]
    allowed = torch.ones(q, cached + q, dtype=torch.bool, device=device)
    allowed[:, cached:] = tree.to(device)
    return mask_arguments(model, allowed, [cached + d for d in depths])


def mask_arguments(model: torch.nn.Module, allowed: torch.Tensor, positions: list[int]) -> dict:
    """``attention_mask`` (4D, additive: 0 where ``allowed`` ``[q, kv]`` is True, the dtype's minimum elsewhere,
    so eager and SDPA attention read it alike) and ``position_ids`` for ``q`` new positions."""
    dtype = next(model.parameters()).dtype
    if not dtype.is_floating_point:
        dtype = torch.float32
    mask = torch.zeros(allowed.shape, dtype=dtype, device=allowed.device)
    mask.masked_fill_(~allowed, torch.finfo(dtype).min)
    return {
        "attention_mask": mask[None, None],
        "position_ids": torch.tensor([positions], device=allowed.device),
    }


def select_cache_positions(cache, start: int, rows: list[int]) -> None:
    """Keep positions ``0 .. start - 1`` and ``rows`` (each >= ``start``, increasing) of every layer of a dynamic KV
    cache (transformers 5 ``cache.layers``, 4.x ``key_cache`` / ``value_cache``): only the rows move (into
    ``start ..``, in place), then the cache is cut after them; the prefix is never copied."""
    idx = None
    end = start + len(rows)

    def move(x: torch.Tensor) -> torch.Tensor:
        nonlocal idx
        if idx is None or idx.device != x.device:
            idx = torch.tensor(rows, device=x.device)
        with torch.inference_mode():
            x[..., start:end, :] = x.index_select(-2, idx)
        return x[..., :end, :]

    layers = getattr(cache, "layers", None)
    if layers is None:  # transformers 4.x
        for i, (k, v) in enumerate(zip(cache.key_cache, cache.value_cache)):
            if k.numel():
                cache.key_cache[i], cache.value_cache[i] = move(k), move(v)
        return
    if any(hasattr(layer, "cumulative_length") for layer in layers):
        raise SpecbenchError(
            "tree verification needs a full KV cache, and this model keeps a sliding window",
            "verify one draft per round (a fixed:<drafter> or bandit method) with this target",
        )
    for layer in layers:
        if layer.keys is not None and layer.keys.numel():
            layer.keys, layer.values = move(layer.keys), move(layer.values)


def fit_vocab(logits: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """Drop padded rows past ``vocab_size`` or pad missing ids with -inf."""
    if logits.shape[-1] > vocab_size:
        return logits[..., :vocab_size]
    pad = logits.new_full((*logits.shape[:-1], vocab_size - logits.shape[-1]), float("-inf"))
    return torch.cat([logits, pad], dim=-1)
