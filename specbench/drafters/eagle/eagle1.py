"""``eagle``: a feature-level draft head in the EAGLE-1 layout, drafting on the target's own features.

At position t the head takes the target's last hidden state ``f_t`` and the embedding of token
``x_{t+1}`` (the target's own embedding table, frozen): ``fc([embed(x_{t+1}), f_t])`` (2H -> H,
with bias), then N decoder layers of the target's own family (the first without its input norm, as
in EAGLE-1), give a predicted feature ``f_{t+1}``; the target's own LM head (shared, frozen) turns
it into the next-token distribution. Drafting continues on its own predicted features.

- **State dict** (the published EAGLE-1 layout, so public heads load without conversion):
  ``fc.weight``, ``fc.bias``, ``layers.<i>.*`` (the family's decoder-layer keys); an
  ``embed_tokens.weight`` in the file is ignored (the target's is used). Optional ``d2t``: the draft
  sub-vocabulary (target ids of the N tokens the head scores, FR-Spec / EAGLE-3); verification
  stays against the full vocabulary, and in sampling mode ``q`` is the head's distribution placed
  in the full vocabulary (zero outside the sub-vocabulary), so decoding stays lossless.
- **Features** come from the loop (``state_layers``: the target's last layer, after its final norm
  as Hugging Face returns it, which is what EAGLE-1 reads): the prefill and every verification
  forward record them at the committed positions, so there is no second target pass and the head
  does nothing in rounds it does not play.
- **Cache**: the head's own KV cache holds one position per pair ``(f_t, x_{t+1})``; draft pairs
  (predicted features) are cropped away at the next sync, like any drafter's rollback.
- **Dtype**: the head is loaded in the target's dtype (a checkpoint's tensors are cast; heads are
  trained and saved in float32) unless the drafter config sets ``dtype``; features and embeddings
  are cast to the head's dtype on the way in, its predicted features to the LM head's on the way out.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated

import torch
from transformers import DynamicCache

from specbench.decoding.drafter import (
    DecodeContext,
    Draft,
    Drafter,
    DraftSteps,
    ObservationGroup,
    Verification,
    draft_ends,
    full_precision,
)
from specbench.decoding.sampling import logits_to_probs
from specbench.decoding.verify import block_divergence
from specbench.drafters import shipped
from specbench.drafters.base import (
    Checkpoint,
    Confidence,
    Dtype,
    MakeTarget,
    TreeDraft,
    check_confidence_threshold,
)
from specbench.drafters.batched import HeadRows
from specbench.drafters.dynamic_tree import TreeShape, frontier_attention, grow, tree_shape
from specbench.drafters.eagle.head import EagleHead, HeadLogits
from specbench.drafters.head_files import load_state, read_meta, resolve_checkpoint, vocab_fingerprint
from specbench.errors import SpecbenchError
from specbench.files import files_fingerprint
from specbench.models.cache import check_tree_attention, common_prefix, crop_cache, mask_arguments
from specbench.models.devices import resolve_dtype
from specbench.models.target import Target
from specbench.validate import boolean


def load_head(
    checkpoint: str, target: Target, make_target: str | None = None, dtype: torch.dtype | None = None
):
    """``(EagleHead, d2t | None, meta)`` from a checkpoint directory or hub id, checked against ``target``;
    the head in ``dtype`` (None: the target's)."""
    path = resolve_checkpoint(checkpoint, make_target)
    meta = read_meta(path)
    mine = meta.get("specbench") or {}
    if mine.get("vocab") and mine["vocab"] != vocab_fingerprint(target.tokenizer):
        raise SpecbenchError(
            f"draft head {path} was trained for target '{mine.get('target')}', whose vocabulary differs from "
            f"this target's ('{target.loaded.name}')",
            shipped.other_target_fix(
                str(checkpoint),
                target.loaded.name,
                f"use a head trained for {target.loaded.name} (specbench train-drafter target=...), "
                "or that target",
            ),
        )
    state = load_state(path)
    layer_ids = {int(k.split(".")[1]) for k in state if k.startswith("layers.")}
    if "fc.weight" not in state or not layer_ids:
        raise SpecbenchError(
            f"{path} is not an EAGLE-1 head (no fc.weight / layers.* tensors)",
            "point the checkpoint at an EAGLE-1 layout head or a train-drafter output",
        )
    hidden = int(target.config.hidden_size)
    if tuple(state["fc.weight"].shape) != (hidden, 2 * hidden):
        raise SpecbenchError(
            f"draft head {path} has fc {tuple(state['fc.weight'].shape)}, the target needs "
            f"({hidden}, {2 * hidden})",
            "use a head trained for this target",
        )
    head = EagleHead(target.model, layers=max(layer_ids) + 1, dtype=dtype)
    d2t = state.pop("d2t", None)
    state = {k: v for k, v in state.items() if k.startswith(("fc.", "layers."))}
    own = head.state_dict()
    missing = [k for k in own if k not in state]
    unexpected = [k for k in state if k not in own]
    if missing or unexpected:
        raise SpecbenchError(
            f"draft head {path} does not fit the target's layer layout (missing {missing[:3]}, "
            f"unexpected {unexpected[:3]})",
            "use a head trained for this target's family",
        )
    head.load_state_dict(state)
    return head.eval(), (None if d2t is None else d2t.long().to(target.device)), meta


class EagleDrafter(Drafter):
    scored = True  # a dynamic tree's path probabilities as scores

    def __init__(
        self,
        name: str,
        head: EagleHead,
        target: Target,
        d2t: torch.Tensor | None,
        cost: float,
        confidence_threshold: float = 0.0,
        tree: TreeShape | None = None,
    ):
        self.name = name
        self.tree = tree  # a dynamic draft tree per round (``drafters/dynamic_tree.py``); None: a chain
        self.cost = float(cost)
        self.confidence_threshold = check_confidence_threshold(confidence_threshold, name)
        self.head = head
        self.embed = target.model.get_input_embeddings()
        self.logits = HeadLogits(target, d2t)
        # a catch-up feeds the head many (feature, token) pairs at once: exact only in full precision
        self.history_free = full_precision(head, target.model.get_output_embeddings())
        self.layer = int(target.config.num_hidden_layers)
        self.cache = None
        self.real: list[int] = []  # x_{t+1} of the cached pairs built from the target's own features
        self._hat: torch.Tensor | None = None  # the predicted feature that drafts the next token

    def state_layers(self, side_observations: bool) -> tuple[int, ...]:
        return (self.layer,)

    @property
    def group(self) -> HeadGroup:
        """The heads it is observed with: those sharing its logits product (``HeadLogits.key``)."""
        return HeadGroup(self.logits.key)

    def begin(self, query: DecodeContext) -> None:
        self.cache = DynamicCache()
        self.real = []
        self._hat = None

    def cohort(self):
        """One batched copy of the head's cache, a view a row (admissions included), each fed its row's own target
        states: the loop drafts every row that uses the head in one head forward a position
        (``drafters/batched.py``); chains only (a dynamic draft tree does not batch)."""
        return HeadRows(self)

    @torch.inference_mode()
    def _feed(self, features: torch.Tensor, tokens: list[int]) -> torch.Tensor:
        ids = torch.tensor([tokens], device=features.device)
        return self.head(features[None], self.embed(ids), self.cache)[0]

    @torch.inference_mode()
    def catch_up(self, tokens: list[int]) -> None:
        n = len(tokens)
        if n < 2:  # no committed feature yet: nothing to draft from
            self._hat = None
            return
        keep = self.pairs_kept(self.real, tokens)
        crop_cache(self.cache, keep)
        del self.real[keep:]
        out = self._feed(self.features(self._query, keep, n - 1), tokens[keep + 1 : n])
        self.real.extend(tokens[keep + 1 : n])
        self._hat = out[-1]

    @staticmethod
    def pairs_kept(real: list[int], tokens: list[int]) -> int:
        """How many of the cached pairs (their tokens ``real``) stay for the committed ``tokens`` (at least two):
        those that still match, all but the last at most (the last pair is always refed, its feature being new)."""
        return min(common_prefix(real, tokens[1:]), len(tokens) - 2)

    def features(self, query: DecodeContext, start: int, stop: int) -> torch.Tensor:
        """The head's input features at ``query``'s committed positions ``start .. stop-1`` (the target's last
        layer)."""
        return query.states(self.layer)[start:stop]

    @torch.inference_mode()
    def propose(self, tokens, k, sampling, rng, eos_ids=frozenset(), stop_below=0.0) -> Draft:
        if self._hat is None:
            return Draft(tokens=[], probs=None)
        h = self._hat
        self._hat = None
        if self.tree is not None and k > 0:
            return self._propose_tree(h, k, sampling, rng, eos_ids)
        steps = DraftSteps()
        for _ in range(k):
            sub = self.logits(h)
            probs = self.logits.to_full(logits_to_probs(sub, sampling), 0.0)
            tok = steps.pick(self.logits.to_full(sub, float("-inf")), probs, sampling, rng, stop_below)
            if tok is None or steps.ends(k, eos_ids, self.confidence_threshold):
                break
            h = self._feed(h[None], [tok])[-1]
        return steps.draft()

    def _propose_tree(self, h: torch.Tensor, k: int, sampling, rng, eos_ids) -> Draft:
        """A dynamic draft tree: one head forward per depth over the frontier (tree attention inside the head: each
        frontier node sees the committed pairs, its ancestors' pairs and its own, at its depth's position)."""
        base = self.cache.get_seq_length()  # the committed pairs; tree pairs are cropped at the next sync
        hidden: dict[int, torch.Tensor] = {-1: h}
        slot: dict[int, int] = {}  # node -> its column among the tree pairs fed so far

        def expand(frontier, tokens, parents, depths):
            allowed = frontier_attention(base, slot, frontier, parents, h.device)
            features = torch.stack([hidden[parents[n]] for n in frontier])
            ids = torch.tensor([[tokens[n] for n in frontier]], device=h.device)
            mask = mask_arguments(self.head, allowed, [base + depths[n] - 1 for n in frontier])
            out = self.head(features[None], self.embed(ids), self.cache, mask=mask)[0]
            for row, node in enumerate(frontier):
                hidden[node] = out[row]
            return self.logits.to_full(logits_to_probs(self.logits(out), sampling), 0.0)

        first = self.logits.to_full(logits_to_probs(self.logits(h), sampling), 0.0)
        return grow(first, expand, k, self.tree, sampling, rng, eos_ids)

    @torch.inference_mode()
    def chain(self, query: DecodeContext, context: list[int], draft: list[int]) -> torch.Tensor | None:
        """The head's hidden states ``[len(draft), H]`` along a played ``draft`` from the committed ``context``
        (row ``j`` drafts position ``j``: row 0 is what ``propose`` would start from, row ``j`` follows
        ``draft[:j]``; ``len(draft) - 1`` head steps, no target call), or None when there is no committed
        feature yet. The chain's cache positions are draft pairs: the next ``sync`` crops them (``real`` is not
        extended)."""
        self.sync(query, context)
        h = self._hat
        self._hat = None
        if h is None or not draft:
            return None
        hs = [h]
        for j in range(len(draft) - 1):
            hs.append(self._feed(hs[-1][None], [draft[j]])[-1])
        return torch.stack(hs)

    def distributions(self, sub: torch.Tensor, sampling) -> tuple[torch.Tensor, torch.Tensor]:
        """Logits over the draft vocabulary -> ``(probs [n, V], logits [n, V])`` in the full vocabulary (zero /
        -inf outside a sub-vocabulary)."""
        return self.logits.to_full(logits_to_probs(sub, sampling), 0.0), self.logits.to_full(
            sub, float("-inf")
        )

    def _greedy_acceptance(
        self, v: Verification, probs: torch.Tensor, full: torch.Tensor
    ) -> tuple[int, bool]:
        """What greedy verification would have kept of this head's own draft, walked along the played
        draft while the two agree; censored (not exact) where the head's path leaves the played one."""
        n = len(v.draft)
        k = n
        if v.draft_length is not None and v.room is not None:
            k = min(self.draft_length or v.draft_length, v.room)
        mine = full.argmax(-1).tolist()
        theirs = v.p.argmax(-1).tolist()
        for j in range(min(n, k)):
            d = mine[j]
            if d != theirs[j]:
                return j, True
            if draft_ends(d, float(probs[j, d]), j, k, v.eos_ids, self.confidence_threshold):
                return j + 1, True  # the head's draft ends here (EOS, k tokens, or doubt): all of it kept
            if d != v.draft[j]:
                return j + 1, False  # the played draft was rejected here; the head's goes on unscored
        return min(n, k), False  # the played draft ended before the head's would have


@dataclass(frozen=True)
class HeadGroup(ObservationGroup):
    """The heads observed together: those whose logits are one and the same product (``key``: ``HeadLogits.key``,
    the target's LM head in its own dtype with no sub-vocabulary; any other head is a group of its own).

    Under full information, on a round a head did not play, its observation is its Block Divergence at the
    ``len(draft)`` positions the target scored (the played draft's context, as early exits do), carrying the greedy
    acceptance it would have had (``HeadObservation``). Each member walks its own chain, then one LM-head product
    covers every member's rows (on CPUs, reading that weight is most of a head's step)."""

    key: tuple

    def observe(self, v: Verification, members) -> dict[str, HeadObservation]:
        if (
            not v.draft
            or v.p is None
            or v.query is None
            or v.context is None
            or not v.query.side_observations
        ):
            return {}
        return observations(v, [d for name, d in members.items() if name != v.played])


def observations(v: Verification, heads: list[EagleDrafter]) -> dict[str, HeadObservation]:
    """Each head's observation of the round ``v`` (heads sharing one logits product: ``HeadLogits.key``): every
    head's chain along the played draft, then the logits of all their rows in one product."""
    chains = [(d, c) for d in heads if (c := d.chain(v.query, v.context, v.draft)) is not None]
    if not chains:
        return {}
    subs = chains[0][0].logits(torch.cat([c for _, c in chains]))
    out, n = {}, len(v.draft)
    for i, (d, _) in enumerate(chains):
        probs, full = d.distributions(subs[i * n : (i + 1) * n], v.sampling)
        bd = block_divergence(v.draft, probs, v.p, n)
        accepted, exact = d._greedy_acceptance(v, probs, full) if v.sampling.greedy else (None, False)
        out[d.name] = HeadObservation(bd, accepted, exact, len(v.context))
    return out


class HeadObservation(float):
    """A head's side observation: its Block Divergence on a round it did not play (the float value),
    with the greedy acceptance it would have had had it been played.

    ``accepted``: draft tokens greedy verification would have kept (None under sampling); ``exact``:
    False when that is a lower bound (censored: the head's own draft would have left the played one,
    whose target distributions are all that was scored, before its acceptance was settled);
    ``start``: the committed length the round started from.
    """

    accepted: int | None
    exact: bool
    start: int

    def __new__(cls, bd: float, accepted: int | None, exact: bool, start: int):
        obs = super().__new__(cls, bd)
        obs.accepted, obs.exact, obs.start = accepted, exact, start
        return obs

    def __repr__(self) -> str:
        return f"HeadObservation(bd={float(self):.4f}, accepted={self.accepted}, exact={self.exact}, start={self.start})"


def head_cost(head: EagleHead, logits: HeadLogits, target: Target) -> float:
    """Parameters touched per draft token (head + the LM-head rows it scores) / the target's."""
    own = sum(p.numel() for p in head.parameters())
    rows = logits.weight.numel() if logits.weight is not None else logits.lm_head.weight.numel()
    return (own + rows) / sum(p.numel() for p in target.model.parameters())


def build(
    target: Target,
    name: str,
    checkpoint: Checkpoint = None,
    make_target: MakeTarget = None,
    sub_vocabulary: Annotated[bool, boolean()] = True,
    confidence_threshold: Confidence = 0.0,
    dtype: Dtype = None,
    tree: TreeDraft = None,
) -> EagleDrafter:
    """``sub_vocabulary=false`` scores the whole vocabulary even when the head has a ``d2t`` (to measure
    what the sub-vocabulary saves); ``confidence_threshold``: a dynamic draft length (``draft_ends``);
    ``dtype``: the head's (None: the target's; the LM head it scores through stays the target's); ``tree``:
    ``{width, nodes}`` drafts a dynamic draft tree each round (null: a chain)."""
    shape = tree_shape(tree, name)
    if shape is not None:
        check_tree_attention(target.model, f"drafter '{name}' (tree)")
    if target.is_encoder_decoder:
        raise SpecbenchError(
            f"drafter '{name}' (eagle) needs a decoder-only target",
            "use early_exit, quantized or an hf drafter with encoder-decoder targets",
        )
    if not checkpoint:
        raise SpecbenchError(
            f"drafter '{name}' (eagle) has no checkpoint",
            f"set its checkpoint, or build one with `{make_target or 'specbench train-drafter'}`",
        )
    head_dtype = resolve_dtype(dtype, target.device) if dtype else None
    head, d2t, _ = load_head(checkpoint, target, make_target, dtype=head_dtype)
    if not sub_vocabulary:
        d2t = None
    drafter = EagleDrafter(
        name, head, target, d2t, cost=0.0, confidence_threshold=confidence_threshold, tree=shape
    )
    drafter.cost = head_cost(head, drafter.logits, target)
    # every checkpoint it reads (a local or cache: directory, a package: head, a hub snapshot): resumes check it
    drafter.fingerprint = files_fingerprint(
        resolve_checkpoint(checkpoint, make_target)
    )  # (run_records.Records)
    return drafter


# its drafter drafts the rows of a batch in one head forward a position (EagleDrafter.cohort, each row fed its own
# target states; pipelines/batch_settings.py): chains (a tree config is refused for batches)
build.batches = "chains"
