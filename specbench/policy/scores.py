"""Score matrices ``[queries, arms]`` from the rows of ``specbench collect``: each arm's alignment, cost,
measured speedup and seconds, and the training reward they make (``RewardSpec``).

The reward (``reward.source=proxy``) is Huang et al.'s ``alpha * alignment + (1 - alpha) * (1 - cost)``,
with the cost divided by the largest among the arms of the query. The alignment is one of two kinds,
the same kind for every arm (``reward.alignment``):

- ``output``: ROUGE-L F (``collect.alignment``) of the drafter's own greedy output against the target's,
  the paper's; an arm that cannot generate alone (a draft head, prompt lookup) has none (NaN);
- ``acceptance``: the share of the arm's drafted tokens that verification accepted in its speculative run
  of the query (``collect.measure_speculative``), which under greedy decoding is the agreement of its drafts
  with the target's own output. It scores every arm, heads included: a head's drafts exist only inside
  speculative rounds, so this is its alignment. A drafter that drafted nothing scores 0.

The autoregressive arm (the target itself) has alignment 1 and the largest cost under both.
``reward.source=measured`` is no proxy: ``speedup / the query's best speedup`` (alpha unused).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Annotated

import torch

from specbench.arms import AUTOREGRESSIVE
from specbench.errors import SpecbenchError
from specbench.policy.reward import check_alpha, reward_matrix
from specbench.validate import check_arguments, number, text

# params: parameters (weight bytes) | measured: the drafter's own generation's seconds per token | speed: its
# speculative run's seconds per token (1 / its measured speedup; the target's own: 1), relative to the target's
COSTS = ("params", "measured", "speed")
SOURCES = ("proxy", "measured")
ALIGNMENT_KINDS = ("output", "acceptance")  # (collect.ALIGNMENTS are the metrics of the output kind)


@dataclass(frozen=True)
class RewardSpec:
    """How a training reward is made from collected rows (the ``reward`` config group: reward.*, its fields)."""

    alpha: Annotated[float, number(0, 1)] = 0.5
    cost: Annotated[str, text()] = "params"  # params | measured | speed (COSTS)
    source: Annotated[str, text()] = "proxy"  # proxy | measured
    alignment: Annotated[str, text()] = "output"  # output | acceptance

    def __post_init__(self) -> None:
        check_alpha(self.alpha)
        check_arguments(RewardSpec, vars(self), "reward")
        for key, value, known in (
            ("cost", self.cost, COSTS),
            ("source", self.source, SOURCES),
            ("alignment", self.alignment, ALIGNMENT_KINDS),
        ):
            if value not in known:
                raise SpecbenchError(f"unknown reward.{key} '{value}'", f"use one of: {', '.join(known)}")

    @classmethod
    def of(cls, reward) -> RewardSpec:
        """From the ``reward`` config node (a mapping; a missing ``alignment`` is ``output``)."""
        return cls(
            alpha=float(reward["alpha"]),
            cost=str(reward["cost"]),
            source=str(reward["source"]),
            alignment=str(reward.get("alignment") or "output"),
        )

    def describe(self) -> str:
        if self.source == "measured":
            return "reward source measured (speedup / the query's best)"
        return f"reward source proxy, alpha {self.alpha}, cost {self.cost}, alignment {self.alignment}"


def _matrix(rows: list[dict], arms: list[str], get) -> torch.Tensor:
    """``[len(rows), len(arms)]`` of ``get(arm's record, arm)`` (None: NaN)."""
    vals = [[get(r["arms"].get(a) or {}, a) for a in arms] for r in rows]
    return torch.tensor(
        [[math.nan if v is None else float(v) for v in row] for row in vals], dtype=torch.float64
    )


def cost_matrix(rows: list[dict], arms: list[str], kind: str) -> torch.Tensor:
    """Per-query cost of each arm relative to the largest among ``arms`` (so in [0, 1])."""
    if kind not in COSTS:
        raise SpecbenchError(f"unknown reward.cost '{kind}'", f"use one of: {', '.join(COSTS)}")

    def get(rec, arm):
        if kind == "speed":
            return speed_cost(rec, arm)
        measured = rec.get("cost_measured")
        return measured if kind == "measured" and measured is not None else rec.get("cost_params")

    cost = _matrix(rows, arms, get)
    top = cost.nan_to_num(0.0).max(dim=1, keepdim=True).values.clamp_min(1e-12)
    return cost / top


def speed_cost(rec: dict, arm: str) -> float:
    """An arm's measured cost: its speculative run's seconds per token over the target's own (1 / its speedup; the
    autoregressive arm 1). Refused where the run was not measured: the reward would silently lose its cost term."""
    if arm == AUTOREGRESSIVE:
        return 1.0
    speedup = (rec.get("spec") or {}).get("speedup")
    if not speedup:
        raise SpecbenchError(
            f"reward.cost=speed, but a row has no measured speculative run of {arm}",
            "collect with collect.measure_speculative=true, or use reward.cost=params",
        )
    return 1.0 / float(speedup)


def acceptance(rec: dict, arm: str) -> float | None:
    """The share of ``arm``'s drafted tokens accepted in its speculative run (1 for the autoregressive arm;
    0 when it drafted nothing; None when the run was not measured)."""
    if arm == AUTOREGRESSIVE:
        return 1.0
    spec = rec.get("spec")
    if not spec:
        return None
    if "drafted" not in spec:
        raise SpecbenchError(
            f"reward.alignment=acceptance, but the rows' speculative runs of {arm} do not record "
            "their drafted and accepted tokens (collected before they were kept)",
            "collect again (collect.measure_speculative=true), or use reward.alignment=output",
        )
    return spec["accepted"] / spec["drafted"] if spec["drafted"] else 0.0


def alignment_matrix(rows: list[dict], arms: list[str], kind: str) -> torch.Tensor:
    if kind == "output":
        return _matrix(rows, arms, lambda rec, _: rec.get("alignment"))
    if kind == "acceptance":
        return _matrix(rows, arms, acceptance)
    raise SpecbenchError(f"unknown reward.alignment '{kind}'", f"use one of: {', '.join(ALIGNMENT_KINDS)}")


def speedup_matrix(rows: list[dict], arms: list[str]) -> torch.Tensor:
    """Measured speedup over autoregressive of each arm's speculative run (NaN where not measured)."""
    return _matrix(rows, arms, lambda rec, _: (rec.get("spec") or {}).get("speedup"))


def seconds_matrix(rows: list[dict], arms: list[str]) -> torch.Tensor:
    return _matrix(rows, arms, lambda rec, _: (rec.get("spec") or {}).get("seconds"))


def rewards(rows: list[dict], arms: list[str], spec: RewardSpec) -> torch.Tensor:
    """The reward ``[len(rows), len(arms)]`` of ``spec`` (NaN where an arm has no score for a query)."""
    if spec.source == "proxy":
        return reward_matrix(
            alignment_matrix(rows, arms, spec.alignment), cost_matrix(rows, arms, spec.cost), spec.alpha
        )
    sp = speedup_matrix(rows, arms)
    if torch.isnan(sp).all():
        raise SpecbenchError(
            "reward.source=measured but the rows have no speculative runs",
            "collect with collect.measure_speculative=true, or use reward.source=proxy",
        )
    return sp / sp.nan_to_num(0.0).max(dim=1, keepdim=True).values.clamp_min(1e-12)


def replay(rows: list[dict], idx: torch.Tensor, arms: list[str], chosen: list[str]) -> dict[str, float]:
    """Speedups replayed from the measured speculative runs on the queries ``idx``: the chosen arms,
    each single arm, the per-query fastest arm (oracle) and a uniformly random arm (expected)."""
    sub = [rows[int(i)] for i in idx]
    secs = seconds_matrix(sub, arms)
    ar = seconds_matrix(sub, [AUTOREGRESSIVE])[:, 0]
    if torch.isnan(secs).any() or torch.isnan(ar).any() or not len(sub):
        return {}
    total_ar = float(ar.sum())
    col = {a: i for i, a in enumerate(arms)}
    out = {"policy": total_ar / float(sum(secs[j, col[a]] for j, a in enumerate(chosen)))}
    for a in arms:
        out[a] = total_ar / float(secs[:, col[a]].sum())
    out["oracle"] = total_ar / float(secs.min(dim=1).values.sum())
    out["random"] = total_ar / float(secs.mean(dim=1).sum())
    return out


def proxy_check(rows: list[dict], arms: list[str], spec: RewardSpec) -> dict[str, float] | None:
    """How well the proxy reward (``spec``'s alpha, cost and alignment) ranks arms against the measured
    speedup, over the rows where both exist for at least two arms: mean Spearman rank correlation and
    top-1 agreement."""
    proxy = rewards(rows, arms, RewardSpec(spec.alpha, spec.cost, "proxy", spec.alignment))
    speed = speedup_matrix(rows, arms)
    rhos, top = [], []
    for p, s in zip(proxy, speed):
        ok = ~(torch.isnan(p) | torch.isnan(s))
        if int(ok.sum()) < 2:
            continue
        rp, rs = _ranks(p[ok]), _ranks(s[ok])
        if rp.std() > 0 and rs.std() > 0:
            rhos.append(float(torch.corrcoef(torch.stack([rp, rs]))[0, 1]))
        top.append(float(p[ok].argmax() == s[ok].argmax()))
    if not top:
        return None
    return {
        "spearman": sum(rhos) / len(rhos) if rhos else float("nan"),
        "top1_agreement": sum(top) / len(top),
        "queries": len(top),
    }


def _ranks(x: torch.Tensor) -> torch.Tensor:
    """Average ranks (ties share their mean rank)."""
    order = x.argsort()
    ranks = torch.empty_like(x)
    ranks[order] = torch.arange(len(x), dtype=x.dtype)
    for v in x.unique():
        tie = x == v
        ranks[tie] = ranks[tie].mean()
    return ranks


__all__ = [
    "ALIGNMENT_KINDS",
    "COSTS",
    "RewardSpec",
    "SOURCES",
    "acceptance",
    "alignment_matrix",
    "cost_matrix",
    "proxy_check",
    "replay",
    "rewards",
    "seconds_matrix",
    "speedup_matrix",
]
