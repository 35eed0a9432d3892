"""Offline training of the drafter-selection policy: REINFORCE as a one-step contextual bandit.

Each query ``i`` has an embedding ``X[i]`` and a full row of logged rewards ``R[i, a]`` (NaN: arm ``a`` has
no score for query ``i``). An epoch samples ``a ~ pi(.|x_i)`` for every training query (seeded) and
minimises ``-(R[i, a] - b) log pi(a|x_i) - entropy * H(pi(.|x_i))``, ``b`` the batch mean of the sampled
rewards (or 0). Arms that are NaN on a row get logit ``-inf`` there, so they are never sampled or chosen
on that row. The weights of the epoch with the best greedy validation reward are returned.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from typing import Any

import torch

from specbench.errors import SpecbenchError
from specbench.policy.model import TrainConfig, TrainResult
from specbench.policy.net import PolicyNet
from specbench.policy.reward import check_arms_scored


def split_indices(n: int, val_fraction: float, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Seeded random split of ``range(n)`` into (train, val) index tensors, each sorted.

    The validation set has ``round(n * val_fraction)`` points, at least 1 when ``n >= 2`` and
    ``val_fraction > 0``, and never all ``n``."""
    train, val = _split_order(n, val_fraction, seed)
    return train.sort().values, val.sort().values


