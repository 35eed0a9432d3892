"""The one implementation shared by every model-backed drafter (the protocol is ``decoding/drafter.py``)."""

from __future__ import annotations

from typing import Annotated

import torch

from specbench.decoding.drafter import (
    AUTOREGRESSIVE,
    AutoregressiveArm,
    DecodeContext,
    Draft,
    Drafter,
    DraftSteps,
    full_precision,
)
from specbench.decoding.sampling import logits_to_probs
from specbench.drafters.batched import ModelRows
from specbench.drafters.dynamic_tree import TreeShape, frontier_attention, grow, tree_shape
from specbench.errors import SpecbenchError
from specbench.models.cache import CachedLM, check_tree_attention
from specbench.validate import COUNT, PATH, mapping, number, text

# The arguments several drafter builders take (conf/drafter/), each declared once: a builder's signature names them,
# and validate.declared reads the rule from it (pool.drafters.<name>.<argument>)
Checkpoint = Annotated[str | None, PATH]  # eagle, eagle3, small: the head's checkpoint
Confidence = Annotated[float, number(0, 1, note=" (a drafter probability: 0 drafts every token)")]
Dtype = Annotated[str | None, text(null=True)]  # null: the target's
MakeTarget = Annotated[
    str | None, text(null=True)
]  # the command that builds a missing checkpoint, for its error
TreeDraft = Annotated[  # a tree draft each round; its shape is checked by dynamic_tree.tree_shape
    dict | None,
    mapping(null=True, note=" ({width, nodes}; null: a chain)", keys={"width": COUNT, "nodes": COUNT}),
]
LayersKey = Annotated[str, text()]  # the target config's key of its layer count
NGram = Annotated[int, COUNT]  # prompt lookup's and suffix's match lengths


def check_confidence_threshold(value, name: str) -> float:
    """A drafter's ``confidence_threshold`` as a float in [0, 1] (a probability; above 1 every draft
    would stop after its first token), else a ``SpecbenchError`` naming the drafter."""
    try:
        threshold = float(value)
    except (TypeError, ValueError):
        threshold = float("nan")
    if not 0.0 <= threshold <= 1.0:  # nan fails too
        raise SpecbenchError(
            f"drafter '{name}': confidence_threshold={value} is not a probability in [0, 1]",
            f"set pool.drafters.{name}.confidence_threshold=<a number in [0, 1]> "
            "(0 drafts every token of the draft length)",
        )
    return threshold


class ModelDrafter(Drafter):
    """Drafts token by token from any causal or seq2seq HF module with its own KV cache.

    ``confidence_threshold``: stop the draft after a token whose drafter probability is below it
    (0 = always draft ``k``; a probability in [0, 1], else a ``SpecbenchError``). Verification is unchanged, so decoding stays lossless.
    ``shares_encoder``: the module's encoder is the target's own (an early exit of an
    encoder-decoder target), so a query reuses the target's encoder output instead of encoding again.
    ``tree``: a dynamic draft tree each round (``drafters/dynamic_tree.py``: one forward per depth over the
    frontier, tree attention inside the drafter); None: a chain. A tree draft ignores ``confidence_threshold``
    (its size is ``tree.nodes``), and a sequential cascade's deferral (``stop_below``) drafts a chain.
    """

    shares_encoder: bool = False
    scored = True  # a dynamic tree's path probabilities as scores

    def __init__(
        self,
        name: str,
        model: torch.nn.Module,
        vocab_size: int,
        cost: float,
        confidence_threshold: float = 0.0,
        tree: TreeShape | None = None,
    ):
        self.name = name
        self.cost = cost
        self.confidence_threshold = check_confidence_threshold(confidence_threshold, name)
        self.lm = CachedLM(model, vocab_size=vocab_size)
        self.tree = tree
        self._next_logits: torch.Tensor | None = None
        self.history_free = full_precision(model)  # bf16 / fp16: a multi-token catch-up rounds differently

    def begin(self, query: DecodeContext) -> None:
        self.lm.reset(query.encoder_ids, query.encoder_outputs if self.shares_encoder else None)
        self._next_logits = None

    def standalone_model(self) -> torch.nn.Module:
        return self.lm.model

    def catch_up(self, tokens):
        self._next_logits = self.lm.sync(tokens)

    def propose(self, tokens, k, sampling, rng, eos_ids=frozenset(), stop_below=0.0) -> Draft:
        if self._next_logits is None:  # the loop syncs first; a direct call may not
            self.catch_up(tokens)
        logits = self._next_logits
        self._next_logits = None
        if self.tree is not None and k > 0 and not stop_below:
            return self._propose_tree(logits, k, sampling, rng, eos_ids)
        steps = DraftSteps()
        for _ in range(k):
            tok = steps.pick(logits, logits_to_probs(logits, sampling), sampling, rng, stop_below)
            if tok is None or steps.ends(k, eos_ids, self.confidence_threshold):
                break
            logits = self.lm.forward([tok], last_only=True)[-1]
        return steps.draft()

    def cohort(self):
        """One batched copy of the model, a view a row, admissions included: the loop drafts every row that uses it
        in one forward a position (``drafters/batched.py``); chains of decoder-only drafters only."""
        return ModelRows(self)

    def _propose_tree(self, logits: torch.Tensor, k: int, sampling, rng, eos_ids) -> Draft:
        """A dynamic draft tree: one forward per depth over the frontier; each frontier node sees the committed
        tokens, its ancestors (cached by earlier depths) and itself, at position ``committed + depth - 1``. The tree's
        cache rows are dropped afterwards (the next sync feeds the accepted tokens as a chain)."""
        lm = self.lm
        base = len(lm.cached)
        slot: dict[int, int] = {}  # node -> its row among the tree rows fed so far

        def expand(frontier, tokens, parents, depths):
            attend = frontier_attention(base, slot, frontier, parents)
            out = lm.forward(
                [tokens[n] for n in frontier],
                attend=attend,
                positions=[base + depths[n] - 1 for n in frontier],
            )
            return logits_to_probs(out, sampling)

        try:
            return grow(logits_to_probs(logits, sampling), expand, k, self.tree, sampling, rng, eos_ids)
        finally:
            lm.crop(base)


def with_tree(drafter: ModelDrafter, tree, name: str) -> ModelDrafter:
    """``drafter`` drafting a dynamic tree of shape ``tree`` (a drafter config's ``{width, nodes}``; None: a chain),
    refused before decoding for a drafter that cannot attend a tree: an encoder-decoder model (its attention mask
    is the encoder's) or an attention implementation without custom 4D masks."""
    shape = tree_shape(tree, name)
    if shape is not None:
        if drafter.lm.is_encoder_decoder:
            raise SpecbenchError(
                f"drafter '{name}': dynamic draft trees need a decoder-only drafter",
                f"set pool.drafters.{name}.tree to null (a chain) for an encoder-decoder drafter",
            )
        check_tree_attention(drafter.lm.model, f"drafter '{name}' (tree)")
    drafter.tree = shape
    return drafter


def param_count(model: torch.nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


__all__ = [
    "AUTOREGRESSIVE",
    "AutoregressiveArm",
    "Draft",
    "Drafter",
    "ModelDrafter",
    "check_confidence_threshold",
    "param_count",
    "with_tree",
]
