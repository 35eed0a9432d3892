"""A/A runs: the same method twice in one run, on the main stream, so the report knows its own noise.

``again:<method>`` (``pipelines/methods.py``) runs a method a second time under another name, interleaved with the
rest like any method. Each pair (a method and its second run) is compared as any two methods are (paired per query,
speed ratio with a bootstrap interval), though nothing differs between them but the run-to-run noise of the clock:

- the **noise floor** at ``n`` queries: the 2.5-97.5% range of the pair's speed ratio over many random subsets of
  ``n`` of its queries (what a comparison of two equal methods shows by chance at that size);
- the **false-positive rate** of the verdict machinery: the share of those subsets on which ``verdicts.faster``
  judges one run of the method faster than the other (its interval excludes 1 on either side; the level promises
  about 5%).

The report's index then counts how many held speed verdicts have an effect inside the noise floor at their n (the
ones an A/A difference could have produced).

The **interval's calibration** (``aa_calibration.py``: :func:`false_hold_rows`, ``make aa-cpu``): the subsets above share one sample of
queries, so their false-hold rates share its luck. Exact nulls are drawn instead: ``n`` of a pair's queries with
replacement, the two runs swapped on each drawn query by a fair coin (under the null the two runs of a query are
exchangeable, so the drawn data's true ratio is exactly 1 by symmetry). Every interval method
(``intervals.INTERVALS``) judges "faster" both ways on the same draws; a held verdict either way is a false hold, and
the rate per side (held either way / 2) is set against the nominal (1 - LEVEL) / 2 = 2.5%.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pandas as pd

from specbench.arms import AUTOREGRESSIVE
from specbench.reproduction import intervals as CI
from specbench.reproduction import verdicts as V
from specbench.reproduction.aa_calibration import false_hold_rows, pairs_of
from specbench.reproduction.compare import pair_columns, paired, short_name, timed
from specbench.reproduction.exhibit import Exhibit, ExhibitSpec, Layout
from specbench.reproduction.inputs import NotRun, load_examples
from specbench.reproduction.published import Published
from specbench.reproduction.runs import EXAMPLES, METASD_EVAL

SIZES = (
    16,
    32,
    48,
    80,
)  # subset sizes of the noise floor (verdicts rest on 16 per task cell, 80 on the stream)
SUBSETS = 400  # random subsets per size (seeded)
SUBSET_RESAMPLES = 500  # bootstrap resamples per subset verdict (the false-positive rate)
REPORT_DRAWS = 300  # exact null draws per (pair, size) in the report's A/A exhibit (``make aa-cpu``: DRAWS)
KEY = "metasd/aa"


def ratios(a: pd.DataFrame, b: pd.DataFrame, idx: np.ndarray) -> np.ndarray:
    """Speed ratio of ``b`` over ``a`` (a's seconds per token / b's) on each row of query-index subsets ``idx``."""
    sa, ta = a.seconds.to_numpy(float)[idx].sum(-1), a.new_tokens.to_numpy(float)[idx].sum(-1)
    sb, tb = b.seconds.to_numpy(float)[idx].sum(-1), b.new_tokens.to_numpy(float)[idx].sum(-1)
    return (sa / ta) / (sb / tb)


def floor_rows(ex: pd.DataFrame, sizes=SIZES, subsets: int = SUBSETS, seed: int = CI.SEED) -> list[dict]:
    """One row per (pair, size): the noise floor and the false-positive rate of subsets of that size (module
    docstring; blank at sizes not below the pair's n, where every subset is the same set), and the false-hold rate
    of the verdicts' interval on exact null draws of that size (:func:`false_hold_rows`)."""
    rows = []
    for k, (first, again) in enumerate(pairs_of(ex)):
        p = paired(ex, [first, again])
        a, b = p[first], p[again]
        n = len(a)
        whole = V.faster(
            f"{short_name(again)} is faster than {short_name(first)}",
            timed(b),
            timed(a),
            (short_name(again), short_name(first)),
        )
        rng = np.random.default_rng(seed)
        null = {
            r["n"]: r["false_holds"]
            for r in false_hold_rows(
                [(first, "one process", pair_columns(a, b))],
                sizes,
                REPORT_DRAWS,
                seed + k,
                SUBSET_RESAMPLES,
                (CI.INTERVAL,),
            )
        }
        for size in sizes:
            row = {
                "method": short_name(first),
                "queries": n,
                "subset": size,
                "ratio_all": whole.effect,
                "ci_all": f"[{whole.interval[0]:.3f}, {whole.interval[1]:.3f}]" if whole.interval else "",
                "floor_lo": math.nan,
                "floor_hi": math.nan,
                "false_positive_rate": math.nan,
                "false_holds": math.nan,
                "null_false_holds": null[size],
            }
            if size < n:  # subsets of all n queries would all be the same set
                idx = np.stack([rng.choice(n, size=size, replace=False) for _ in range(subsets)])
                r = ratios(a, b, idx)
                judged = [
                    V.faster(
                        "",
                        timed(b.iloc[i]),
                        timed(a.iloc[i]),
                        boot=CI.Bootstrap(resamples=SUBSET_RESAMPLES, seed=j),
                    )
                    for j, i in enumerate(idx)
                ]
                row.update(
                    floor_lo=float(np.quantile(r, 0.025)),
                    floor_hi=float(np.quantile(r, 0.975)),
                    false_positive_rate=float(np.mean([v.held is not None for v in judged])),
                    false_holds=float(np.mean([v.held is True for v in judged])),
                )
            rows.append(row)
    return rows


def aa_exhibit(root: Path, published: list[Published], lay: Layout) -> Exhibit:
    ex = load_examples(root, METASD_EVAL.dir)
    if ex.empty:
        raise NotRun(f"{METASD_EVAL.dir}/{EXAMPLES}")
    rows = floor_rows(ex)
    table = pd.DataFrame(
        rows,
        columns=[
            "method",
            "queries",
            "subset",
            "ratio_all",
            "ci_all",
            "floor_lo",
            "floor_hi",
            "false_positive_rate",
            "false_holds",
            "null_false_holds",
        ],
    )
    if table.empty:
        notes = (
            "The main stream's run holds no A/A pair (`again:<method>` in its methods), so the report has no "
            "measured noise floor."
        )
    else:
        notes = (
            "Each method was run twice in the same process on the same queries (the second run named "
            "`again:<method>`), interleaved with every other method. ratio_all: speed ratio of the second run over "
            f"the first on all paired queries, with its 95% {CI.INTERVAL_TEXT}. floor_lo / floor_hi: the 2.5-97.5% "
            f"range of that ratio over {SUBSETS} random subsets of `subset` queries (seeded): a speed verdict at that "
            "n whose effect lies inside it could be an A/A difference. false_positive_rate: share of those subsets "
            "on which the verdict machinery judges one run faster than the other (interval excludes 1 either way; "
            f"the verdicts' own {CI.INTERVAL_TEXT}"
            + (f", {SUBSET_RESAMPLES} resamples each" if CI.INTERVAL != "t" else ", no resampling")
            + "; nominal 5%); false_holds: share judged `held` (nominal 2.5%). "
            "Subsets of one sample share its luck, so the interval is calibrated on exact nulls instead: "
            f"null_false_holds: the verdicts' `{CI.INTERVAL}` interval's false-hold rate per side over {REPORT_DRAWS} "
            "draws of `subset` queries with replacement, the two runs swapped on each by a fair coin (true ratio "
            "exactly 1; nominal 2.5%; `make aa-cpu` measures it on more pairs and chooses the interval)."
        )
    return Exhibit(
        "A/A: the same method twice in one run (noise floor and the verdicts' false-positive rate)",
        table,
        [],
        notes,
    )


def explained(verdicts: list[V.Verdict], floor: pd.DataFrame) -> tuple[int, int]:
    """(held speed verdicts whose effect lies inside the A/A noise floor at their n, held speed verdicts): the floor of
    the largest tabulated subset size at most the verdict's n (the widest band that applies), over every A/A pair.
    Timed verdicts only: a replayed one's times are predicted from cost curves, so timing noise cannot explain it."""
    held = [
        v
        for v in verdicts
        if v.held is True
        and v.label.startswith("speedup ratio")
        and v.effect is not None
        and not v.claim.startswith("[replayed]")
    ]  # replayed times are predicted: no run-to-run noise to explain
    count = 0
    floor = floor[floor.floor_lo.notna()]  # sizes with a measured floor (below the pair's n)
    for v in held:
        rows = floor[floor.subset <= (v.n or 0)]
        if rows.empty:
            continue
        band = rows[rows.subset == rows.subset.max()]
        lo, hi = float(band.floor_lo.min()), float(band.floor_hi.max())
        # an "at least x" claim's effect is set against its threshold: the band scaled to it
        scale = v.threshold if v.threshold and not math.isclose(v.threshold, 1.0) else 1.0
        count += lo * scale <= v.effect <= hi * scale
    return count, len(held)


def rate_line(verdicts: Sequence[V.Verdict], floor: pd.DataFrame) -> str:
    """The A/A false-hold rate of the verdicts' interval at each n its judged verdicts rest on (the largest
    tabulated size at most n, the highest over the A/A pairs), as one sentence; empty when none applies."""
    if floor.empty or "null_false_holds" not in floor:
        return ""
    parts = []
    for n in sorted({v.n for v in verdicts if v.p is not None and v.n}):
        rows = floor[(floor.subset <= n) & floor.null_false_holds.notna()]
        if rows.empty:
            continue
        size = int(rows.subset.max())
        parts.append(
            f"{float(rows[rows.subset == size].null_false_holds.max()):.1%} at n={size}"
            + (f" (for n={n})" if size != n else "")
        )
    if not parts:
        return ""
    return (
        f"A/A false holds of the `{CI.INTERVAL}` interval ([A/A]({KEY}.md)): {'; '.join(parts)} "
        f"(nominal {(1 - CI.LEVEL) / 2:.1%})."
    )


AA = ExhibitSpec(KEY, aa_exhibit, (METASD_EVAL,))

__all__ = ["AA", "AUTOREGRESSIVE", "explained", "floor_rows", "rate_line"]
