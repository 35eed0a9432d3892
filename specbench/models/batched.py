"""Several sequences in one KV cache: a decoder-only model advanced one forward for every row at once (issue 57).

The cache is one tensor per layer, ``[rows, heads, slots, dim]``, with a validity mask ``valid`` ``[rows, slots]``:
row ``r`` attends exactly its valid slots, and each token sits at its own position in its row (``position_ids``
per row), so rows of different prompt lengths (left padding) and different accepted lengths share a forward. A
round appends the same number of slots to every row (the longest input, shorter ones padded at the end, which no
earlier position attends); ``keep`` then marks which of them each row keeps (its last committed token and its
accepted draft), so nothing is cropped: a rejected draft's slots stay in the tensor, masked, until ``compact`` moves
every row's valid slots together (gpt-fast keeps a static cache the same way, writing by position and masking stale
slots). A row that finishes leaves the batch (``drop``). Each row computes what it would alone, to the rounding of a
batched matrix product.

The attention mask is 4D and additive (``cache.mask_arguments``' convention, one per row), which eager and SDPA
attention read alike; a model whose attention takes no custom mask is refused (``cache.check_tree_attention``).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from transformers import DynamicCache

from specbench.errors import SpecbenchError
from specbench.models.cache import cache_argument, check_tree_attention, fit_vocab
from specbench.models.target import check_pooling, pool_states


@dataclass(frozen=True)
class Started:
    """What ``BatchedLM.start`` read off the prefill: each row's prompt embedding (with a pooling) and each row's
    ``{layer: [cached positions, H]}`` states (with layers); None where not asked for."""

    embeddings: list[torch.Tensor] | None
    states: list[dict[int, torch.Tensor]] | None


PAD = 0  # the id fed at padded positions (never attended by a valid position: any id will do)
COMPACT_AT = 0.25  # compact when more than this share of the slots is masked (and at least MIN_WASTE slots)
MIN_WASTE = 16


class BatchedLM:
    """``model`` (decoder-only) with one cache for ``rows`` sequences; ``vocab_size`` trims padded logit rows."""

    def __init__(self, model: torch.nn.Module, vocab_size: int | None = None):
        if getattr(model.config, "is_encoder_decoder", False):
            raise SpecbenchError(
                f"batched decoding needs a decoder-only target; {type(model).__name__} is encoder-decoder",
                "decode this target with decoding.batch_size=1 (one query at a time)",
            )
        check_tree_attention(model, "batched decoding")
        self.model = model
        self.vocab_size = vocab_size
        self.device = next(model.parameters()).device
        dtype = next(model.parameters()).dtype
        self.mask_dtype = dtype if dtype.is_floating_point else torch.float32
        self._cache_kw = cache_argument(model)
        self.cache = DynamicCache()
        self.valid = torch.zeros(0, 0, dtype=torch.bool, device=self.device)
        self.n = torch.zeros(
            0, dtype=torch.long, device=self.device
        )  # valid slots a row, = its next position
        self._pending = 0  # slots the last ``score`` appended, before ``keep``
        self.last_states: dict[
            int, torch.Tensor
        ] = {}  # the last ``score``'s states for the layers it was asked

    @property
    def rows(self) -> int:
        return int(self.n.shape[0])

    @property
    def slots(self) -> int:
        return int(self.valid.shape[1])

    @torch.inference_mode()
    def start(
        self, sequences: list[list[int]], pooling: str | None = None, layers: tuple[int, ...] = ()
    ) -> Started:
        """A new batch: cache every token of each sequence but its last (fed by the first ``score``), left-padded.
        With ``pooling``, each row's prompt embedding too (``Target.prefill``'s, read off the same forward: every
        token is fed, then the last one's slot is masked, as the first ``score`` feeds it again); with ``layers``,
        each row's states at its cached positions (``Target.prefill``'s ``states``)."""
        if any(len(s) < 1 for s in sequences):
            raise ValueError("every sequence needs at least one token")
        check_pooling(pooling)
        self.cache = DynamicCache()
        heads = [list(s) if pooling else list(s[:-1]) for s in sequences]
        width = max((len(h) for h in heads), default=0)
        rows = len(sequences)
        self.valid = torch.zeros(rows, width, dtype=torch.bool, device=self.device)
        for r, h in enumerate(heads):
            self.valid[r, width - len(h) :] = True
        self.n = torch.tensor([len(h) for h in heads], dtype=torch.long, device=self.device)
        self._pending = 0
        self.last_states = {}
        if width == 0:
            # every prompt one token (no pooling: it feeds them all): nothing cached, no states at cached positions
            none = torch.zeros(0, int(self.model.config.hidden_size), device=self.device)
            return Started(
                None, [{int(layer): none for layer in layers} for _ in range(rows)] if layers else None
            )
        ids = torch.tensor([[PAD] * (width - len(h)) + h for h in heads], device=self.device)
        positions = (self.valid.long().cumsum(dim=1) - 1).clamp(min=0)
        out = self._forward(ids, positions, self.valid.clone(), past=0, hidden=bool(pooling or layers))
        if not (pooling or layers):
            return Started(None, None)
        hidden = out[1]
        mine = [slice(width - len(h), width - len(h) + len(s) - 1) for h, s in zip(heads, sequences)]
        pooled = (
            [pool_states(hidden[-1][r, width - len(h) :], pooling) for r, h in enumerate(heads)]
            if pooling
            else None
        )
        states = (
            [{int(layer): hidden[layer][r, mine[r]] for layer in layers} for r in range(rows)]
            if layers
            else None
        )
        if pooling:
            self.rewind([len(h) - 1 for h in heads])
        return Started(pooled, states)

    @torch.inference_mode()
    def score(self, inputs: list[list[int]], layers: tuple[int, ...] = ()) -> torch.Tensor:
        """One forward over each row's ``inputs`` (its last committed token, then its draft): float32 logits
        ``[rows, q, V]`` (``q`` the longest input; a shorter row's extra rows are padding, to be ignored). With
        ``layers``, ``last_states`` holds ``{layer: [rows, q, H]}``, the residual stream after that many layers at
        the same positions (``Target.score``'s ``states``)."""
        if len(inputs) != self.rows:
            raise ValueError(f"{len(inputs)} inputs for {self.rows} rows")
        if self._pending:
            raise RuntimeError("score called twice without keep")
        q = max(len(x) for x in inputs)
        ids = torch.tensor([list(x) + [PAD] * (q - len(x)) for x in inputs], device=self.device)
        positions = self.n[:, None] + torch.arange(q, device=self.device)[None]
        out = self._forward(ids, positions, self.valid, past=self.slots, hidden=bool(layers))
        logits, self.last_states = (
            (out[0], {int(layer): out[1][layer] for layer in layers}) if layers else (out, {})
        )
        self.valid = torch.cat(
            [self.valid, torch.zeros(self.rows, q, dtype=torch.bool, device=self.device)], 1
        )
        self._pending = q
        return logits

    @torch.inference_mode()
    def keep(self, lengths: list[int]) -> None:
        """Of the slots the last ``score`` appended, row ``r`` keeps its first ``lengths[r]`` (its last committed token
        and its accepted draft tokens); the rest stay masked."""
        start = self.slots - self._pending
        for r, k in enumerate(lengths):
            if not 0 <= k <= self._pending:
                raise ValueError(f"row {r} keeps {k} of {self._pending} new slots")
            self.valid[r, start : start + k] = True
        self.n += torch.tensor(lengths, dtype=torch.long, device=self.device)
        self._pending = 0
        waste = self.slots - int(self.n.max()) if self.rows else 0
        if waste >= MIN_WASTE and waste > COMPACT_AT * self.slots:
            self.compact()

    @torch.inference_mode()
    def rewind(self, lengths: list[int]) -> None:
        """Row ``r`` keeps only its first ``lengths[r]`` valid slots (at most what it has): a drafter's cache cut back
        to the committed prefix after its draft was verified (``drafters/batched.py``)."""
        if self._pending:
            raise RuntimeError("rewind called between score and keep")
        new = torch.tensor(lengths, dtype=torch.long, device=self.device)
        if new.shape != self.n.shape or bool((new < 0).any() | (new > self.n).any()):
            raise ValueError(f"rewind to {lengths}: each row keeps between 0 and its {self.n.tolist()} slots")
        self.valid &= self.valid.long().cumsum(dim=1) <= new[:, None]
        self.n = new

    @torch.inference_mode()
    def drop(self, keep_rows: list[int]) -> None:
        """Keep only the rows ``keep_rows`` (in that order): finished rows leave the batch."""
        idx = torch.tensor(keep_rows, dtype=torch.long, device=self.device)
        for layer in _layers(self.cache):
            if layer.keys is not None and layer.keys.numel():
                layer.keys, layer.values = layer.keys.index_select(0, idx), layer.values.index_select(0, idx)
        self.valid, self.n = self.valid.index_select(0, idx), self.n.index_select(0, idx)

    @torch.inference_mode()
    def compact(self) -> None:
        """Move every row's valid slots together (right-aligned, in order): the masked ones are dropped."""
        width = int(self.n.max()) if self.rows else 0
        idx = torch.zeros(self.rows, width, dtype=torch.long, device=self.device)
        valid = torch.zeros(self.rows, width, dtype=torch.bool, device=self.device)
        for r in range(self.rows):
            mine = self.valid[r].nonzero().squeeze(1)
            idx[r, width - mine.numel() :] = mine
            valid[r, width - mine.numel() :] = True
        for layer in _layers(self.cache):
            if layer.keys is not None and layer.keys.numel():
                at = idx[:, None, :, None].expand(-1, layer.keys.shape[1], -1, layer.keys.shape[3])
                layer.keys, layer.values = layer.keys.gather(2, at), layer.values.gather(2, at)
        self.valid = valid

    def _forward(
        self, ids: torch.Tensor, positions: torch.Tensor, past_valid: torch.Tensor, past: int, hidden=False
    ):
        """Append ``ids`` ``[rows, q]`` at ``positions``; each new slot sees the row's valid past slots, the new slots
        before it, and itself. Float32 logits, and with ``hidden`` every layer's hidden states beside them (``[0]`` the
        embeddings, ``[-1]`` the final states)."""
        rows, q = ids.shape
        new = torch.ones(q, q, dtype=torch.bool, device=self.device).tril()
        if past:
            allowed = torch.cat([past_valid[:, None, :].expand(rows, q, past), new.expand(rows, q, q)], dim=2)
        else:  # the prefill: the prompt's slots are the new ones, each sees its valid predecessors and itself
            allowed = (past_valid[:, None, :] & new[None]) | torch.eye(
                q, dtype=torch.bool, device=self.device
            )
        mask = torch.zeros(allowed.shape, dtype=self.mask_dtype, device=self.device)
        mask.masked_fill_(~allowed, torch.finfo(self.mask_dtype).min)
        out = self.model(
            input_ids=ids,
            attention_mask=mask[:, None],
            position_ids=positions,
            use_cache=True,
            output_hidden_states=hidden,
            **{self._cache_kw: self.cache},
        )
        self.cache = out[self._cache_kw]
        logits = out.logits
        if self.vocab_size is not None and logits.shape[-1] != self.vocab_size:
            logits = fit_vocab(logits, self.vocab_size)
        return (logits.float(), out.hidden_states) if hidden else logits.float()


def _layers(cache):
    layers = getattr(cache, "layers", None)
    if layers is None:  # transformers 4.x: key_cache / value_cache lists, wrapped to the 5.x shape
        return [_LegacyLayer(cache, i) for i in range(len(cache.key_cache))]
    if any(hasattr(layer, "cumulative_length") for layer in layers):
        raise SpecbenchError(
            "batched decoding needs a full KV cache, and this model keeps a sliding window",
            "decode this target with decoding.batch_size=1",
        )
    return layers


class _LegacyLayer:
    """One layer of a transformers 4.x ``DynamicCache`` with 5.x's ``keys`` / ``values`` attributes."""

    def __init__(self, cache, i: int):
        self.cache, self.i = cache, i

    @property
    def keys(self):
        return self.cache.key_cache[self.i]

    @keys.setter
    def keys(self, x):
        self.cache.key_cache[self.i] = x

    @property
    def values(self):
        return self.cache.value_cache[self.i]

    @values.setter
    def values(self, x):
        self.cache.value_cache[self.i] = x
