"""The lossless acceptance rules a sampled chain draft can be verified by (``decoding.acceptance``): pure functions
over tensors, each returning the ``Verdict`` of one round. Shapes as ``verify.py``'s: a draft of ``k`` tokens, ``q``
``[k, V]`` the distributions the tokens were drawn from (None: a deterministic drafter), ``p`` ``[k + 1, V]`` the
processed target distributions (``k`` rows: no bonus position). Each rule's output law is the target's:

- ``full`` (the default; Leviathan et al. 2023, Chen et al. 2023): token ``i`` kept with probability
  ``min(1, p(x_i) / q(x_i))``, the first rejection replaced by a draw from ``norm(max(p - q, 0))``;
- ``onehot``: the same rule judging every draft as if drawn by argmax (``q`` one-hot on the drafted token: kept with
  probability ``p(x_i)``, the residual ``p`` without ``x_i``): lossless whatever drew the draft, as vLLM's older
  runner verifies its argmax drafts; it keeps less of a sampled draft than ``full``;
- ``strict``: the target samples each position itself and a draft token counts only where it equals that sample (vLLM's
  newer runner's default); it ignores ``q`` and keeps the least;
- ``block`` (Sun et al. 2024, arXiv 2403.10444, Algorithm 2): the drafted block judged jointly. With
  ``p_0 = 1``, ``p_i = min(p_{i-1} p(x_i) / q(x_i), 1)`` and, for ``i < k``,
  ``h_i = S_i / (S_i + 1 - p_i)`` where ``S_i = sum_x max(p_i p_{i}(x) - q_{i}(x), 0)`` over the distributions
  after ``x_1..x_i`` (``h_k = p_k``), the kept length is ``tau = max{i : eta_i <= h_i}`` (0 if none) for
  independent uniforms ``eta``; then a token from ``p`` after the block when ``tau = k``, else from
  ``norm(max(p_tau p_tau(.) - q_tau(.), 0))``. It keeps at least as much as ``full`` in expectation.

Chains only: a token tree is verified by ``decoding/tree.py``'s rules (``full``); the engine refuses another rule
for a tree by name. Greedy decoding never reaches these rules (it keeps the longest prefix equal to the argmax).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from specbench.decoding.sampling import ACCEPTANCE
from specbench.decoding.verify import Verdict, draft_token_probs, residual, verify_sampling

FULL, ONEHOT, STRICT, BLOCK = ACCEPTANCE


def verify_onehot(draft: list[int], q: torch.Tensor | None, p: torch.Tensor, rng: torch.Generator) -> Verdict:
    """``full`` with ``q`` one-hot on the drafted tokens, whatever drew them."""
    return verify_sampling(draft, None, p, rng)


def verify_strict(draft: list[int], q: torch.Tensor | None, p: torch.Tensor, rng: torch.Generator) -> Verdict:
    """The target's own sample at each position; the draft kept while it equals it."""
    tokens = []
    for i, x in enumerate(draft):
        y = int(torch.multinomial(p[i], 1, generator=rng))
        tokens.append(y)
        if y != x:
            return Verdict(accepted=i, tokens=tokens)
    if p.shape[0] == len(draft):
        return Verdict(accepted=len(draft), tokens=tokens)
    tokens.append(int(torch.multinomial(p[len(draft)], 1, generator=rng)))
    return Verdict(accepted=len(draft), tokens=tokens)


def _drafter_row(q: torch.Tensor | None, draft: list[int], i: int, like: torch.Tensor) -> torch.Tensor:
    """The drafter's distribution at position ``i`` (one-hot on the drafted token for a deterministic drafter)."""
    if q is not None:
        return q[i].to(like.device, like.dtype)
    row = torch.zeros_like(like)
    row[draft[i]] = 1.0
    return row


def verify_block(draft: list[int], q: torch.Tensor | None, p: torch.Tensor, rng: torch.Generator) -> Verdict:
    """Block verification (see the module's docstring)."""
    k = len(draft)
    if k == 0:
        return verify_sampling(draft, q, p, rng)
    idx = torch.tensor(draft, device=p.device).unsqueeze(-1)
    ratio = (p[:k].gather(-1, idx).squeeze(-1) / draft_token_probs(draft, q).to(p.device)).tolist()
    eta = torch.rand(k, generator=rng, device=p.device).tolist()
    weights, tau, w = [1.0], 0, 1.0
    for i in range(1, k + 1):
        w = min(w * ratio[i - 1], 1.0)
        weights.append(w)
        if i < k:
            mass = float(torch.clamp(w * p[i] - _drafter_row(q, draft, i, p[i]), min=0.0).sum())
            h = mass / (mass + 1.0 - w) if mass > 0 else 0.0
        else:
            h = w
        if eta[i - 1] <= h:
            tau = i
    if tau == k:
        if p.shape[0] == k:
            return Verdict(accepted=k, tokens=list(draft))
        return Verdict(accepted=k, tokens=[*draft, int(torch.multinomial(p[k], 1, generator=rng))])
    res = torch.clamp(weights[tau] * p[tau] - _drafter_row(q, draft, tau, p[tau]), min=0.0)
    total = float(res.sum())
    dist = res / total if total > 0 else residual(p[tau], None if q is None else q[tau], draft[tau])
    return Verdict(accepted=tau, tokens=[*draft[:tau], int(torch.multinomial(dist, 1, generator=rng))])


RULES: dict[str, Callable[..., Verdict]] = {
    FULL: verify_sampling,
    ONEHOT: verify_onehot,
    STRICT: verify_strict,
    BLOCK: verify_block,
}


def rule(name: str) -> Callable[..., Verdict]:
    """The verification function of acceptance rule ``name`` (checked by the config's rule before any model loads)."""
    return RULES[name]
