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

The **interval's calibration** (:func:`false_hold_rows`, ``make aa-cpu``): the subsets above share one sample of
queries, so their false-hold rates share its luck. Exact nulls are drawn instead: ``n`` of a pair's queries with
replacement, the two runs swapped on each drawn query by a fair coin (under the null the two runs of a query are
exchangeable, so the drawn data's true ratio is exactly 1 by symmetry). Every interval method
(``verdicts.INTERVALS``) judges "faster" both ways on the same draws; a held verdict either way is a false hold, and
the rate per side (held either way / 2) is set against the nominal (1 - LEVEL) / 2 = 2.5%.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

import numpy as np
import pandas as pd

from specbench.arms import AUTOREGRESSIVE
from specbench.errors import SpecbenchError
from specbench.files import atomic_write_text
from specbench.pipelines.methods import AGAIN
from specbench.reproduction import verdicts as V
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


def pairs_of(ex: pd.DataFrame) -> list[tuple[str, str]]:
    """(method, its second run) for every ``again:<method>`` of the run."""
    methods = set(ex.method)
    return [
        (m.removeprefix(AGAIN), m)
        for m in sorted(methods)
        if m.startswith(AGAIN) and m.removeprefix(AGAIN) in methods
    ]


def ratios(a: pd.DataFrame, b: pd.DataFrame, idx: np.ndarray) -> np.ndarray:
    """Speed ratio of ``b`` over ``a`` (a's seconds per token / b's) on each row of query-index subsets ``idx``."""
    sa, ta = a.seconds.to_numpy(float)[idx].sum(-1), a.new_tokens.to_numpy(float)[idx].sum(-1)
    sb, tb = b.seconds.to_numpy(float)[idx].sum(-1), b.new_tokens.to_numpy(float)[idx].sum(-1)
    return (sa / ta) / (sb / tb)


def floor_rows(ex: pd.DataFrame, sizes=SIZES, subsets: int = SUBSETS, seed: int = V.SEED) -> list[dict]:
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
                (V.INTERVAL,),
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
                        boot=V.Bootstrap(resamples=SUBSET_RESAMPLES, seed=j),
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
            f"the first on all paired queries, with its 95% {V.INTERVAL_TEXT}. floor_lo / floor_hi: the 2.5-97.5% "
            f"range of that ratio over {SUBSETS} random subsets of `subset` queries (seeded): a speed verdict at that "
            "n whose effect lies inside it could be an A/A difference. false_positive_rate: share of those subsets "
            "on which the verdict machinery judges one run faster than the other (interval excludes 1 either way; "
            f"{SUBSET_RESAMPLES} resamples each; nominal 5%); false_holds: share judged `held` (nominal 2.5%). "
            "Subsets of one sample share its luck, so the interval is calibrated on exact nulls instead: "
            f"null_false_holds: the verdicts' `{V.INTERVAL}` interval's false-hold rate per side over {REPORT_DRAWS} "
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
        f"A/A false holds of the `{V.INTERVAL}` interval ([A/A]({KEY}.md)): {'; '.join(parts)} "
        f"(nominal {(1 - V.LEVEL) / 2:.1%})."
    )


CALIBRATION_SIZES = (16, 32, 80)  # the verdicts' n: a task cell, two cells, the mixed stream
DRAWS = 500  # symmetrised null draws per (pair, n): the rate's binomial error about 0.5% per side at 2.5%


def aa_pairs(runs: Sequence[pd.DataFrame]) -> list[tuple[str, str, dict[str, np.ndarray]]]:
    """(method, "one process" | "two processes", its paired columns) for every A/A pair of ``runs``: each run's
    ``again:`` pairs (the same process), and each method of the first run that a second run ran too (paired by query
    id across the two processes)."""
    out = []
    for ex in runs:
        for first, again in pairs_of(ex):
            p = paired(ex, [first, again])
            out.append((short_name(first), "one process", pair_columns(p[first], p[again])))
    if len(runs) > 1:
        one, two = runs[0], runs[1]
        for m in [m for m in dict.fromkeys(two.method) if not str(m).startswith(AGAIN)]:
            a = one[one.method == m].set_index("query_id")
            b = two[two.method == m].set_index("query_id")
            common = sorted(set(a.index) & set(b.index), key=str)
            if common:
                out.append((short_name(m), "two processes", pair_columns(a.loc[common], b.loc[common])))
    return out


