"""The replay clock (``decoding/replay.py``): what a replayed round costs, predicted from measured curves.

``Costs`` holds the target's measured forward cost by scored tokens and context length, each drafter's catch-up
curve and set-up, and the verification overhead of each kind of round beyond the forward (``ROUND_KINDS``), which
``fit_overheads`` fits on a live run's own rounds; a switch back to a drafter used earlier in the query pays what a
live switch took beyond its catch-up curve (``SWITCH``). ``interpolate`` reads a curve between and past its points.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from specbench.errors import SpecbenchError


def interpolate(xs: Sequence[float], ys: Sequence[float], x: float) -> float:
    """Piecewise-linear through ``(xs, ys)`` (``xs`` increasing), extended linearly past both ends, >= 0."""
    if len(xs) == 1:
        return float(ys[0])
    i = min(max(bisect.bisect_left(xs, x), 1), len(xs) - 1)
    x0, x1, y0, y1 = xs[i - 1], xs[i], ys[i - 1], ys[i]
    return max(0.0, y0 + (y1 - y0) * (x - x0) / (x1 - x0))


AUTOREGRESSIVE_ROUND, CHAIN, TREE = "autoregressive", "chain", "tree"
ROUND_KINDS = (AUTOREGRESSIVE_ROUND, CHAIN, TREE)  # the kinds of round whose overhead is fitted apart


SWITCH = "switch"  # a round that switches back to drafters used before in the query: its catch-up's overhead


@dataclass(frozen=True)
class Costs:
    """The replay clock's cost curves: ``seconds[c][i]``, the target's forward over ``q[i]`` new tokens after a
    ``contexts[c]``-token context (``specbench profile``'s ``profile.json`` or the trace's ``costs.json``), and
    ``catch_up[name]``: ``(tokens, seconds)`` pairs of a drafter's ``sync`` over that many missed tokens;
    ``tree_extra``: the seconds a tree forward costs beyond a chain forward over as many tokens (its attention mask
    and the all-row softmax, measured by the trace: ``tree_extra_s`` in ``costs.json``; 0 in older traces), charged
    to every tree round."""

    q: tuple[int, ...]
    contexts: tuple[int, ...]
    seconds: tuple[tuple[float, ...], ...]
    catch_up: Mapping[str, tuple[tuple[int, float], ...]] = field(default_factory=dict)
    tree_extra: float = 0.0
    # per kind of round (ROUND_KINDS): the mean seconds a live verification took beyond the curve (fit_overheads)
    overheads: Mapping[str, float] = field(default_factory=dict)

    @classmethod
    def from_dict(cls, d: Mapping, catch_up: Mapping | None = None, tree_extra: float | None = None) -> Costs:
        try:
            q = tuple(int(x) for x in d["q"])
            contexts = tuple(int(c) for c in d["contexts"])
            seconds = tuple(tuple(float(s) for s in d["seconds"][str(c)]) for c in contexts)
        except (KeyError, TypeError, ValueError) as exc:
            raise SpecbenchError(
                f"the cost profile has no usable q / contexts / seconds ({exc!r})",
                "point profile_path at a `specbench profile` run, or trace again",
            ) from exc
        if not q or not contexts or any(len(s) != len(q) for s in seconds):
            raise SpecbenchError(
                "the cost profile's seconds do not match its q and contexts",
                "point profile_path at a `specbench profile` run, or trace again",
            )
        ups = catch_up if catch_up is not None else d.get("catch_up") or {}
        return cls(
            q,
            contexts,
            seconds,
            {name: tuple((int(n), float(s)) for n, s in pairs) for name, pairs in ups.items()},
            max(float(d.get("tree_extra_s") or 0.0) if tree_extra is None else float(tree_extra), 0.0),
        )

    def verify(self, q: int, context: int) -> float:
        """Seconds of one target forward over ``q`` new tokens after ``context`` tokens."""
        per = [interpolate(self.q, s, q) for s in self.seconds]
        return interpolate(self.contexts, per, context)

    def overhead(self, kind: str) -> float:
        """Seconds a round of ``kind`` (``ROUND_KINDS``) costs beyond its forward: the fitted overhead, else the
        trace's ``tree_extra`` for a tree round and 0 for the others."""
        if kind in self.overheads:
            return self.overheads[kind]
        return self.tree_extra if kind == TREE else 0.0

    def sync(self, name: str, tokens: int) -> float:
        """Seconds of ``name``'s catch-up over ``tokens`` missed tokens (0 for a drafter without a curve)."""
        pairs = self.catch_up.get(name)
        if not pairs or tokens <= 0:
            return 0.0
        return interpolate([n for n, _ in pairs], [s for _, s in pairs], tokens)


def round_kind(drafted: int, tree: bool) -> str:
    """A round's kind: a tree (several members, or a drafter's tree), a chain of drafted tokens, or one token."""
    return TREE if tree else CHAIN if drafted else AUTOREGRESSIVE_ROUND


def fit_overheads(
    costs: Costs, queries: Iterable[tuple[int, Sequence[Mapping]]]
) -> dict[str, tuple[float, int]]:
    """Per kind of round (``ROUND_KINDS``): ``(mean seconds, rounds)`` a live round's verification (``t_verify``)
    took beyond ``costs``' curve for a forward over as many tokens at its context; and for ``SWITCH``, what a live
    round that switched back to drafters used before (``switched``, not ``first_use``) took to catch them up
    (``t_switch``) beyond their catch-up curves over the tokens each missed. ``queries``: per live generation, its
    prompt length and its rounds in order (eval's round records: ``arm``, ``drafted``, ``tree_size``, ``members``,
    ``emitted``, ``t_verify``, ``t_switch``). The mean, not the median: the replay predicts total seconds."""
    residuals: dict[str, list[float]] = {k: [] for k in (*ROUND_KINDS, SWITCH)}
    for prompt_len, rounds in queries:
        t, synced = 0, {}  # drafter -> the position it last drafted at
        for r in rounds:
            tree_size = int(r.get("tree_size") or 0)
            members = list(r.get("members") or ()) or ([r.get("arm")] if int(r["drafted"]) else [])
            tree = tree_size > 0 or len(members) > 1
            scored = (tree_size if tree_size else int(r["drafted"])) + 1
            kind = round_kind(int(r["drafted"]), tree)
            residuals[kind].append(float(r["t_verify"]) - costs.verify(scored, prompt_len + t))
            if r.get("switched") and not r.get("first_use") and all(m in synced for m in members):
                curve = sum(costs.sync(m, t - synced[m]) for m in members if synced[m] != t)
                residuals[SWITCH].append(float(r.get("t_switch") or 0.0) - curve)
            t += int(r["emitted"])
            synced.update({m: t for m in members})
    return {k: (sum(v) / len(v), len(v)) for k, v in residuals.items() if v}
