"""Offline rewards for drafter selection: ``r = alpha * alignment + (1 - alpha) * (1 - cost)``.

``alignment`` in [0, 1] (ROUGE-L F of the drafter's own greedy output against the target's; 1 for the
autoregressive arm), ``cost`` in [0, 1] (relative cost; 1 for the autoregressive arm). A NaN alignment
means the arm has no score for that query (a drafter that cannot generate alone) and stays NaN.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TypeVar

import torch

from specbench.errors import SpecbenchError

T = TypeVar("T")


def check_alpha(alpha: float) -> float:
    """``alpha`` as a float, or SpecbenchError when it is outside [0, 1]."""
    a = float(alpha)
    if not 0.0 <= a <= 1.0:  # also rejects NaN
        raise SpecbenchError(
            f"reward: alpha {alpha} is outside [0, 1]",
            "set reward.alpha between 0 (cost only) and 1 (alignment only)",
        )
    return a


def reward(alignment: T, cost: T, alpha: float) -> T:
    """``alpha * alignment + (1 - alpha) * (1 - cost)``, elementwise; floats give a float, tensors a float
    tensor (broadcast), arrays an array. NaN alignment gives NaN."""
    a = check_alpha(alpha)
    if isinstance(alignment, torch.Tensor) or isinstance(cost, torch.Tensor):
        al, co = torch.as_tensor(alignment), torch.as_tensor(cost)
        dtype = torch.promote_types(torch.promote_types(al.dtype, co.dtype), torch.get_default_dtype())
        return a * al.to(dtype) + (1.0 - a) * (1.0 - co.to(dtype))
    if isinstance(alignment, (int, float)) and isinstance(cost, (int, float)):
        return a * float(alignment) + (1.0 - a) * (1.0 - float(cost))
    return a * alignment + (1.0 - a) * (1.0 - cost)  # numpy arrays and the like


def reward_matrix(alignment: torch.Tensor, cost: torch.Tensor, alpha: float) -> torch.Tensor:
    """Rewards ``[N, A]`` from alignment and cost ``[N, A]`` (rows: queries, columns: arms).

    NaN alignment (or cost) stays NaN: that arm has no score for that query. Scores outside [0, 1]
    (alignment) or below 0 (cost), and infinities, are refused."""
    alignment, cost = torch.as_tensor(alignment), torch.as_tensor(cost)
    if alignment.dim() != 2 or alignment.shape != cost.shape:
        raise SpecbenchError(
            f"reward: alignment {tuple(alignment.shape)} and cost {tuple(cost.shape)} are not "
            "two matrices of the same [queries, arms] shape",
            "pass one row per query and one column per arm for both",
        )
    alignment = alignment.to(torch.promote_types(alignment.dtype, torch.get_default_dtype()))
    cost = cost.to(alignment.dtype)
    if torch.isinf(alignment).any() or torch.isinf(cost).any():
        raise SpecbenchError("reward: alignment or cost contains infinities", "check the collected scores")
    al, co = alignment.nan_to_num(0.5), cost.nan_to_num(0.5)
    if (al < 0).any() or (al > 1).any():
        raise SpecbenchError(
            "reward: alignment outside [0, 1]",
            "alignment is a ROUGE-L F score in [0, 1] (NaN for an arm that cannot generate alone)",
        )
    if (co < 0).any():
        raise SpecbenchError("reward: negative cost", "cost is relative to the target's (target = 1.0)")
    return reward(alignment, cost, alpha)


def usable_arms(R: torch.Tensor) -> list[int]:
    """Indices of the arms (columns of ``R [N, A]``) with a reward for every query (no NaN)."""
    R = torch.as_tensor(R)
    if R.dim() != 2:
        raise SpecbenchError(f"reward matrix has shape {tuple(R.shape)}", "pass a [queries, arms] matrix")
    return [a for a in range(R.shape[1]) if not torch.isnan(R[:, a]).any()]


def check_arms_scored(R: torch.Tensor, arms: Sequence[str]) -> None:
    """SpecbenchError naming every arm whose column of ``R [N, A]`` is NaN for every query."""
    R = torch.as_tensor(R)
    if R.dim() != 2 or R.shape[1] != len(arms):
        raise SpecbenchError(
            f"reward matrix has shape {tuple(R.shape)} but {len(arms)} arms are named {list(arms)}",
            "pass one column per arm, in the order of the arm names",
        )
    dead = [arms[a] for a in range(R.shape[1]) if R.shape[0] > 0 and bool(torch.isnan(R[:, a]).all())]
    if dead:
        names = ", ".join(dead)
        raise SpecbenchError(
            f"cannot score arm {names}: it has no alignment (cannot generate alone)",
            "set reward.source=measured or drop it from the pool",
        )


__all__ = ["check_alpha", "check_arms_scored", "reward", "reward_matrix", "usable_arms"]