def null_draw(cols: dict[str, np.ndarray], n: int, rng: np.random.Generator) -> dict[str, np.ndarray]:
    """``n`` queries drawn with replacement, the two runs swapped on each by a fair coin (an exact A/A null)."""
    idx = rng.integers(0, len(cols["a_s"]), n)
    swap = rng.random(n) < 0.5
    return {
        f"{x}_{c}": np.where(swap, cols[f"{y}_{c}"][idx], cols[f"{x}_{c}"][idx])
        for x, y in (("a", "b"), ("b", "a"))
        for c in ("s", "t")
    }


def false_hold_rows(
    pairs: Sequence[tuple[str, str, dict[str, np.ndarray]]],
    sizes: Sequence[int] = CALIBRATION_SIZES,
    draws: int = DRAWS,
    seed: int = V.SEED,
    resamples: int = V.RESAMPLES,
    intervals: Sequence[str] = V.INTERVALS,
) -> list[dict]:
    """One row per (pair, n, interval method): the share of ``draws`` symmetrised null draws (:func:`null_draw`; the
    same draws for every method) on which the method's interval excludes 1, per side (held either way / 2), and
    the median interval width."""
    rows = []
    stat = V.speed_ratio()
    for k, (method, processes, cols) in enumerate(pairs):
        for size in sizes:
            rng = np.random.default_rng([seed, k, size])
            data = [null_draw(cols, size, rng) for _ in range(draws)]
            for how in intervals:
                boot = V.Bootstrap(interval=how, resamples=resamples)
                bounds = np.array(
                    [V.bootstrap(d, stat, replace(boot, seed=i))[1:] for i, d in enumerate(data)], dtype=float
                )
                rows.append(
                    {
                        "method": method,
                        "processes": processes,
                        "queries": len(cols["a_s"]),
                        "n": size,
                        "interval": how,
                        "false_holds": float(np.mean((bounds[:, 0] > 1) | (bounds[:, 1] < 1)) / 2),
                        "draws": draws,
                        "median_width": float(np.median(bounds[:, 1] - bounds[:, 0])),
                    }
                )
    return rows


def wilson(hits: float, total: int, z: float = 1.96) -> tuple[float, float]:
    """Wilson's 95% interval of a binomial share (``hits`` of ``total``)."""
    if not total:
        return math.nan, math.nan
    p = hits / total
    centre = (p + z * z / (2 * total)) / (1 + z * z / total)
    half = z * math.sqrt(p * (1 - p) / total + z * z / (4 * total * total)) / (1 + z * z / total)
    return centre - half, centre + half


def pooled(rows: pd.DataFrame) -> pd.DataFrame:
    """Per (interval method, n): the false-hold rate pooled over every pair (each side of each draw one trial), its
    Wilson interval, the median width, and whether it stays at most the nominal rate."""
    nominal = (1 - V.LEVEL) / 2
    out = []
    for (how, n), g in rows.groupby(["interval", "n"], sort=False):
        trials = int(2 * g.draws.sum())
        hits = float((2 * g.false_holds * g.draws).sum())
        lo, hi = wilson(hits, trials)
        out.append(
            {
                "interval": how,
                "n": int(n),
                "false_holds": hits / trials,
                "ci": f"[{lo:.4f}, {hi:.4f}]",
                "trials": trials,
                "median_width": float(g.median_width.median()),
                "within_nominal": hits / trials <= nominal,
            }
        )
    return pd.DataFrame(out)


def choose(table: pd.DataFrame) -> str | None:
    """The interval method whose pooled false-hold rate is at most the nominal at every n, the narrowest of those
    (median width summed over n); None when none is."""
    ok = table.groupby("interval").within_nominal.all()
    widths = table.groupby("interval").median_width.sum()
    good = [how for how in V.INTERVALS if ok.get(how, False)]
    return min(good, key=lambda how: widths[how]) if good else None


