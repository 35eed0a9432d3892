"""Cost profiles of a target and its drafter pool, and the draft length they favour (pure functions).

A profile (``profile.json``, written by ``specbench profile``) holds, per context length, the target's
forward time over ``q`` new tokens relative to its one-token step at that context,
``c_verify(q) = t(q) / t(1)``, and per drafter its time per drafted token relative to the one-token step
at the smallest context, ``c_draft``. A round that drafts ``k`` tokens costs one target forward over
``q = k + 1`` new tokens (the last committed token and the draft) plus ``k`` drafted tokens, so in units
of the one-token step it costs ``c_verify(k + 1) + k * c_draft`` and yields ``accepted(k) + 1`` tokens,
where an autoregressive step costs 1 and yields 1: their ratio is the speedup the profile predicts
(``best_draft_length``). The time a drafter needs to catch up after a switch is not in it.

A drafter config's ``cost: measured`` reads its ``c_draft`` from a profile (``measured_cost``), which must
have been measured on the same target in the same dtype on the same kind of device.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from specbench.errors import SpecbenchError

MEASURED = "measured"  # a drafter config's ``cost`` read from a profile
PROFILE_FILE = "profile.json"
PROFILE_CSV = "profile.csv"  # the same profile as a table
FORMAT = 1  # profile.json's ``format``
DRAFT_LENGTHS = range(1, 17)  # the draft lengths ``best_draft_length`` considers


def how(dtype: str = "<its dtype>") -> str:
    """The command that measures a profile, for fix lines."""
    return f"specbench profile target=<this run's target> target.dtype={dtype} pool=<a pool with the drafter>"


# -- profiles --------------------------------------------------------------------------------------


def relative(seconds: Sequence[float]) -> list[float]:
    """Times relative to the first one (the one-token step): ``[t(q) / t(q_0) for q]``."""
    return [s / seconds[0] for s in seconds]


def torch_dtype_name(dtype) -> str:
    """``torch.bfloat16`` -> ``bfloat16``."""
    return str(dtype).removeprefix("torch.")


def identity(target) -> dict:
    """What a profile must match to describe a run's costs: the target model, its dtype, the device kind."""
    param = next(target.model.parameters())
    return {
        "target": str(target.loaded.name),
        "dtype": torch_dtype_name(param.dtype),
        "device": target.device.type,
    }


def profile_file(path: str | Path) -> Path:
    """``path`` itself, or the ``profile.json`` in it when it is a directory."""
    path = Path(path).expanduser()
    return path / PROFILE_FILE if path.is_dir() else path


