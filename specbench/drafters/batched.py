"""Model drafters and draft heads over rows: one drafter forward for every row of a batch that drafts with it.

A model drafter's ``cohort`` (``drafters/base.py``) is one ``ModelRows`` for a call of the loop, and each row's view of
it a ``ModelRow``: the drafter's model with one batched KV cache (``models/batched.py``: each row at its own
positions, rows of different lengths in one forward), which a row joins at its first draft, admissions included.
Each round every row that drafts with it hands in its committed tokens; the cache of each row is first cut back to
its longest prefix that is still committed (``BatchedLM.rewind``: a rejected draft's slots leave it), then one
forward feeds every row the committed tokens it has not seen, and then one forward per draft position feeds each row
its last draft token, until every row has drafted its ``k`` tokens or stopped (EOS, its confidence threshold). Rows
that draft with another drafter this round feed nothing (their slots of the forward are padding, masked). So a row
drafts exactly what the drafter drafts for it alone (the same tokens and distributions, to the rounding of a
batched matrix product), and ``ModelRow.propose`` drafts one row the same way.

Chains of decoder-only drafters only: a dynamic draft tree or an encoder-decoder drafter is refused when the cohort is
made, before any forward. A finished row (``finish``) leaves the cache at the next draft. This module knows the
drafter kinds only through the protocol (``decoding/drafter.py``) and what their ``cohort`` hands it: the kinds import
it, never the other way.

A draft head does the same over its own stack (``HeadRows``, from the eagle kind's ``cohort``): its cache holds pairs
``(f_t, x_{t+1})`` of the row's target features and tokens, so each row is fed its own query's recorded target
states, and its draft steps feed predicted features instead of tokens (``BatchedLM.feed``).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from specbench.decoding.drafter import Cohort, Draft, Drafter, DraftSteps
from specbench.decoding.sampling import SamplingParams, logits_to_probs
from specbench.errors import SpecbenchError
from specbench.models.batched import BatchedLM
from specbench.models.cache import common_prefix


class SharedRows(Cohort):
    """A drafter drafting for the rows of one call of the loop with one batched cache (``lm``), a view a row
    (``view``): a view joins the cache at its first draft and leaves it at the draft after its row finished, so
    admissions share the one cache too."""

    lm: BatchedLM

    def __init__(self, drafter: Drafter):
        super().__init__(drafter)
        self.live: list = []  # the views in the cache's row order

    def _rows(self, views) -> dict[int, int]:
        """Finished views leave the cache, ``views`` not in it join it; each live view's cache row."""
        if any(v.done for v in self.live):
            keep = [r for r, v in enumerate(self.live) if not v.done]
            self.lm.drop(keep)
            self.live = [self.live[r] for r in keep]
        at = {id(v) for v in self.live}
        joining = [v for v in dict.fromkeys(views) if id(v) not in at]
        if joining:
            self._admit(joining)
            self.live += joining
        return {id(v): r for r, v in enumerate(self.live)}

    def _admit(self, views: list) -> None:
        raise NotImplementedError

    @torch.inference_mode()
    def propose(
        self,
        views: Sequence[Drafter],
        tokens: Sequence[list[int]],
        ks: Sequence[int],
        sampling: SamplingParams,
        rng: torch.Generator,
        eos_ids: frozenset[int] = frozenset(),
    ) -> list[Draft]:
        """Each of ``views``' draft of up to ``ks[i]`` tokens after its committed ``tokens[i]``, in one forward a
        draft position for all of them."""
        return self._propose(views, tokens, ks, sampling, rng, eos_ids)

    def _propose(self, views, tokens, ks, sampling: SamplingParams, rng, eos_ids) -> list[Draft]:
        raise NotImplementedError


class ModelRows(SharedRows):
    """``drafter``'s model drafting for the rows of one call of the loop (a ``ModelRow`` view a row)."""

    def __init__(self, drafter: Drafter):
        name = drafter.name
        _chains_only(drafter)
        if drafter.lm.is_encoder_decoder:
            raise SpecbenchError(
                f"drafter '{name}' ({type(drafter).__name__}) is encoder-decoder: batched drafting takes "
                "decoder-only drafters",
                f"drop '{name}' from the batched methods, or decode with decoding.batch_size=1",
            )
        super().__init__(drafter)
        self.lm = BatchedLM(drafter.lm.model, drafter.lm.vocab_size)

    def view(self, prompt: list[int]) -> ModelRow:
        return ModelRow(self.drafter, self, list(prompt))

    def _admit(self, views: list[ModelRow]) -> None:
        """Each joining row's prompt but its last token cached (its first draft feeds it)."""
        self.lm.admit([v.prompt for v in views])

    def _propose(self, views, tokens, ks, sampling: SamplingParams, rng, eos_ids) -> list[Draft]:
        """Each view's draft (the module's docstring)."""
        at = self._rows(views)
        inputs: list[list[int]] = [[] for _ in self.live]
        lengths = self.lm.lengths
        for v, toks in zip(views, tokens):
            r = at[id(v)]
            match = min(
                common_prefix(v.seen, toks), len(toks) - 1
            )  # at least the last committed token is fed
            lengths[r], v.seen = match, v.seen[:match]
            inputs[r] = list(toks[match:])
        self.lm.rewind(lengths)
        made = {id(v): DraftSteps() for v in views}
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
                steps = made[id(v)]
                tok = steps.pick(last, logits_to_probs(last, sampling), sampling, rng)
                if not steps.ends(k_of[id(v)], eos_ids, threshold):
                    inputs[r] = [tok]
        return [made[id(v)].draft() for v in views]