def lowest(table: pd.DataFrame) -> list[str]:
    """The interval methods whose pooled false-hold rate is the lowest at every n of ``table``."""
    best = table.loc[table.groupby("n").false_holds.idxmin()]
    return [h for h in V.INTERVALS if (best.interval == h).all()]


def calibration_page(runs: Sequence[Path], draws: int = DRAWS, resamples: int = V.RESAMPLES) -> str:
    """The page of ``make aa-cpu``: every A/A pair's false-hold rate per interval method and n, pooled, and the
    choice (:func:`choose`)."""
    frames = [load_examples(Path(r).parent, Path(r).name) for r in runs]
    if not frames or frames[0].empty:
        raise SpecbenchError(
            f"no per-query records in {runs[0]}/{EXAMPLES}" if runs else "no A/A run given",
            "run `make aa-cpu` (specbench eval experiment=aa_cpu) first, or pass the run directories it wrote",
        )
    pairs = aa_pairs(frames)
    if not pairs:
        raise SpecbenchError(
            f"{runs[0]} holds no A/A pair",
            "run a method twice (methods: [..., again:<method>]) or pass a second run of the same queries",
        )
    rows = pd.DataFrame(false_hold_rows(pairs, draws=draws, resamples=resamples))
    table = pooled(rows)
    chosen = choose(table)
    verdict = (
        f"**Chosen: `{chosen}`** (the narrowest interval whose pooled false-hold rate is at most "
        f"{(1 - V.LEVEL) / 2:.1%} at every n); the verdicts use `verdicts.INTERVAL = {V.INTERVAL!r}`."
        if chosen
        else "**No interval method stays within the nominal rate at every n**; the lowest at every n: "
        f"{', '.join(f'`{h}`' for h in lowest(table)) or 'none'}; the verdicts use "
        f"`verdicts.INTERVAL = {V.INTERVAL!r}`. Draws of n queries with replacement from the pair's own queries "
        "repeat some of them (at n = 80 from 120, about a fifth), which the bootstrap reads as more information than "
        "there is: the rates at the larger n are upper bounds."
    )
    return "\n".join(
        [
            "## A/A calibration of the verdicts' interval",
            "",
            f"Runs: {', '.join(f'`{r}`' for r in runs)}. Each pair is one method run twice: `one process` pairs a "
            "method with its `again:` run (interleaved query by query in one process); `two processes` pairs a "
            "method of the first run with the same method in the second run. For each pair and n: "
            f"{draws} exact null draws (n queries with replacement, the two runs swapped on each by a fair coin), "
            f'each judged "faster" both ways by every interval method at {V.LEVEL:.0%} ({resamples} '
            "resamples); false_holds: held either way / 2, per side (nominal "
            f"{(1 - V.LEVEL) / 2:.1%}); median_width: of the ratio's interval.",
            "",
            "### Pooled over the pairs (Wilson 95% interval of the rate)",
            "",
            table.to_markdown(index=False, floatfmt=".4f"),
            "",
            verdict,
            "",
            "### Per pair",
            "",
            rows.to_markdown(index=False, floatfmt=".4f"),
            "",
        ]
    )


def main(argv: Sequence[str] | None = None) -> None:
    import argparse

    parser = argparse.ArgumentParser(
        prog="python -m specbench.reproduction.noise",
        description="False-hold rates of each interval method on A/A runs (make aa-cpu); writes calibration.md "
        "into the first run directory.",
    )
    parser.add_argument(
        "runs", nargs="+", type=Path, help="eval run directories (the first holds again: pairs)"
    )
    parser.add_argument("--draws", type=int, default=DRAWS, help="exact null draws per (pair, n)")
    parser.add_argument("--resamples", type=int, default=V.RESAMPLES, help="bootstrap resamples per draw")
    args = parser.parse_args(argv)
    page = calibration_page(args.runs, args.draws, args.resamples)
    atomic_write_text(args.runs[0] / "calibration.md", page)
    print(page)


AA = ExhibitSpec(KEY, aa_exhibit, (METASD_EVAL,))

__all__ = ["AA", "AUTOREGRESSIVE", "explained", "false_hold_rows", "floor_rows", "pairs_of", "rate_line"]

if __name__ == "__main__":
    main()
