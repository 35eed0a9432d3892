"""Several sequences in one KV cache: a decoder-only model advanced one forward for every row at once.

The cache is a ``FrontierCache`` (``models/frontier.py``): one preallocated buffer a layer, ``[rows, kv heads, slots,
head dim]``, each row left-aligned (slot ``s`` holds position ``s``) with its own length. A forward appends each
row's input (its last committed token, then its draft: the longest row's count, shorter rows padded at the end) in
place at the row's own frontier, each token at the row's next positions (``position_ids`` per row), and a 4D mask
lets each row see its own slots only (its committed ones, and the new ones before it, or a tree row's ancestors). A
row then keeps what its verdict accepts (``keep_slots``: its last committed token and accepted draft, a tree's path
moved into place); the rest is overwritten by the next forward, so nothing is ever cropped, concatenated or
compacted. A row that finishes leaves the batch (``drop``); a new one joins it (``admit``: continuous batching) and is
prefilled alone, in a window of the cache, as it would be decoded alone. Logits are computed only at the rows' real
positions where the model's head is its output embedding (``head_split``).

Each row computes what it would alone, to the rounding of a batched matrix product; ``check_rows`` verifies, before a
model family's first batch, that it honours per-row positions and the 4D mask (two prompts of different lengths
scored together against each alone) and refuses it by name otherwise.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from specbench.errors import SpecbenchError
from specbench.models import frontier
from specbench.models.attention import pack
from specbench.models.cache import cache_argument, check_tree_attention, fit_vocab, keep_argument
from specbench.models.target import check_pooling, pool_states


@dataclass(frozen=True)
class Started:
    """What ``BatchedLM.admit`` read off the new rows' prefills: each row's prompt embedding (with a pooling) and each
    row's ``{layer: [cached positions, H]}`` states (with layers); None where not asked for."""

    embeddings: list[torch.Tensor] | None
    states: list[dict[int, torch.Tensor]] | None


PAD = 0  # the id fed at padded positions (never attended by a real position: any id will do)


