"""Speed and acceptance measures, defined once for every table (eval, bench, cascades, collect).

- speedup: baseline seconds per new token / method seconds per new token, totals over the examples
  both ran (the ratio of total seconds when both generated the same number of tokens, as lossless
  methods do in float32); the mean of the per-example ratios is reported beside it
  (``speedup_mean``), never instead of it;
- MAT (mean accepted tokens per target call): new tokens / target forwards, bonus token included
  (autoregressive decoding = 1.00);
- acceptance rate: accepted draft tokens / drafted tokens;
- rejection rate: rejected draft tokens / judged draft tokens (accepted + rejected: tokens after a
  rejection are never judged), the cost proxy of the speculative-cascades paper.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

NAN = float("nan")


def ratio(numerator: float, denominator: float) -> float:
    """``numerator / denominator``, NaN when the denominator is 0 (nothing to divide by)."""
    return numerator / denominator if denominator else NAN


def speedup(
    base_seconds: Sequence[float],
    method_seconds: Sequence[float],
    base_tokens: Sequence[int] | None = None,
    method_tokens: Sequence[int] | None = None,
) -> tuple[float, float]:
    """(total, mean of per-example) speedups over paired examples: the ratio of seconds per new token,
    baseline over method, so that outputs of different lengths (a bf16 fork that ends earlier or later)
    compare equal work. Total: ``(sum base s / sum base tokens) / (sum method s / sum method tokens)``.
    Without token counts (or when both sides generated the same tokens) it is the ratio of seconds."""
    if base_tokens is None or method_tokens is None:
        base_tokens = method_tokens = [1] * len(base_seconds)
    pairs = list(zip(base_seconds, method_seconds, base_tokens, method_tokens))
    if not pairs:
        return NAN, NAN
    total = ratio(
        ratio(sum(p[0] for p in pairs), sum(p[2] for p in pairs)),
        ratio(sum(p[1] for p in pairs), sum(p[3] for p in pairs)),
    )
    per = [ratio(ratio(b, nb), ratio(m, nm)) for b, m, nb, nm in pairs]
    return total, sum(per) / len(per)


def mat(new_tokens: int, target_calls: int) -> float:
    return ratio(new_tokens, target_calls)


def acceptance_rate(accepted: int, drafted: int) -> float:
    return ratio(accepted, drafted)


def rejection_rate(rejected: int, accepted: int) -> float:
    return ratio(rejected, accepted + rejected)


def rejections(rounds: Iterable[dict]) -> int:
    """Rounds whose draft the verifier cut short: fewer accepted than drafted and one target token emitted
    after the accepted prefix (a draft cut by an EOS inside its accepted prefix is not a rejection)."""
    return sum(1 for r in rounds if r["accepted"] < r["drafted"] and r["emitted"] == r["accepted"] + 1)
