"""Several sequences in one KV cache: a decoder-only model advanced one forward for every row at once (issue 57).

The cache is one tensor per layer, ``[rows, heads, slots, dim]``, with a validity mask ``valid`` ``[rows, slots]``:
row ``r`` attends exactly its valid slots, and each token sits at its own position in its row (``position_ids``
per row), so rows of different prompt lengths (left padding) and different accepted lengths share a forward. A
round appends the same number of slots to every row (the longest input, shorter ones padded at the end, which no
earlier position attends); ``keep`` then marks which of them each row keeps (its last committed token and its
accepted draft), so nothing is cropped: a rejected draft's slots stay in the tensor, masked, until ``compact`` moves
every row's valid slots together (gpt-fast keeps a static cache the same way, writing by position and masking stale
slots). A row that finishes leaves the batch (``drop``). The prefill runs rows of similar prompt lengths together
(``prefill_groups``) and lays their caches side by side, so a short question beside a long document is not padded to
the document's length in the prefill's forward. Each row computes what it would alone, to the rounding of a
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
PREFILL_WASTE = 0.25  # the most of a prefill group's slots that may be padding (``prefill_groups``)


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
        each row's states at its cached positions (``Target.prefill``'s ``states``).

        Rows of similar lengths are prefilled together (``prefill_groups``: at most ``PREFILL_WASTE`` of a group's
        slots padding), then their caches are laid side by side, left-padded to the longest: a batch of short
        questions and long documents does not pay the longest prompt's forward for every row."""
        if any(len(s) < 1 for s in sequences):
            raise ValueError("every sequence needs at least one token")
        check_pooling(pooling)
        heads = [list(s) if pooling else list(s[:-1]) for s in sequences]
        width, rows = max((len(h) for h in heads), default=0), len(sequences)
        self.valid = torch.zeros(rows, width, dtype=torch.bool, device=self.device)
        for r, h in enumerate(heads):
            self.valid[r, width - len(h) :] = True
        self.n = torch.tensor([len(h) for h in heads], dtype=torch.long, device=self.device)
        self._pending = 0
        self.last_states = {}
        none = torch.zeros(0, int(self.model.config.hidden_size), device=self.device)
        pooled: list = [None] * rows
        states = [
            {int(layer): none for layer in layers} for _ in range(rows)
        ]  # a row with nothing cached: none
        if width == 0:  # every prompt one token (no pooling: it feeds them all): nothing cached
            self.cache = DynamicCache()
            return Started(None, states if layers else None)
        caches = []
        for group in prefill_groups([len(h) for h in heads], PREFILL_WASTE):
            hidden = self._prefill([heads[r] for r in group], bool(pooling or layers))
            caches.append((group, self.cache))
            for j, r in enumerate(group):
                if hidden is None:
                    continue
                mine = [
                    x[j, x.shape[1] - len(heads[r]) :] for x in hidden
                ]  # every layer at the row's own slots
                if pooling:
                    pooled[r] = pool_states(mine[-1], pooling)
                if layers:
                    states[r] = {int(layer): mine[layer][: len(sequences[r]) - 1] for layer in layers}
        self.cache = _side_by_side(caches, rows, width)
        if pooling:
            self.rewind([len(h) - 1 for h in heads])
        return Started(pooled if pooling else None, states if layers else None)

    @torch.inference_mode()
    def admit(
        self, sequences: list[list[int]], pooling: str | None = None, layers: tuple[int, ...] = ()
    ) -> Started:
        """New rows join the batch between rounds (continuous batching: a finished row's place goes to a waiting
        query): they are prefilled as ``start`` prefills a batch, in a cache of their own, which is then laid below
        the batch's rows, the narrower of the two left-padded with masked slots. The new rows come last, in
        ``sequences``' order; what ``start`` reads off their prefill is returned."""
        if self._pending:
            raise RuntimeError("admit called between score and keep")
        joining = BatchedLM(self.model, self.vocab_size)
        started = joining.start(sequences, pooling, layers)
        if not self.rows:
            self.cache, self.valid, self.n = joining.cache, joining.valid, joining.n
            return started
        width = max(self.slots, joining.slots)
        ours, theirs = _layers(self.cache), _layers(joining.cache)
        merged = self.cache if _cached(ours) else joining.cache  # the layers that give the shapes
        for i, layer in enumerate(_layers(merged)):
            mine = _left_padded(ours[i] if i < len(ours) else None, self.rows, width, layer)
            new = _left_padded(theirs[i] if i < len(theirs) else None, joining.rows, width, layer)
            layer.keys, layer.values = torch.cat([mine[0], new[0]]), torch.cat([mine[1], new[1]])
        self.cache = merged
        self.valid = torch.cat([_pad_left(self.valid, width), _pad_left(joining.valid, width)])
        self.n = torch.cat([self.n, joining.n])
        return started

    def _prefill(self, heads: list[list[int]], hidden: bool):
        """One forward over ``heads`` (left-padded to the longest) into a fresh cache (``self.cache``): every layer's
        hidden states ``[rows, width, H]`` with ``hidden``, else None."""
        width = max(len(h) for h in heads)
        valid = torch.zeros(len(heads), width, dtype=torch.bool, device=self.device)
        for r, h in enumerate(heads):
            valid[r, width - len(h) :] = True
        ids = torch.tensor([[PAD] * (width - len(h)) + h for h in heads], device=self.device)
        positions = (valid.long().cumsum(dim=1) - 1).clamp(min=0)
        self.cache = DynamicCache()
        out = self._forward({"input_ids": ids}, positions, valid, past=None, hidden=hidden)
        return out.hidden_states if hidden else None

    @torch.inference_mode()
    def score(
        self, inputs: list[list[int]], layers: tuple[int, ...] = (), trees: list | None = None
    ) -> torch.Tensor:
        """One forward over each row's ``inputs`` (its last committed token, then its draft): float32 logits
        ``[rows, q, V]`` (``q`` the longest input; a shorter row's extra rows are padding, to be ignored). With
        ``layers``, ``last_states`` holds ``{layer: [rows, q, H]}``, the residual stream after that many layers at
        the same positions (``Target.score``'s ``states``). ``trees[r]``, when given and not None: row ``r``'s input
        is a token tree's root and nodes (``decoding/tree.py``), given as ``(attention, depths)``: its ``[n, n]``
        mask (``tree_attention``) and each input's depth (``tree_positions``); each node then sees the row's
        cache, the root, its ancestors and itself, at the row's next position plus its depth."""
        if len(inputs) != self.rows:
            raise ValueError(f"{len(inputs)} inputs for {self.rows} rows")
        if self._pending:
            raise RuntimeError("score called twice without keep")
        q = max(len(x) for x in inputs)
        ids = torch.tensor([list(x) + [PAD] * (q - len(x)) for x in inputs], device=self.device)
        positions = self.n[:, None] + torch.arange(q, device=self.device)[None]
        new = None
        if trees is not None and any(t is not None for t in trees):
            new = torch.ones(q, q, dtype=torch.bool, device=self.device).tril().repeat(self.rows, 1, 1)
            for r, tree in enumerate(trees):
                if tree is not None:
                    attention, depths = tree
                    m = len(depths)
                    new[r, :m, :m] = attention.to(self.device)
                    positions[r, :m] = self.n[r] + torch.tensor(depths, device=self.device)
        out = self._forward(
            {"input_ids": ids}, positions, self.valid, self.slots, hidden=bool(layers), new=new
        )
        self.last_states = {int(layer): out.hidden_states[layer] for layer in layers}
        self._append(q)
        logits = out.logits
        if self.vocab_size is not None and logits.shape[-1] != self.vocab_size:
            logits = fit_vocab(logits, self.vocab_size)
        return logits.float()

    @torch.inference_mode()
    def feed(self, embeds: torch.Tensor) -> torch.Tensor:
        """``score`` for a model without an LM head fed ``inputs_embeds`` (a draft head's stack,
        ``drafters/batched.py``): one forward over each row's ``embeds`` ``[rows, q, H]`` (a shorter row padded at
        the end), each at the row's next positions; the last hidden states ``[rows, q, H]``, in the model's dtype.
        ``keep`` follows, as after ``score``."""
        if embeds.shape[0] != self.rows:
            raise ValueError(f"{embeds.shape[0]} inputs for {self.rows} rows")
        if self._pending:
            raise RuntimeError("feed called twice without keep")
        q = int(embeds.shape[1])
        positions = self.n[:, None] + torch.arange(q, device=self.device)[None]
        out = self._forward({"inputs_embeds": embeds}, positions, self.valid, self.slots)
        self._append(q)
        return out.last_hidden_state

    def _append(self, q: int) -> None:
        """The last forward appended ``q`` slots to every row, masked until ``keep``."""
        self.valid = torch.cat(
            [self.valid, torch.zeros(self.rows, q, dtype=torch.bool, device=self.device)], 1
        )
        self._pending = q

    @torch.inference_mode()
    def keep(self, lengths: list[int]) -> None:
        """Of the slots the last ``score`` appended, row ``r`` keeps its first ``lengths[r]`` (its last committed token
        and its accepted draft tokens); the rest stay masked."""
        for r, k in enumerate(lengths):
            if not 0 <= k <= self._pending:
                raise ValueError(f"row {r} keeps {k} of {self._pending} new slots")
        self.keep_slots([range(k) for k in lengths])

    @torch.inference_mode()
    def keep_slots(self, kept: list) -> None:
        """Of the slots the last ``score`` appended, row ``r`` keeps those at the offsets ``kept[r]`` (a tree row: its
        root and its accepted path's nodes, ``TokenTree.rows``); the rest stay masked."""
        start = self.slots - self._pending
        for r, offsets in enumerate(kept):
            offsets = list(offsets)
            if any(not 0 <= k < self._pending for k in offsets):
                raise ValueError(f"row {r} keeps new slots {offsets} of {self._pending}")
            self.valid[r, [start + k for k in offsets]] = True
        self.n += torch.tensor([len(list(k)) for k in kept], dtype=torch.long, device=self.device)
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
        self,
        inputs: dict,
        positions: torch.Tensor,
        past_valid: torch.Tensor,
        past: int | None,
        hidden=False,
        new: torch.Tensor | None = None,
    ):
        """Append ``inputs`` (``input_ids`` ``[rows, q]`` or ``inputs_embeds`` ``[rows, q, H]``) at ``positions``
        after the cache's ``past`` slots; each new slot sees the row's valid past slots, the new slots before it (or,
        given ``new`` ``[rows, q, q]``, those it allows: a tree row's ancestors), and itself. ``past`` None: the
        prefill, whose ``past_valid`` are the new slots'. The model's output (with ``hidden``, every layer's hidden
        states: ``[0]`` the embeddings, ``[-1]`` the final states)."""
        rows, q = positions.shape
        if new is None:
            new = torch.ones(q, q, dtype=torch.bool, device=self.device).tril()
        if past is not None:
            allowed = torch.cat([past_valid[:, None, :].expand(rows, q, past), new.expand(rows, q, q)], dim=2)
        else:  # the prefill: the prompt's slots are the new ones, each sees its valid predecessors and itself
            allowed = (past_valid[:, None, :] & new[None]) | torch.eye(
                q, dtype=torch.bool, device=self.device
            )
        mask = torch.zeros(allowed.shape, dtype=self.mask_dtype, device=self.device)
        mask.masked_fill_(~allowed, torch.finfo(self.mask_dtype).min)
        out = self.model(
            **inputs,
            attention_mask=mask[:, None],
            position_ids=positions,
            use_cache=True,
            output_hidden_states=hidden,
            **{self._cache_kw: self.cache},
        )
        self.cache = out[self._cache_kw]
        return out


