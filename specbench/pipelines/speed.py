"""Speed and acceptance measures, defined once for every table (eval, bench, cascades, collect).

- speedup: total baseline seconds / total method seconds over the examples both ran; the mean of
  the per-example ratios is reported beside it (``speedup_mean``), never instead of it;
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


def speedup(base_seconds: Sequence[float], method_seconds: Sequence[float]) -> tuple[float, float]:
    """(total base / total method, mean of per-example base / method) over paired examples."""
    pairs = [(b, m) for b, m in zip(base_seconds, method_seconds)]
    if not pairs:
        return NAN, NAN
    total = ratio(sum(b for b, _ in pairs), sum(m for _, m in pairs))
    per = [ratio(b, m) for b, m in pairs]
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
