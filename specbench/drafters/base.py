"""The one implementation shared by every model-backed drafter (the protocol is ``decoding/drafter.py``)."""

from __future__ import annotations

import torch

from specbench.decoding.drafter import AUTOREGRESSIVE, AutoregressiveArm, Draft, Drafter, DecodeContext, draft_ends
from specbench.decoding.sampling import logits_to_probs, pick
from specbench.errors import SpecbenchError
from specbench.models.cache import CachedLM


def check_confidence_threshold(value, name: str) -> float:
    """A drafter's ``confidence_threshold`` as a float in [0, 1] (a probability; above 1 every draft
    would stop after its first token), else a ``SpecbenchError`` naming the drafter."""
    try:
        threshold = float(value)
    except (TypeError, ValueError):
        threshold = float("nan")
    if not 0.0 <= threshold <= 1.0:  # nan fails too
        raise SpecbenchError(f"drafter '{name}': confidence_threshold={value} is not a probability in [0, 1]",
                             f"set pool.drafters.{name}.confidence_threshold=<a number in [0, 1]> "
                             "(0 drafts every token of the draft length)")
    return threshold


class ModelDrafter(Drafter):
    """Drafts token by token from any causal or seq2seq HF module with its own KV cache.

    ``confidence_threshold``: stop the draft after a token whose drafter probability is below it
    (0 = always draft ``k``; a probability in [0, 1], else a ``SpecbenchError``). Verification is unchanged, so decoding stays lossless.
    ``shares_encoder``: the module's encoder is the target's own (an early exit of an
    encoder-decoder target), so a query reuses the target's encoder output instead of encoding again.
    """

    shares_encoder: bool = False

    def __init__(self, name: str, model: torch.nn.Module, vocab_size: int, cost: float,
                 confidence_threshold: float = 0.0):
        self.name = name
        self.cost = cost
        self.confidence_threshold = check_confidence_threshold(confidence_threshold, name)
        self.lm = CachedLM(model, vocab_size=vocab_size)
        self._next_logits: torch.Tensor | None = None

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
        out: list[int] = []
        rows: list[torch.Tensor] = []
        raw: list[torch.Tensor] = []
        for i in range(k):
            probs = logits_to_probs(logits, sampling)
            untempered = probs if sampling.greedy else torch.softmax(logits.float(), dim=-1)
            if stop_below and float(untempered.max()) < stop_below:
                break  # a sequential cascade defers this position: the target gives its token
            tok = pick(logits if sampling.greedy else probs, sampling, rng)
            out.append(tok)
            rows.append(probs)
            raw.append(untempered)
            if draft_ends(tok, float(probs[tok]), i, k, eos_ids, self.confidence_threshold):
                break
            logits = self.lm.forward([tok], last_only=True)[-1]
        return Draft(tokens=out, probs=torch.stack(rows) if rows else None, raw=torch.stack(raw) if raw else None)


def param_count(model: torch.nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


__all__ = ["AUTOREGRESSIVE", "AutoregressiveArm", "Draft", "Drafter", "ModelDrafter", "check_confidence_threshold",
           "param_count"]