def load_profile(path: str | Path) -> dict:
    """The profile at ``path`` (a ``profile.json`` or the run directory holding it)."""
    file = profile_file(path)
    if not file.is_file():
        raise SpecbenchError(
            f"profile_path={path}: no {PROFILE_FILE} there",
            f"measure one with `{how()}` and set profile_path to its run directory",
        )
    try:
        profile = json.loads(file.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise SpecbenchError(
            f"{file}: not a readable profile ({exc})", f"measure it again with `{how()}`"
        ) from exc
    if (
        not isinstance(profile, dict)
        or not isinstance(profile.get("drafters"), dict)
        or "target" not in profile
    ):
        raise SpecbenchError(
            f"{file}: not a profile written by `specbench profile` (no target or drafters)",
            f"measure one with `{how()}`",
        )
    profile["_file"] = str(file)
    return profile


def measured_cost(profile: Mapping | None, name: str, target) -> float:
    """Drafter ``name``'s ``c_draft`` in ``profile`` (None: no profile given), checked against ``target``."""
    mine = identity(target)
    fix = how(mine["dtype"])
    if profile is None:
        raise SpecbenchError(
            f"drafter '{name}' has cost: measured, but no profile is given (profile_path is null)",
            f"measure one with `{fix}` and pass profile_path=<its run directory>, or give the "
            f"drafter a number (pool.drafters.{name}.cost=<relative cost>)",
        )
    file = profile.get("_file", "the profile")
    theirs = {key: profile.get(key) for key in mine}
    if theirs != mine:

        def show(d: Mapping) -> str:
            return f"{d['target']} ({d['dtype']}, {d['device']})"

        raise SpecbenchError(
            f"{file} was measured on {show(theirs)}, not on this run's target {show(mine)}",
            f"measure this target with `{fix}` and point profile_path at that run",
        )
    entry = profile["drafters"].get(name)
    if entry is None:
        has = ", ".join(profile["drafters"]) or "none"
        raise SpecbenchError(
            f"{file} has no measured cost of drafter '{name}' (its drafters: {has})",
            f"profile a pool that includes '{name}' with `{fix}` and point profile_path at it",
        )
    cost = entry.get("c_draft") if isinstance(entry, Mapping) else None
    if isinstance(cost, bool) or not isinstance(cost, (int, float)) or not math.isfinite(cost) or cost < 0:
        raise SpecbenchError(
            f"{file} is damaged: drafters.{name}.c_draft is {cost!r}, not a non-negative number of seconds"
            + ("" if isinstance(entry, Mapping) else f" (the entry is {entry!r}, not a mapping)"),
            f"measure the pool again with `{fix}` (it rewrites the file), and point profile_path at that run",
        )
    return float(cost)


# -- best draft length -----------------------------------------------------------------------------


@dataclass(frozen=True)
class Acceptance:
    """A drafter's acceptance, from the rounds of its fixed method in an eval run.

    ``counts``: the accepted count of each full round at draft length ``K`` (``drafted == n_max == K``,
    ``K`` the largest ``n_max`` of the full rounds); ``alpha``: the per-token acceptance (``alpha_estimate``)
    over all its rounds; ``rounds``: how many rounds that was.
    """

    counts: tuple[int, ...]
    K: int
    alpha: float
    rounds: int


def drafter_rounds(rows: Iterable[Mapping], name: str) -> list[Mapping]:
    """The rounds of method ``fixed:<name>`` that drafter ``name`` played."""
    return [r for r in rows if r.get("method") == f"fixed:{name}" and r.get("arm") == name]


def alpha_estimate(rounds: Iterable[Mapping]) -> float:
    """The per-token acceptance ``alpha = sum(accepted) / sum(positions at risk)``.

    The model: each draft token is accepted with probability ``alpha`` once every token before it was.
    A round that drafted ``d >= 1`` tokens and had ``a`` accepted saw ``a`` acceptances and, when
    ``a < d``, one rejection (at ``a == d`` the draft ran out: censored), so its positions at risk are
    ``a + [a < d]``; the ratio is the maximum-likelihood estimate of this truncated geometric model.
    Rounds that drafted nothing carry no information; 0.0 when no round did.
    """
    accepted = at_risk = 0
    for r in rounds:
        d, a = int(r["drafted"]), int(r["accepted"])
        if d >= 1:
            accepted += a
            at_risk += a + (a < d)
    return accepted / at_risk if at_risk else 0.0


def acceptance_of(rounds: Sequence[Mapping]) -> Acceptance | None:
    """One drafter's ``Acceptance`` from its rounds (``drafter_rounds``); None without a full round."""
    full = [r for r in rounds if int(r["drafted"]) == int(r["n_max"]) >= 1]
    if not full:
        return None
    K = max(int(r["n_max"]) for r in full)
    counts = tuple(int(r["accepted"]) for r in full if int(r["n_max"]) == K)
    return Acceptance(counts=counts, K=K, alpha=alpha_estimate(rounds), rounds=len(rounds))


def expected_accepted(acc: Acceptance, k: int) -> tuple[float, bool]:
    """``(E[accepted(k)], extrapolated)`` for a draft of ``k`` tokens.

    Acceptance is a prefix (the first rejection ends it), so a round that drafted ``K`` tokens and had
    ``a`` accepted would have had exactly ``min(a, k)`` accepted with a draft of ``k <= K``: the mean of
    ``min(a, k)`` over the full rounds. Beyond ``K`` the tail is geometric: ``P(accepted >= K + i) =
    P(a >= K) * alpha ** i``, so ``E[accepted(k)] = E[accepted(K)] + P(a >= K) * sum_{i=1}^{k-K} alpha ** i``
    (extrapolated).
    """
    if k < 0:
        raise ValueError(f"draft length must be >= 0, got {k}")
    n = len(acc.counts)
    if k <= acc.K:
        return sum(min(a, k) for a in acc.counts) / n, False
    at_k = sum(acc.counts) / n  # every a <= K
    p_all = sum(a >= acc.K for a in acc.counts) / n
    return at_k + p_all * sum(acc.alpha**i for i in range(1, k - acc.K + 1)), True


def predicted_speedup(expected: float, verify: float, k: int, c_draft: float) -> float:
    """Tokens per round over the round's cost in one-token steps: ``(E + 1) / (c_verify(k + 1) + k c_draft)``."""
    return (expected + 1.0) / (verify + k * c_draft)


def best_draft_length(
    acc: Acceptance, c_verify: Mapping[int, float], c_draft: float, ks: Iterable[int] = DRAFT_LENGTHS
) -> list[dict]:
    """One row per draft length ``k`` of ``ks`` whose verification (``q = k + 1`` new tokens) ``c_verify``
    holds: ``k``, ``expected_accepted``, ``verify_cost`` (``c_verify(k + 1)``), ``draft_cost``
    (``k * c_draft``), ``predicted_speedup``, ``extrapolated`` (``k > K``), and ``best`` (true on the
    first ``k`` of the largest predicted speedup)."""
    rows = []
    for k in ks:
        if k + 1 not in c_verify:
            continue
        expected, extrapolated = expected_accepted(acc, k)
        verify = float(c_verify[k + 1])
        rows.append(
            {
                "k": k,
                "expected_accepted": expected,
                "verify_cost": verify,
                "draft_cost": k * c_draft,
                "predicted_speedup": predicted_speedup(expected, verify, k, c_draft),
                "extrapolated": extrapolated,
                "best": False,
            }
        )
    if rows:
        max(rows, key=lambda r: (r["predicted_speedup"], -r["k"]))["best"] = True
    return rows