class HeadRows(SharedRows):
    """A draft head (``drafters/eagle``) drafting for the rows of one call of the loop: one head forward a position
    for every row that drafts with it, over one batched cache of the head's stack (``BatchedLM.feed``), each row fed
    its own target states (its query's, which the loop records every round). Each round a row's cache is cut back to
    its pairs ``(f_t, x_{t+1})`` still committed, one forward feeds every row the committed pairs it has not seen,
    then each further forward feeds each row its last predicted feature and draft token, and one product of the LM
    head scores every row's next token; so a row drafts what the head drafts for it alone (``the head's own propose``),
    to the rounding of a batched product. A row joins with an empty cache (a head has no pair before the first
    committed feature)."""

    def __init__(self, drafter: Drafter):
        _chains_only(drafter)
        super().__init__(drafter)
        self.lm = BatchedLM(drafter.head.stack)

    def view(self, prompt: list[int]) -> HeadRow:
        return HeadRow(self.drafter, self)

    def _admit(self, views: list[HeadRow]) -> None:
        self.lm.admit([[0]] * len(views))  # one-token sequences: nothing cached

    def _propose(self, views, tokens, ks, sampling: SamplingParams, rng, eos_ids) -> list[Draft]:
        """Each view's draft (the class's docstring); each view synced with its row's query first (``Drafter.sync``)."""
        at, head = self._rows(views), self.drafter
        lengths, fed = self.lm.lengths, {}
        for v, toks in zip(views, tokens):
            n = len(toks)
            if n < 2:  # no committed feature yet: nothing to draft from, as alone
                continue
            keep = head.pairs_kept(v.real, toks)
            lengths[at[id(v)]] = keep
            del v.real[keep:]
            fed[at[id(v)]] = (head.features(v._query, keep, n - 1), list(toks[keep + 1 : n]))
            v.real.extend(toks[keep + 1 : n])
        self.lm.rewind(lengths)
        hats = self._feed(fed)
        made = {id(v): DraftSteps() for v in views}
        going = [(v, k) for v, k in zip(views, ks) if k > 0 and at[id(v)] in hats]
        while going:
            subs = head.logits(torch.stack([hats[at[id(v)]] for v, _ in going]))
            fed = {}
            for (v, k), sub in zip(going, subs):
                steps = made[id(v)]
                probs = head.logits.to_full(logits_to_probs(sub, sampling), 0.0)
                tok = steps.pick(head.logits.to_full(sub, float("-inf")), probs, sampling, rng)
                if not steps.ends(k, eos_ids, head.confidence_threshold):
                    fed[at[id(v)]] = (hats[at[id(v)]][None], [tok])
            hats = self._feed(fed)
            going = [(v, k) for v, k in going if at[id(v)] in fed]
        return [made[id(v)].draft() for v in views]

    def _feed(self, fed: dict[int, tuple[torch.Tensor, list[int]]]) -> dict[int, torch.Tensor]:
        """One forward of the head's stack over each cache row's ``(features [m, H], tokens [m])`` pairs (rows not in
        ``fed`` feed nothing), the pairs kept; each fed row's last predicted feature."""
        if not fed:
            return {}
        q = max(len(t) for _, t in fed.values())
        first = next(iter(fed.values()))[0]
        features = first.new_zeros(self.lm.rows, q, first.shape[-1])
        ids = torch.zeros(self.lm.rows, q, dtype=torch.long, device=first.device)
        for r, (f, t) in fed.items():
            features[r, : len(t)] = f
            ids[r, : len(t)] = torch.tensor(t, device=first.device)
        head = self.drafter
        out = self.lm.feed(head.head.inputs(features, head.embed(ids)))
        self.lm.keep([len(fed[r][1]) if r in fed else 0 for r in range(self.lm.rows)])
        return {r: out[r, len(t) - 1] for r, (_, t) in fed.items()}


class HeadRow(Drafter):
    """One row's view of a ``HeadRows``: the head's settings, the tokens ``x_{t+1}`` of the committed pairs the
    shared cache holds for the row (``real``), and ``shared_rows``, which the batch asks for every row at once."""

    def __init__(self, drafter: Drafter, rows: HeadRows):
        self.name = drafter.name
        self.cost = drafter.cost
        self.draft_length = drafter.draft_length
        self.history_free = drafter.history_free
        self.scored = drafter.scored
        self.shared_rows = rows
        self.layers = drafter.state_layers(False)
        self.real: list[int] = []
        self.done = False

    def state_layers(self, side_observations: bool) -> tuple[int, ...]:
        return self.layers

    def propose(self, tokens, k, sampling, rng, eos_ids=frozenset(), stop_below=0.0) -> Draft:
        return self.shared_rows.propose([self], [list(tokens)], [k], sampling, rng, eos_ids)[0]

    def finish(self) -> None:
        self.done = True


def _chains_only(drafter) -> None:
    """Refuse a drafter that drafts dynamic trees: a batch verifies one chain a row."""
    if drafter.tree is not None:
        raise SpecbenchError(
            f"drafter '{drafter.name}' drafts a dynamic tree, and a batch verifies one chain a row",
            f"set pool.drafters.{drafter.name}.tree=null (a chain) to decode in batches, or decoding.batch_size=1",
        )


class ModelRow(Drafter):
    """One row's view of a ``ModelRows``: the drafter's settings, the tokens the shared cache holds for the row
    (``seen``), and ``shared_rows``, which the batch asks for every row of this drafter at once."""

    def __init__(self, drafter: Drafter, rows: ModelRows, prompt: list[int]):
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


__all__ = ["HeadRow", "HeadRows", "ModelRow", "ModelRows"]