class BatchedLM:
    """``model`` (decoder-only) with one cache for its rows; ``vocab_size`` trims padded logit rows."""

    def __init__(self, model: torch.nn.Module, vocab_size: int | None = None):
        if getattr(model.config, "is_encoder_decoder", False):
            raise SpecbenchError(
                f"batched decoding needs a decoder-only target; {type(model).__name__} is encoder-decoder",
                "decode this target with decoding.batch_size=1 (one query at a time)",
            )
        check_tree_attention(model, "batched decoding")
        if not frontier.supported(model):
            raise SpecbenchError(
                f"batched decoding keeps every row's positions in one cache written in place, which "
                f"{type(model).__name__} cannot use here (a sliding-window cache, or a transformers without cache "
                "layers)",
                "decode this target with decoding.batch_size=1, or upgrade transformers to 5.x",
            )
        pack(model)
        self.model = model
        self.vocab_size = vocab_size
        self.device = next(model.parameters()).device
        dtype = next(model.parameters()).dtype
        self.mask_dtype = dtype if dtype.is_floating_point else torch.float32
        self._cache_kw = cache_argument(model)
        self._keep_kw = keep_argument(model)
        self.cache = frontier.FrontierCache(0)
        self._base: list[int] = []  # each row's length before the last ``score`` or ``feed``
        self._pending = 0  # slots the last ``score`` appended, before ``keep``
        self.last_states: dict[
            int, torch.Tensor
        ] = {}  # the last ``score``'s states for the layers it was asked
        self.forwards = 0
        self._split: tuple | None | bool = (
            False  # ``head_split``'s answer, probed at the first scoring forward
        )

    @property
    def rows(self) -> int:
        return self.cache.rows

    @property
    def lengths(self) -> list[int]:
        """Each row's cached positions."""
        return list(self.cache.lengths)

    @torch.inference_mode()
    def start(
        self, sequences: list[list[int]], pooling: str | None = None, layers: tuple[int, ...] = ()
    ) -> Started:
        """A new batch of ``sequences`` (``admit`` into an empty cache)."""
        self.cache = frontier.FrontierCache(0)
        self._pending = 0
        self.last_states = {}
        return self.admit(sequences, pooling, layers)

    @torch.inference_mode()
    def admit(
        self, sequences: list[list[int]], pooling: str | None = None, layers: tuple[int, ...] = ()
    ) -> Started:
        """New rows join the batch (last, in ``sequences``' order), each prefilled alone: every token but its last
        cached (the first ``score`` feeds it). With ``pooling``, each row's prompt embedding too (``Target.prefill``'s,
        read off the same forward: every token is fed, then the last one's slot is given back); with ``layers``, each
        row's states at its cached positions (``Target.prefill``'s ``states``)."""
        if self._pending:
            raise RuntimeError("admit called between score and keep")
        if any(len(s) < 1 for s in sequences):
            raise ValueError("every sequence needs at least one token")
        check_pooling(pooling)
        width = int(getattr(self.model.config, "hidden_size", 0) or 0)
        none = torch.zeros(0, width, device=self.device)
        pooled: list = []
        states: list[dict[int, torch.Tensor]] = []
        for row, seq in zip(self.cache.add_rows(len(sequences)), sequences):
            fed = list(seq) if pooling else list(seq[:-1])
            hidden = None
            if fed:
                with self.cache.window(row, row + 1):
                    out, _ = self._forward(
                        {"input_ids": torch.tensor([fed], device=self.device)},
                        torch.arange(len(fed), device=self.device)[None],
                        None,
                        hidden=bool(pooling or layers),
                    )
                    self.cache.advance(len(fed))
                hidden = out.hidden_states if (pooling or layers) else None
            if pooling:
                pooled.append(pool_states(hidden[-1][0], pooling))
                self.cache.set_length(row, len(seq) - 1)
            states.append(
                {
                    int(layer): (hidden[layer][0, : len(seq) - 1] if hidden is not None else none)
                    for layer in layers
                }
            )
        return Started(pooled if pooling else None, states if layers else None)

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
        offsets = torch.arange(q, device=self.device).repeat(self.rows, 1)
        new = torch.ones(q, q, dtype=torch.bool, device=self.device).tril().repeat(self.rows, 1, 1)
        for r, tree in enumerate(trees or ()):
            if tree is not None:
                attention, depths = tree
                m = len(depths)
                new[r, :m, :m] = attention.to(self.device)
                offsets[r, :m] = torch.tensor(depths, device=self.device)
        real = [len(x) for x in inputs]
        out, logits = self._forward({"input_ids": ids}, offsets, new, hidden=bool(layers), real=real)
        self.last_states = {int(layer): out.hidden_states[layer] for layer in layers}
        return logits

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
        offsets = torch.arange(q, device=self.device).repeat(self.rows, 1)
        new = torch.ones(q, q, dtype=torch.bool, device=self.device).tril().repeat(self.rows, 1, 1)
        return self._forward({"inputs_embeds": embeds}, offsets, new)[0].last_hidden_state

    @torch.inference_mode()
    def keep(self, lengths: list[int]) -> None:
        """Of the slots the last ``score`` appended, row ``r`` keeps its first ``lengths[r]`` (its last committed token
        and its accepted draft tokens)."""
        self.keep_slots([range(k) for k in lengths])

    @torch.inference_mode()
    def keep_slots(self, kept: list) -> None:
        """Of the slots the last ``score`` appended, row ``r`` keeps those at the offsets ``kept[r]`` (increasing; a
        tree row: its root and its accepted path's nodes, ``TokenTree.rows``, moved into place); the rest are free."""
        if len(kept) != self.rows:
            raise ValueError(f"{len(kept)} rows kept of {self.rows}")
        for r, offsets in enumerate(kept):
            offsets = list(offsets)
            if any(not 0 <= k < self._pending for k in offsets) or offsets != sorted(set(offsets)):
                raise ValueError(f"row {r} keeps new slots {offsets} of {self._pending}")
            self.cache.keep(r, self._base[r], offsets)
        self._pending = 0

    def rewind(self, lengths: list[int]) -> None:
        """Row ``r`` keeps only its first ``lengths[r]`` slots (at most what it has): a drafter's cache cut back to the
        committed prefix after its draft was verified (``drafters/batched.py``)."""
        if self._pending:
            raise RuntimeError("rewind called between score and keep")
        if len(lengths) != self.rows:
            raise ValueError(f"rewind to {lengths}: one length a row ({self.rows} rows)")
        for r, n in enumerate(lengths):
            self.cache.set_length(r, int(n))

    def drop(self, keep_rows: list[int]) -> None:
        """Keep only the rows ``keep_rows`` (increasing): finished rows leave the batch, the others move up."""
        if self._pending:
            raise RuntimeError("drop called between score and keep")
        self.cache.drop(list(keep_rows))

    def _forward(
        self, inputs: dict, offsets: torch.Tensor, new: torch.Tensor | None, hidden=False, real=None
    ):
        """Append ``inputs`` (``input_ids`` ``[rows, q]`` or ``inputs_embeds`` ``[rows, q, H]``) at each covered row's
        frontier plus ``offsets`` ``[rows, q]``; each new slot sees the row's cached slots and the new slots ``new``
        ``[rows, q, q]`` allows (None: the causal mask transformers builds, for a prefill in a window of its own).
        ``(the model's output, logits)``: with ``real`` (each row's real inputs) float32 ``[rows, q, V]``, computed
        only at real positions where the head splits off (``head_split``; the padded ones are zero); a prefill (no
        ``new``) computes none it can skip (None)."""
        base = torch.tensor(self.cache.frontier.covered(), device=self.device)
        q = offsets.shape[1]
        kwargs = {self._cache_kw: self.cache, "use_cache": True, "position_ids": base[:, None] + offsets}
        if new is not None:
            kwargs["attention_mask"] = self._mask(base, new)
        elif self._keep_kw:  # a prefill scores nothing: the head runs at its last position only
            kwargs[self._keep_kw] = 1
        if hidden:
            kwargs["output_hidden_states"] = True
        if real is not None and self._split is False:
            self._split = head_split(self.model)
        split = self._split if real is not None else None
        if split is not None:
            body, head = split
            out = body(**inputs, **kwargs)
            logits = self._head(head, out.last_hidden_state, real)
        else:
            out = self.model(**inputs, **kwargs)
            logits = getattr(out, "logits", None)
        self.forwards += 1
        if new is not None:  # a prefill (no mask) is advanced by its caller, who knows what it keeps
            self._base = self.cache.frontier.covered()
            self.cache.advance(q)
            self._pending = q
        if logits is not None and real is not None:
            if self.vocab_size is not None and logits.shape[-1] != self.vocab_size:
                logits = fit_vocab(logits, self.vocab_size)
            return out, logits.float()
        return out, None

    def _mask(self, base: torch.Tensor, new: torch.Tensor) -> torch.Tensor:
        """The additive 4D mask ``[rows, 1, q, max(base) + q]``: row ``r``'s new position ``i`` sees its slots below
        ``base[r]`` and, among its new slots ``base[r] + j``, those ``new[r, i, j]`` allows."""
        rows, q = new.shape[0], new.shape[1]
        slots = int(base.max()) + q if rows else q
        s = torch.arange(slots, device=self.device)[None, None, :]
        j = s - base[:, None, None]  # [rows, 1, slots]: the slot's offset among the row's new ones
        inside = (j >= 0) & (j < q)
        allowed = (j < 0) | (new.gather(2, j.clamp(0, q - 1).expand(rows, q, slots)) & inside)
        mask = torch.zeros(allowed.shape, dtype=self.mask_dtype, device=self.device)
        mask.masked_fill_(~allowed, torch.finfo(self.mask_dtype).min)
        return mask[:, None]

    def _head(self, head: torch.nn.Module, states: torch.Tensor, real: list[int]) -> torch.Tensor:
        """The LM head at each row's first ``real[r]`` positions only: ``[rows, q, V]``, zero elsewhere."""
        rows, q = states.shape[0], states.shape[1]
        if all(n == q for n in real):
            return head(states)
        at = torch.zeros(rows, q, dtype=torch.bool, device=states.device)
        for r, n in enumerate(real):
            at[r, :n] = True
        picked = head(states[at])
        logits = picked.new_zeros(rows, q, picked.shape[-1])
        logits[at] = picked
        return logits

    @torch.inference_mode()
    def check_rows(self) -> None:
        """Refuse a model family that does not honour per-row positions and the 4D mask: two prompts of different
        lengths, scored together, must give what each gives alone (to the rounding of the model's dtype)."""
        key = type(self.model).__name__
        ids = list(range(5, 5 + 11))
        prompts, draft = [ids[:9], ids[2:6]], [[ids[9], ids[10]], [ids[6], ids[7], ids[8]]]
        alone = []
        for p, d in zip(prompts, draft):
            lm = BatchedLM(self.model, self.vocab_size)
            lm.start([p])
            alone.append(lm.score([[p[-1], *d]])[0, : len(d) + 1])
        lm = BatchedLM(self.model, self.vocab_size)
        lm.start(prompts)
        together = lm.score([[p[-1], *d] for p, d in zip(prompts, draft)])
        dtype = next(self.model.parameters()).dtype
        tolerance = 1e-3 if dtype in (torch.float32, torch.float64) else 1.5
        gap = max(float((together[r, : a.shape[0]] - a).abs().max()) for r, a in enumerate(alone))
        if not gap <= tolerance:
            raise SpecbenchError(
                f"{key} does not honour per-row positions and a 4D attention mask in a batch: two prompts of "
                f"different lengths scored together differ from each alone by {gap:.3g} logits (at most "
                f"{tolerance:g} in {str(dtype).removeprefix('torch.')})",
                "decode this model with decoding.batch_size=1",
            )


@torch.inference_mode()
def head_split(model: torch.nn.Module):
    """``(body, head)`` where the model's logits are ``head(body(...).last_hidden_state)`` exactly (checked on a short
    probe: a family that scales or caps its logits keeps its own forward, said once), else None."""
    body, head = getattr(model, "base_model", None), model.get_output_embeddings()
    if body is None or body is model or head is None or cache_argument(body) != cache_argument(model):
        return None
    ids = torch.tensor([[3, 1, 4, 1, 5]], device=next(model.parameters()).device)
    whole = model(input_ids=ids, use_cache=False).logits
    parts = head(body(input_ids=ids, use_cache=False).last_hidden_state)
    if whole.shape != parts.shape or not torch.equal(whole, parts):
        frontier.said(
            f"batched forwards: {type(model).__name__}'s logits are not its head's product alone, so padded "
            "positions get logits too"
        )
        return None
    return body, head


__all__ = ["PAD", "BatchedLM", "Started", "head_split"]
