"""Speculative cascades: per-token deferral rules and verification against their mixtures (pure math).

A rule looks at the drafter's distribution ``q`` and the target's ``p`` at each drafted position
and decides how much of the target to mix in; speculative sampling then verifies the draft
against that mixture ``pi`` instead of ``p`` (accept ``min(1, pi(x) / q(x))``, residual
``norm(max(0, pi - q))``), so a good draft token the target would not have chosen can be kept.

Rules (``alpha`` is the lenience; larger keeps more draft tokens):

- ``none``: ``pi = p`` (lossless speculative decoding; ``alpha`` is ignored).
- ``chow``: defer when ``max q < 1 - alpha``.
- ``diff``: defer when ``max q < max p - alpha``.
- ``opt``: defer when ``max q < max p - alpha * TV(q, p)``.
  For these three ``pi = (1 - delta) q + delta p`` with ``delta = 1`` when deferring, else 0.
- ``token_v1`` / ``token_v2`` / ``token_v3``: an accept set ``A`` per position
  (V1 ``q(v) >= max p - alpha``, V2 ``p(v) >= max p - alpha``, V3 ``p(v) >= (1 - alpha) max p``)
  and ``pi(v) = q(v) 1[v in A] + q(not A) p(v)``.
- ``sequential``: the sequential (token-level) cascade that the speculative ones improve on: the drafter
  generates, and a position whose drafter distribution is unconfident (Chow's test on ``q`` alone,
  ``max q < 1 - alpha``) is deferred: the target, called only then, gives that token (its forward over the
  tokens it has not seen yet gives it). In the decode loop the drafter stops drafting before such a position
  (``stop_below``), every drafted token is kept (``pi = q``), and the target's row after them gives the
  deferred token (a draft that reaches its length without a deferral is kept whole: that forward only
  catches the target up). Its outputs are Chow's; what differs is when the target runs.
- ``lossy_sd``: accept with ``min(1, p(x) / ((1 - alpha) q(x)))``, residual
  ``norm(max(0, p - (1 - alpha) q))`` (Leviathan et al.'s lenience; ``alpha = 1`` keeps every draft).

The deferral test and the accept sets use the *untempered* softmax of both models; the mixture
and the sampler use the *tempered* (processed: temperature, top-k, top-p) distributions, as in the
authors' reference code. A deterministic drafter (prompt lookup) has a one-hot ``q``.

Greedy decoding (temperature 0) is the limit of the sampler as the tempered distributions become
one-hot on each model's argmax: a draft token ``x_i`` (the drafter's argmax) is kept iff the rule
keeps it for sure or it equals the target's argmax, and at the first position that fails the
target's argmax is emitted:

- mixture rules keep ``x_i`` iff the position is not deferred (untempered test);
- token rules keep ``x_i`` iff ``x_i`` is in the accept set (untempered test);
- ``lossy_sd`` keeps every draft token at ``alpha = 1`` and otherwise is plain greedy speculative
  decoding (its test is a random draw against tempered, i.e. one-hot, probabilities);
- ``none`` keeps nothing by itself (plain greedy speculative decoding).

The bonus position: under a lossy rule the decode loop drafts ``k + 1`` tokens and the target
scores the first ``k`` (one forward, ``k + 1`` rows, as in lossless decoding), so the last draft
token sits where lossless decoding puts the target's bonus token and is verified against ``pi``
there like any other; a round whose draft is fully kept emits no target token. (Drafting it costs
one more drafter forward per round; the drafter's next catch-up feeds one token fewer.) Hence, at
a never-deferring alpha, greedy output is exactly the drafter's own greedy output. A draft shorter
than ``k + 1`` (prompt lookup, an EOS) keeps the usual bonus token from the target.

Lenience ranges (the extremes, used by the tests): every rule accepts ``alpha`` in
``[ALWAYS[rule], NEVER[rule]]``; at ``NEVER`` it never defers (every draft token is kept), at
``ALWAYS`` it always defers (lossless speculative decoding). For ``chow`` at 0 this holds unless
``q`` is one-hot (a certain drafter is never deferred). ``opt`` needs -2 to always defer because
``|max q - max p| <= TV(q, p)``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated

import torch

from specbench.decoding.sampling import SamplingParams, logits_to_probs
from specbench.decoding.verify import Verdict, verify_sampling
from specbench.errors import SpecbenchError
from specbench.validate import check_arguments, number, text

MIXTURE_RULES = ("chow", "diff", "opt", "sequential")
TOKEN_RULES = ("token_v1", "token_v2", "token_v3")
RULES = ("none", *MIXTURE_RULES, *TOKEN_RULES, "lossy_sd")

# alpha that always defers (lossless) and alpha that never defers (keep every draft token)
ALWAYS = {
    "none": 0.0,
    "chow": -1.0,
    "diff": -1.0,
    "opt": -2.0,
    "sequential": -1.0,
    "token_v1": -1.0,
    "token_v2": -1.0,
    "token_v3": -1.0,
    "lossy_sd": 0.0,
}
NEVER = {
    "none": 0.0,
    "chow": 1.0,
    "diff": 1.0,
    "opt": 1.0,
    "sequential": 1.0,
    "token_v1": 1.0,
    "token_v2": 1.0,
    "token_v3": 1.0,
    "lossy_sd": 1.0,
}


# --------------------------------------------------------------------------------- pure functions


def one_hot(tokens: list[int], vocab_size: int, device=None) -> torch.Tensor:
    """``[len(tokens), V]`` rows with probability 1 on each token (a deterministic drafter's q)."""
    out = torch.zeros(len(tokens), vocab_size, device=device)
    if tokens:
        out[torch.arange(len(tokens)), torch.tensor(tokens, device=device)] = 1.0
    return out


def total_variation(q: torch.Tensor, p: torch.Tensor) -> torch.Tensor:
    """TV(q, p) = 0.5 * sum_v |q(v) - p(v)| per row."""
    return 0.5 * (q - p).abs().sum(dim=-1)


def defer_mask(rule: str, q: torch.Tensor, p: torch.Tensor, alpha: float) -> torch.Tensor:
    """Boolean ``[k]``: which positions a mixture rule defers to the target (``q``, ``p`` untempered)."""
    max_q = q.max(dim=-1).values
    max_p = p.max(dim=-1).values
    if rule in ("chow", "sequential"):
        return max_q < 1.0 - alpha
    if rule == "diff":
        return max_q < max_p - alpha
    if rule == "opt":
        return max_q < max_p - alpha * total_variation(q, p)
    if rule == "none":
        return torch.ones(q.shape[0], dtype=torch.bool, device=q.device)
    raise SpecbenchError(f"'{rule}' is not a mixture rule", f"use one of: {', '.join(MIXTURE_RULES)}")


def mixture(q: torch.Tensor, p: torch.Tensor, defer: torch.Tensor) -> torch.Tensor:
    """pi = (1 - delta) q + delta p, row by row (``defer`` is delta as a boolean or 0/1 ``[k]``)."""
    delta = defer.to(q.dtype).unsqueeze(-1)
    return (1.0 - delta) * q + delta * p


def accept_set(rule: str, q: torch.Tensor, p: torch.Tensor, alpha: float) -> torch.Tensor:
    """Boolean ``[k, V]`` accept sets of the token rules (``q``, ``p`` untempered)."""
    max_p = p.max(dim=-1, keepdim=True).values
    if rule == "token_v1":
        return q >= max_p - alpha
    if rule == "token_v2":
        return p >= max_p - alpha
    if rule == "token_v3":
        return p >= (1.0 - alpha) * max_p
    raise SpecbenchError(f"'{rule}' is not a token rule", f"use one of: {', '.join(TOKEN_RULES)}")


def token_mixture(q: torch.Tensor, p: torch.Tensor, in_set: torch.Tensor) -> torch.Tensor:
    """pi(v) = q(v) 1[v in A] + q(not A) p(v), row by row."""
    kept = q * in_set.to(q.dtype)
    outside = (q - kept).sum(dim=-1, keepdim=True)
    return kept + outside * p


def lossy_accept_prob(q_x: torch.Tensor, p_x: torch.Tensor, alpha: float) -> torch.Tensor:
    """min(1, p(x) / ((1 - alpha) q(x))) per drafted token; 1 everywhere at alpha = 1."""
    scale = (1.0 - alpha) * q_x
    return torch.where(
        scale > 0,
        torch.clamp(p_x / torch.where(scale > 0, scale, torch.ones_like(scale)), max=1.0),
        torch.ones_like(p_x),
    )


def keep_mask(rule: str, alpha: float, draft: list[int], q: torch.Tensor, p: torch.Tensor) -> torch.Tensor:
    """Boolean ``[k]``: positions whose draft token the rule keeps for sure, from untempered q and p.

    Mixture rules: not deferred. Token rules: the draft token is in the accept set. ``lossy_sd``:
    ``p(x) >= (1 - alpha) q(x)`` (the acceptance probability is 1). ``none``: never.
    """
    k = len(draft)
    if rule == "none" or k == 0:
        return torch.zeros(k, dtype=torch.bool, device=q.device)
    if rule in MIXTURE_RULES:
        return ~defer_mask(rule, q, p, alpha)
    idx = torch.tensor(draft, device=q.device).unsqueeze(-1)
    if rule in TOKEN_RULES:
        return accept_set(rule, q, p, alpha).gather(-1, idx).squeeze(-1)
    if rule == "lossy_sd":
        q_x, p_x = q.gather(-1, idx).squeeze(-1), p.gather(-1, idx).squeeze(-1)
        return lossy_accept_prob(q_x, p_x, alpha) >= 1.0
    raise SpecbenchError(f"unknown cascade rule '{rule}'", f"use one of: {', '.join(RULES)}")


def cascade_target(
    rule: str, alpha: float, q: torch.Tensor, p: torch.Tensor, q_raw: torch.Tensor, p_raw: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """(pi ``[k, V]``, mask) for the mixture and token rules.

    ``q``, ``p``: tempered rows at the drafted positions; ``q_raw``, ``p_raw``: untempered rows
    (the deferral test and the accept sets). The second tensor is the deferral mask ``[k]`` for the
    mixture rules and the accept sets ``[k, V]`` for the token rules.
    """
    if rule in MIXTURE_RULES or rule == "none":
        defer = defer_mask(rule, q_raw, p_raw, alpha)
        return mixture(q, p, defer), defer
    if rule in TOKEN_RULES:
        in_set = accept_set(rule, q_raw, p_raw, alpha)
        return token_mixture(q, p, in_set), in_set
    raise SpecbenchError(f"rule '{rule}' has no mixture", "lossy_sd verifies with lossy_accept_prob")


def verify_greedy_kept(draft: list[int], keep: torch.Tensor, target_logits: torch.Tensor) -> Verdict:
    """Greedy cascade verification: accept the longest prefix whose tokens are kept by the rule or
    equal the target's argmax, then the target's argmax (the limit of the sampler at temperature 0)."""
    best = torch.argmax(target_logits, dim=-1).tolist()
    keep = keep.tolist()
    n = 0
    while n < len(draft) and (keep[n] or draft[n] == best[n]):
        n += 1
    if n == len(best):  # no bonus row (k rows for k draft tokens): a fully kept draft is the output
        return Verdict(accepted=n, tokens=list(draft))
    return Verdict(accepted=n, tokens=list(draft[:n]) + [best[n]])


# --------------------------------------------------------------------------------- the rule object


@dataclass(frozen=True)
class Cascade:
    """A deferral rule and its lenience; ``verify`` replaces lossless verification in the loop. Its fields' types are
    declared on them (the config's ``cascade.*``); which rule and what range of alpha, here."""

    rule: Annotated[str, text()] = "none"  # a name of RULES
    alpha: Annotated[float, number()] = 0.0  # its range depends on the rule (ALWAYS, NEVER)

    def __post_init__(self):
        check_arguments(Cascade, vars(self), "cascade")
        if self.rule not in RULES:
            raise SpecbenchError(
                f"unknown cascade rule '{self.rule}'",
                f"set cascade.rule to one of: {', '.join(RULES)} (or cascade=<rule>)",
            )
        lo, hi = ALWAYS[self.rule], NEVER[self.rule]
        alpha = float(self.alpha)
        if self.rule != "none" and not lo <= alpha <= hi:
            raise SpecbenchError(
                f"cascade alpha {self.alpha} is out of range for rule '{self.rule}'",
                f"set cascade.alpha between {lo} (always defer: lossless) and {hi} (never defer)",
            )
        object.__setattr__(self, "alpha", alpha)

    @property
    def lossless(self) -> bool:
        return self.rule == "none"

    @property
    def sequential(self) -> bool:
        return self.rule == "sequential"

    @property
    def stop_below(self) -> float:
        """The drafter's stop for a sequential cascade (its largest untempered probability below ``1 - alpha``:
        deferred); 0 (never stop) for every other rule."""
        return 1.0 - self.alpha if self.sequential else 0.0

    def cut(self, draft):
        """A sequential cascade's draft ends before its first deferred position (for drafters that ignore
        ``stop_below``; a deterministic drafter's ``q`` is one-hot: deferred only when ``alpha < 0``)."""
        if not self.sequential or not draft.tokens:
            return draft
        if draft.raw is None:
            unsure = [self.stop_below > 1.0] * len(draft.tokens)
        else:
            unsure = (draft.raw.max(dim=-1).values < self.stop_below).tolist()
        n = unsure.index(True) if True in unsure else len(draft.tokens)
        if n == len(draft.tokens):
            return draft
        return type(draft)(
            tokens=draft.tokens[:n],
            probs=draft.probs[:n] if n else None,
            raw=draft.raw[:n] if n else None,
            match=draft.match,
        )

    @property
    def label(self) -> str:
        return "sd" if self.lossless else f"{self.rule}@{self.alpha:g}"

    def verify(
        self,
        draft: list[int],
        q: torch.Tensor | None,
        q_raw: torch.Tensor | None,
        target_logits: torch.Tensor,
        sampling: SamplingParams,
        rng: torch.Generator,
    ) -> tuple[Verdict, int]:
        """Verify a draft of ``k`` tokens; return the verdict and the number of deferred positions.

        ``q`` ``[k, V]``: the tempered distributions the draft was drawn from (``None``: a
        deterministic drafter, one-hot); ``q_raw``: the drafter's untempered softmax rows (``None``:
        one-hot); ``target_logits`` ``[k + 1, V]``, or ``[k, V]`` when the last draft token sits in the
        bonus position (the loop drafts one token more under a lossy rule): a fully kept draft then
        ends the round without a target token. Deferred positions: mixture rules, delta = 1;
        token rules, the drafted token is outside the accept set; ``lossy_sd``, its acceptance
        probability is below 1; ``none``, every position.
        """
        k = len(draft)
        logits = target_logits.float()
        vocab = logits.shape[-1]
        p_raw = torch.softmax(logits[:k], dim=-1)
        if q_raw is None:
            q_raw = one_hot(draft, vocab, logits.device)
        q_raw = q_raw.to(logits.device).float()
        if sampling.greedy:
            keep = keep_mask(self.rule, self.alpha, draft, q_raw, p_raw)
            if self.rule == "lossy_sd":  # a random test against one-hot tempered probabilities
                keep = torch.full_like(keep, self.alpha >= 1.0)
            return verify_greedy_kept(draft, keep, logits), int(k - keep.sum())
        p = logits_to_probs(logits, sampling)
        if self.rule == "none" or k == 0:
            return verify_sampling(draft, q, p, rng), k
        q_t = one_hot(draft, vocab, logits.device) if q is None else q.to(logits.device).float()
        if self.rule == "lossy_sd":
            idx = torch.tensor(draft, device=logits.device).unsqueeze(-1)
            sure = lossy_accept_prob(
                q_t.gather(-1, idx).squeeze(-1), p[:k].gather(-1, idx).squeeze(-1), self.alpha
            )
            deferred = int((sure < 1.0).sum())
            if self.alpha >= 1.0:
                if logits.shape[0] == k:
                    return Verdict(accepted=k, tokens=list(draft)), deferred
                token = int(torch.multinomial(p[k], 1, generator=rng))
                return Verdict(accepted=k, tokens=list(draft) + [token]), deferred
            # accept iff u (1 - alpha) q(x) < p(x); residual norm(max(0, p - (1 - alpha) q))
            return verify_sampling(draft, (1.0 - self.alpha) * q_t, p, rng), deferred
        pi, mask = cascade_target(self.rule, self.alpha, q_t, p[:k], q_raw, p_raw)
        if self.rule in TOKEN_RULES:
            idx = torch.tensor(draft, device=logits.device).unsqueeze(-1)
            deferred = int((~mask.gather(-1, idx).squeeze(-1)).sum())
        else:
            deferred = int(mask.sum())
        target_rows = torch.cat([pi, p[k:]], dim=0)
        return verify_sampling(draft, q, target_rows, rng), deferred