def prefill_groups(lengths: list[int], waste: float) -> list[list[int]]:
    """The rows (indices into ``lengths``) prefilled together: sorted by length, each group grown while at most
    ``waste`` of its slots (rows x its longest length) would be padding; empty rows (nothing to cache) are left out.
    ``waste`` 0 groups only equal lengths, a large one puts every row in one group."""
    groups: list[list[int]] = []
    total = 0  # the tokens of the last group
    for r in sorted((r for r, n in enumerate(lengths) if n > 0), key=lambda r: lengths[r]):
        n = lengths[r]
        grown = (len(groups[-1]) + 1) * n if groups else 0  # its slots with row r, the longest so far
        if groups and grown - (total + n) <= waste * grown:
            groups[-1].append(r)
            total += n
        else:
            groups.append([r])
            total = n
    return groups


def _side_by_side(caches: list[tuple[list[int], DynamicCache]], rows: int, width: int) -> DynamicCache:
    """One cache of ``rows`` rows and ``width`` slots from the groups' caches (``(rows of the batch, cache)``), each
    group's slots right-aligned, the slots left of them zero (masked by ``valid``); a row in no group keeps zeros."""
    merged = caches[0][1]
    for i, layer in enumerate(_layers(merged)):
        parts = [(group, _layers(cache)[i]) for group, cache in caches]
        first = parts[0][1]
        keys = first.keys.new_zeros(rows, first.keys.shape[1], width, first.keys.shape[3])
        values = first.values.new_zeros(rows, first.values.shape[1], width, first.values.shape[3])
        for group, part in parts:
            at = torch.tensor(group, dtype=torch.long, device=keys.device)
            keys[at, :, width - part.keys.shape[2] :] = part.keys
            values[at, :, width - part.values.shape[2] :] = part.values
        layer.keys, layer.values = keys, values
    return merged


def _pad_left(valid: torch.Tensor, width: int) -> torch.Tensor:
    """``valid`` ``[rows, slots]`` with masked slots added on the left up to ``width``."""
    pad = valid.new_zeros(valid.shape[0], width - valid.shape[1])
    return torch.cat([pad, valid], 1)


def _cached(layers) -> bool:
    return any(layer.keys is not None and layer.keys.numel() for layer in layers)


def _left_padded(layer, rows: int, width: int, like) -> tuple[torch.Tensor, torch.Tensor]:
    """A cache layer's keys and values with zero slots added on the left up to ``width`` (masked by ``valid``); a
    layer with nothing cached (None, or no keys: every prompt one token) is ``rows`` rows of zeros shaped ``like``'s."""
    if layer is None or not _cached([layer]):
        keys, values = (x.new_zeros(rows, x.shape[1], 0, x.shape[3]) for x in (like.keys, like.values))
    else:
        keys, values = layer.keys, layer.values
    pad = width - keys.shape[2]
    if not pad:
        return keys, values
    return tuple(
        torch.cat([x.new_zeros(x.shape[0], x.shape[1], pad, x.shape[3]), x], 2) for x in (keys, values)
    )


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
