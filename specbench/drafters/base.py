"""The drafter interface and the one implementation shared by every model-backed drafter."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from specbench.decoding.sampling import SamplingParams, logits_to_probs, pick
from specbench.models.cache import CachedLM


@dataclass
class Draft:
    tokens: list[int]
    probs: torch.Tensor | None  # [len(tokens), V]: the distributions the tokens were drawn from
    raw: torch.Tensor | None = None  # [len(tokens), V]: the drafter's untempered softmax (cascade rules)


class Drafter:
    """A source of draft tokens.

    ``cost`` is the relative cost per drafted token (parameter count relative to the target by
    default); ``reset`` starts a query; ``sync`` brings the drafter's own state up to the committed
    tokens (the loop times it: when the drafter was idle in the previous round this is the
    switching cost); ``propose`` drafts up to ``k`` tokens.
    """

    name: str = "drafter"
    cost: float = 0.0
    deterministic: bool = False
    can_generate_alone: bool = True
    exit_layer: int | None = None  # early-exit drafters: their distribution is readable off the target

    # Early exits only: logits = head_logits(head_input(states after exit_layer layers)), where
    # ``head`` is the (shared) LM head module, so exits with one head can batch their rows.
    head: torch.nn.Module | None = None

    def head_input(self, states: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError(f"{type(self).__name__} is not an early-exit drafter")

    def head_logits(self, x: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError(f"{type(self).__name__} is not an early-exit drafter")

    def logits_from_hidden(self, states: torch.Tensor) -> torch.Tensor:
        """``[n, H]`` target states after ``exit_layer`` layers -> logits ``[n, V]``."""
        return self.head_logits(self.head_input(states))

    def reset(self, encoder_ids: list[int] | None) -> None:
        pass

    def sync(self, tokens: list[int]) -> None:
        pass

    def propose(self, tokens: list[int], k: int, sampling: SamplingParams, rng: torch.Generator,
                eos_ids: frozenset[int] = frozenset()) -> Draft:
        raise NotImplementedError


class AutoregressiveArm(Drafter):
    """No draft: the round is one ordinary target step."""

    name = "autoregressive"
    deterministic = True

    def propose(self, tokens, k, sampling, rng, eos_ids=frozenset()) -> Draft:
        return Draft(tokens=[], probs=None)


class ModelDrafter(Drafter):
    """Drafts token by token from any causal or seq2seq HF module with its own KV cache.

    ``confidence_threshold``: stop the draft after a token whose drafter probability is below it
    (0 = always draft ``k``). Verification is unchanged, so decoding stays lossless.
    """

    def __init__(self, name: str, model: torch.nn.Module, vocab_size: int, cost: float,
                 confidence_threshold: float = 0.0):
        self.name = name
        self.cost = cost
        self.confidence_threshold = float(confidence_threshold)
        self.lm = CachedLM(model, vocab_size=vocab_size)
        self._next_logits: torch.Tensor | None = None

    def reset(self, encoder_ids):
        self.lm.reset(encoder_ids)
        self._next_logits = None

    def sync(self, tokens):
        self._next_logits = self.lm.sync(tokens)

    def propose(self, tokens, k, sampling, rng, eos_ids=frozenset()) -> Draft:
        if self._next_logits is None:  # the loop syncs first; a direct call may not
            self.sync(tokens)
        logits = self._next_logits
        self._next_logits = None
        out: list[int] = []
        rows: list[torch.Tensor] = []
        raw: list[torch.Tensor] = []
        for i in range(k):
            probs = logits_to_probs(logits, sampling)
            tok = pick(logits if sampling.greedy else probs, sampling, rng)
            out.append(tok)
            rows.append(probs)
            raw.append(probs if sampling.greedy else torch.softmax(logits.float(), dim=-1))
            # Stop early at EOS, at k tokens, or when the drafter doubts its own token (it would
            # likely be rejected, and each further draft forward costs time).
            if tok in eos_ids or i == k - 1 or float(probs[tok]) < self.confidence_threshold:
                break
            logits = self.lm.forward([tok], last_only=True)[-1]
        return Draft(tokens=out, probs=torch.stack(rows) if rows else None, raw=torch.stack(raw) if raw else None)


def param_count(model: torch.nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())
