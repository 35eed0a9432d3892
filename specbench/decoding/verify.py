"""Verification of a draft against the target (pure functions over tensors; no model calls).

Shapes: a draft of ``k`` tokens; target rows ``[k + 1, V]`` where row ``i`` is the target's
distribution for draft position ``i`` and row ``k`` is the bonus position.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Verdict:
    accepted: int  # draft tokens accepted
    tokens: list[int]  # accepted draft tokens followed by one token from the target


def verify_greedy(draft: list[int], target_logits: torch.Tensor) -> Verdict:
    """Accept the longest draft prefix equal to the target's argmax, then the target's own token."""
    best = torch.argmax(target_logits, dim=-1).tolist()
    n = 0
    while n < len(draft) and draft[n] == best[n]:
        n += 1
    return Verdict(accepted=n, tokens=list(draft[:n]) + [best[n]])


def draft_token_probs(draft: list[int], probs: torch.Tensor | None) -> torch.Tensor:
    """q(x_i) for each drafted token; a deterministic drafter (``probs is None``) has q = 1."""
    if probs is None:
        return torch.ones(len(draft))
    idx = torch.tensor(draft, device=probs.device).unsqueeze(-1)
    return probs.gather(-1, idx).squeeze(-1)


def residual(p: torch.Tensor, q: torch.Tensor | None, token: int) -> torch.Tensor:
    """norm(max(0, p - q)); ``q is None`` means the one-hot distribution on ``token``.

    When the residual has no mass (p <= q everywhere, so the rejection had probability 0 and can
    only come from rounding), fall back to p itself.
    """
    if q is None:
        res = p.clone()
        res[token] = 0.0
    else:
        res = torch.clamp(p - q, min=0.0)
    total = res.sum()
    if not torch.isfinite(total) or total <= 0:
        return p
    return res / total


def verify_sampling(
    draft: list[int], q: torch.Tensor | None, p: torch.Tensor, rng: torch.Generator
) -> Verdict:
    """Speculative sampling (Leviathan et al. 2023; Chen et al. 2023): lossless w.r.t. ``p``.

    ``q`` ``[k, V]`` must be exactly the distributions the draft tokens were drawn from (``None``
    for deterministic drafters); ``p`` ``[k + 1, V]`` the processed target distributions. Token i
    is accepted with probability ``min(1, p(x_i) / q(x_i))``; at the first rejection a token is
    drawn from the residual; if all are accepted the bonus token is drawn from ``p[k]`` (when ``p``
    has only ``k`` rows there is no bonus position: a fully accepted draft is returned as is).
    """
    k = len(draft)
    if k:
        idx = torch.tensor(draft, device=p.device).unsqueeze(-1)
        p_x = p[:k].gather(-1, idx).squeeze(-1)
        q_x = draft_token_probs(draft, q).to(p.device)
        u = torch.rand(k, generator=rng, device=p.device)
        rejected = (u * q_x >= p_x).nonzero()  # accept iff u < p/q (q_x > 0: x was drawn from q)
        if rejected.numel():
            n = int(rejected[0, 0])
            res = residual(p[n], None if q is None else q[n], draft[n])
            token = int(torch.multinomial(res, 1, generator=rng))
            return Verdict(accepted=n, tokens=list(draft[:n]) + [token])
    if p.shape[0] == k:
        return Verdict(accepted=k, tokens=list(draft))
    token = int(torch.multinomial(p[k], 1, generator=rng))
    return Verdict(accepted=k, tokens=list(draft) + [token])


def block_efficiency(accepted: int, n_max: int) -> float:
    """BE = accepted / N_max (MetaSD); 0 for a round that could not draft."""
    return accepted / n_max if n_max > 0 else 0.0


def block_divergence(draft: list[int], q: torch.Tensor | None, p: torch.Tensor, n_max: int) -> float:
    """BD = (1 / N_max) * sum_j (1 - TV(p_j, q_j)) over the drafted positions (MetaSD).

    ``q is None`` is the one-hot draft distribution, for which 1 - TV(p, onehot(x)) = p(x).
    Positions the drafter did not fill (a short prompt-lookup draft) contribute 0.
    """
    k = len(draft)
    if n_max <= 0 or k == 0:
        return 0.0
    if q is None:
        overlap = p[:k].gather(-1, torch.tensor(draft, device=p.device).unsqueeze(-1)).sum()
    else:
        overlap = torch.minimum(p[:k], q.to(p.device)).sum()  # sum_v min(p, q) = 1 - TV
    return float(overlap) / n_max