def _split_order(n: int, val_fraction: float, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The split of ``split_indices``, with the training indices in their random order (for prefixes)."""
    if int(n) < 1:
        raise SpecbenchError(
            "policy training: the dataset is empty", "collect rewards first (specbench collect)"
        )
    if not 0.0 <= float(val_fraction) < 1.0:
        raise SpecbenchError(f"val_fraction {val_fraction} is outside [0, 1)", "set 0 <= val_fraction < 1")
    perm = torch.randperm(int(n), generator=torch.Generator().manual_seed(int(seed)))
    n_val = held_out(n, val_fraction)
    return perm[n_val:], perm[:n_val]


def held_out(n: int, val_fraction: float) -> int:
    """How many of ``n`` queries the split holds out for validation (see ``split_indices``)."""
    if n >= 2 and val_fraction > 0:
        return min(max(round(n * val_fraction), 1), n - 1)
    return 0


def _nanmax(R: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Row max and argmax ignoring NaN (``-inf`` / 0 for an all-NaN row)."""
    return R.nan_to_num(float("-inf"), posinf=float("inf"), neginf=float("-inf")).max(dim=1)


def evaluate_choices(R_val: torch.Tensor, chosen: torch.Tensor) -> dict[str, float]:
    """Mean rewards over the rows of ``R_val [N, A]`` for one chosen arm per row.

    ``policy``: chosen arms (rows where the chosen arm is NaN are left out; ``unscored`` counts them);
    ``oracle``: row max; ``best_single``: the best column mean (``best_single_arm``: its index; each
    column averaged over its scored rows); ``random``: row mean over scored arms; ``accuracy``: share
    of rows whose chosen arm attains the row max (ties count as correct). NaN is ignored throughout."""
    R_val, chosen = torch.as_tensor(R_val), torch.as_tensor(chosen, dtype=torch.long)
    if R_val.dim() != 2 or chosen.shape != (R_val.shape[0],):
        raise SpecbenchError(
            f"evaluate_choices: rewards {tuple(R_val.shape)} and choices {tuple(chosen.shape)} do not match",
            "pass a [N, A] reward matrix and N chosen arm indices",
        )
    if R_val.shape[0] == 0:
        raise SpecbenchError("evaluate_choices: no rows to evaluate", "pass at least one query")
    if ((chosen < 0) | (chosen >= R_val.shape[1])).any():
        raise SpecbenchError(
            f"evaluate_choices: chosen arm outside 0..{R_val.shape[1] - 1}",
            "pass arm indices of the reward matrix's columns",
        )
    got = R_val.gather(1, chosen[:, None]).squeeze(1)
    best, _ = _nanmax(R_val)
    cols = R_val.nanmean(dim=0)
    scored = ~torch.isnan(cols)
    best_col = int(cols.nan_to_num(float("-inf")).argmax()) if scored.any() else -1
    return {
        "policy": float(got.nanmean()),
        "oracle": float(best[torch.isfinite(best)].mean()),
        "best_single": float(cols[best_col]) if best_col >= 0 else float("nan"),
        "best_single_arm": best_col,
        "random": float(R_val.nanmean(dim=1).nanmean()),
        "accuracy": float((got >= best).float().mean()),  # NaN >= x is False
        "unscored": int(torch.isnan(got).sum()),
        "n": int(R_val.shape[0]),
    }


def _check_data(X: torch.Tensor, R: torch.Tensor, arms: Sequence[str]) -> tuple[torch.Tensor, torch.Tensor]:
    X, R = torch.as_tensor(X), torch.as_tensor(R)
    if X.dim() != 2 or R.dim() != 2:
        raise SpecbenchError(
            f"policy training: embeddings {tuple(X.shape)} / rewards {tuple(R.shape)} are not matrices",
            "pass X [queries, dim] and R [queries, arms]",
        )
    if X.shape[0] == 0:
        raise SpecbenchError(
            "policy training: the dataset is empty", "collect rewards first (specbench collect)"
        )
    if X.shape[0] != R.shape[0]:
        raise SpecbenchError(
            f"policy training: {X.shape[0]} embeddings but {R.shape[0]} reward rows",
            "pass one embedding per reward row, in the same query order",
        )
    dtype = torch.promote_types(X.dtype, torch.get_default_dtype())
    X, R = X.to(dtype), R.to(dtype)
    if not torch.isfinite(X).all():
        raise SpecbenchError("policy training: embeddings contain NaN or infinity", "re-embed the queries")
    if torch.isinf(R).any():
        raise SpecbenchError("policy training: rewards contain infinity", "check the collected scores")
    check_arms_scored(R, list(arms))
    empty = torch.isnan(R).all(dim=1).nonzero().flatten().tolist()
    if empty:
        raise SpecbenchError(
            f"policy training: {len(empty)} queries (rows {empty[:5]}...) have no scored arm",
            "drop those queries or add an arm scored for them (e.g. autoregressive)",
        )
    return X, R


def _greedy(model: PolicyNet, X: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Greedy arm per row among the arms scored on that row."""
    model.eval()
    with torch.no_grad():
        return model(X).masked_fill(mask, float("-inf")).argmax(dim=1)


def train_policy(X: torch.Tensor, R: torch.Tensor, cfg: TrainConfig, arms: Sequence[str]) -> TrainResult:
    """Train a ``PolicyNet`` on embeddings ``X [N, D]`` and logged rewards ``R [N, A]`` (NaN: unscored).

    Deterministic given ``cfg.seed``. The validation set (``cfg.val_fraction``) is held out before
    ``cfg.n_examples`` caps the training set, so it is the same for every ``n_examples``. Without a
    validation set the best epoch and the metrics use the training set (``metrics["split"]``)."""
    cfg.check()
    X, R = _check_data(X, R, arms)
    n, dim = X.shape
    train_idx, val_idx = _split_order(n, cfg.val_fraction, cfg.seed)
    if cfg.n_examples is not None:
        train_idx = train_idx[: int(cfg.n_examples)]
    train_idx, val_idx = train_idx.sort().values, val_idx.sort().values
    eval_idx, split = (val_idx, "val") if len(val_idx) else (train_idx, "train")

    if cfg.standardize:
        mean = X[train_idx].mean(dim=0)
        std = X[train_idx].std(dim=0, unbiased=False)
        std = torch.where(std > 1e-8, std, torch.ones_like(std))  # constant features pass through centred
    else:
        mean, std = torch.zeros(dim, dtype=X.dtype), torch.ones(dim, dtype=X.dtype)
    Xs = (X - mean) / std
    mask = torch.isnan(R)
    R0 = R.nan_to_num(0.0)

    g = torch.Generator().manual_seed(int(cfg.seed))
    model = PolicyNet(dim, R.shape[1], cfg.hidden, cfg.dropout, generator=g).to(X.dtype)
    opt = torch.optim.Adam(model.parameters(), lr=float(cfg.lr), weight_decay=float(cfg.weight_decay))
    best_val, best_state, best_epoch, history = float("-inf"), None, 0, []
    for epoch in range(1, int(cfg.epochs) + 1):
        model.train()
        total = 0.0
        for batch in train_idx[torch.randperm(len(train_idx), generator=g)].split(int(cfg.batch_size)):
            m = mask[batch]
            logp = torch.log_softmax(model(Xs[batch], generator=g).masked_fill(m, float("-inf")), dim=1)
            p = logp.exp()
            a = torch.multinomial(p.detach(), 1, generator=g).squeeze(1)
            r = R0[batch, a]
            b = r.mean() if cfg.baseline == "mean" else 0.0
            ent = -(p * logp.masked_fill(m, 0.0)).sum(dim=1)
            loss = -((r - b) * logp.gather(1, a[:, None]).squeeze(1)).mean() - float(cfg.entropy) * ent.mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
            total += float(r.sum())
        ev = evaluate_choices(R[eval_idx], _greedy(model, Xs[eval_idx], mask[eval_idx]))["policy"]
        history.append({"epoch": epoch, "train_reward": total / len(train_idx), "val_reward": ev})
        if ev > best_val:
            best_val, best_state, best_epoch = ev, copy.deepcopy(model.state_dict()), epoch
    model.load_state_dict(best_state)
    model.eval()

    chosen = _greedy(model, Xs[eval_idx], mask[eval_idx])
    metrics: dict[str, Any] = evaluate_choices(R[eval_idx], chosen)
    metrics["best_single_arm"] = arms[metrics["best_single_arm"]]
    metrics["share"] = {arm: float((chosen == i).float().mean()) for i, arm in enumerate(arms)}
    metrics.update(split=split, best_epoch=best_epoch, n_train=len(train_idx), n_val=len(val_idx))
    return TrainResult(model, mean, std, list(arms), history, metrics, train_idx, val_idx, cfg)
