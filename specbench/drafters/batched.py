"""A model drafter at batch (issue 57, item 2): one drafter forward for every row of a batch that drafts with it.

``ModelDrafter.for_rows`` gives each row a view (``ModelRow``) of one shared ``ModelRows``: the drafter's model with
one batched KV cache (``models/batched.py``: each row at its own positions, rows of different lengths in one forward).
Each round every row that drafts with it hands in its committed tokens; the cache of each row is first cut back to
its longest prefix that is still committed (``BatchedLM.rewind``: a rejected draft's slots leave it), then one
forward feeds every row the committed tokens it has not seen, and then one forward per draft position feeds each row
its last draft token, until every row has drafted its ``k`` tokens or stopped (EOS, its confidence threshold). Rows
that draft with another drafter this round feed nothing (their slots of the forward are padding, masked). So a row
drafts exactly what the drafter drafts for it alone (the same tokens and distributions, to the rounding of a
batched matrix product), and ``ModelRow.propose`` drafts one row the same way.

Chains of decoder-only drafters only: a dynamic draft tree or an encoder-decoder drafter is refused when the rows
are made, before any forward. The cache starts, at the first draft, with every row that has not finished
(their prompts); a finished row (``finish``) leaves it at the next draft.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import torch

from specbench.decoding.drafter import Draft, Drafter, draft_ends
from specbench.decoding.sampling import SamplingParams, logits_to_probs, pick
from specbench.errors import SpecbenchError
from specbench.models.batched import BatchedLM
from specbench.models.cache import common_prefix

if TYPE_CHECKING:
    from specbench.drafters.base import ModelDrafter


class ModelRows:
    """``drafter``'s model drafting for the rows of one batch (one view a prompt, in ``views``)."""

    def __init__(self, drafter: ModelDrafter, prompts: Sequence[list[int]]):
        name = drafter.name
        if drafter.tree is not None:
            raise SpecbenchError(
                f"drafter '{name}' drafts a dynamic tree, and a batch verifies one chain a row",
                f"set pool.drafters.{name}.tree=null (a chain) to decode in batches, or decoding.batch_size=1",
            )
        if drafter.lm.is_encoder_decoder:
            raise SpecbenchError(
                f"drafter '{name}' ({type(drafter).__name__}) is encoder-decoder: batched drafting takes "
                "decoder-only drafters",
                f"drop '{name}' from the batched methods, or decode with decoding.batch_size=1",
            )
        self.drafter = drafter
        self.lm = BatchedLM(drafter.lm.model, drafter.lm.vocab_size)
        self.views = [ModelRow(drafter, self, list(p)) for p in prompts]
        self.live: list[ModelRow] | None = None  # the views in the cache's row order, once it has started

    def _rows(self) -> dict[int, int]:
        """Start the cache with every unfinished row (its prompt but the last token), or let finished rows leave
        it; each live view's cache row."""
        if self.live is None:
            self.live = [v for v in self.views if not v.done]
            self.lm.start([v.prompt for v in self.live])
        elif any(v.done for v in self.live):
            keep = [r for r, v in enumerate(self.live) if not v.done]
            self.lm.drop(keep)
            self.live = [self.live[r] for r in keep]
        return {id(v): r for r, v in enumerate(self.live)}

    @torch.inference_mode()
    def propose(
        self,
        views: Sequence[ModelRow],
        tokens: Sequence[list[int]],
        ks: Sequence[int],
        sampling: SamplingParams,
        rng: torch.Generator,
        eos_ids: frozenset[int] = frozenset(),
    ) -> list[Draft]:
        """Each view's draft of up to ``ks[i]`` tokens after its committed ``tokens[i]`` (the module's docstring)."""
        at = self._rows()
        inputs: list[list[int]] = [[] for _ in self.live]
        lengths = self.lm.n.tolist()
        for v, toks in zip(views, tokens):
            r = at[id(v)]
            match = min(
                common_prefix(v.seen, toks), len(toks) - 1
            )  # at least the last committed token is fed
            lengths[r], v.seen = match, v.seen[:match]
            inputs[r] = list(toks[match:])
        self.lm.rewind(lengths)
        made = {id(v): ([], [], []) for v in views}
        k_of = {id(v): k for v, k in zip(views, ks)}
        threshold = self.drafter.confidence_threshold
        while any(inputs):
            logits = self.lm.score(inputs)
            self.lm.keep([len(x) for x in inputs])
            fed, inputs = inputs, [[] for _ in self.live]
            for v in views:
                r = at[id(v)]
                if not fed[r]:
                    continue
                v.seen += fed[r]
                last = logits[r, len(fed[r]) - 1]
                probs = logits_to_probs(last, sampling)
                tok = pick(last if sampling.greedy else probs, sampling, rng)
                out, rows, raw = made[id(v)]
                out.append(tok)
                rows.append(probs)
                raw.append(probs if sampling.greedy else torch.softmax(last, dim=-1))
                if not draft_ends(tok, float(probs[tok]), len(out) - 1, k_of[id(v)], eos_ids, threshold):
                    inputs[r] = [tok]
        return [_draft(*made[id(v)]) for v in views]


def _draft(tokens: list[int], rows: list[torch.Tensor], raw: list[torch.Tensor]) -> Draft:
    return Draft(tokens, torch.stack(rows) if rows else None, raw=torch.stack(raw) if raw else None)


class ModelRow(Drafter):
    """One row's view of a ``ModelRows``: the drafter's settings, the tokens the shared cache holds for the row
    (``seen``), and ``shared_rows``, which the batch asks for every row of this drafter at once."""

    def __init__(self, drafter: ModelDrafter, rows: ModelRows, prompt: list[int]):
        if not prompt:
            raise ValueError("every row needs a prompt of at least one token")
        self.name = drafter.name
        self.cost = drafter.cost
        self.draft_length = drafter.draft_length
        self.history_free = drafter.history_free
        self.shared_rows = rows
        self.prompt = prompt
        self.seen = prompt[:-1]  # what the shared cache holds for this row once it has started
        self.done = False

    def propose(self, tokens, k, sampling, rng, eos_ids=frozenset(), stop_below=0.0) -> Draft:
        return self.shared_rows.propose([self], [list(tokens)], [k], sampling, rng, eos_ids)[0]

    def finish(self) -> None:
        self.done = True


__all__ = ["ModelRow", "ModelRows"]
