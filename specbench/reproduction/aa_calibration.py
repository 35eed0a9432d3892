"""The interval's calibration on A/A runs (``make aa-cpu``): the false-hold rate of every interval method
(``intervals.INTERVALS``) on exact null draws of A/A pairs, per side against the nominal (1 - LEVEL) / 2.

A pair is a method and its second run: ``again:<method>`` in the same process, or the same method in a second run
(paired by query id across the two processes). A null draw takes ``n`` of a pair's queries with replacement and
swaps the two runs on each drawn query by a fair coin (under the null the two runs of a query are exchangeable, so
the drawn data's true ratio is exactly 1 by symmetry); every interval method judges "faster" both ways on the same
draws, and a held verdict either way is a false hold. The report's A/A exhibit (``noise.py``) reads its rates from
the same draws (``false_hold_rows``).

    python -m specbench.reproduction.aa_calibration RUN [RUN ...] [--draws 500] [--resamples N]
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

import numpy as np
import pandas as pd

from specbench.arms import AGAIN
from specbench.errors import SpecbenchError, exit_on
from specbench.files import atomic_write_text, existing
from specbench.reproduction import intervals as CI
from specbench.reproduction.compare import pair_columns, paired, short_name
from specbench.reproduction.inputs import load_examples
from specbench.reproduction.runs import EXAMPLES


def pairs_of(ex: pd.DataFrame) -> list[tuple[str, str]]:
    """(method, its second run) for every ``again:<method>`` of the run."""
    methods = set(ex.method)
    return [
        (m.removeprefix(AGAIN), m)
        for m in sorted(methods)
        if m.startswith(AGAIN) and m.removeprefix(AGAIN) in methods
    ]


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
    seed: int = CI.SEED,
    resamples: int = CI.RESAMPLES,
    intervals: Sequence[str] = CI.INTERVALS,
) -> list[dict]:
    """One row per (pair, n, interval method): the share of ``draws`` symmetrised null draws (:func:`null_draw`; the
    same draws for every method) on which the method's interval excludes 1, per side (held either way / 2), and
    the median interval width."""
    rows = []
    stat = CI.speed_ratio()
    for k, (method, processes, cols) in enumerate(pairs):
        for size in sizes:
            rng = np.random.default_rng([seed, k, size])
            data = [null_draw(cols, size, rng) for _ in range(draws)]
            for how in intervals:
                boot = CI.Bootstrap(interval=how, resamples=resamples)
                bounds = np.array(
                    [CI.bootstrap(d, stat, replace(boot, seed=i))[1:] for i, d in enumerate(data)],
                    dtype=float,
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
    nominal = (1 - CI.LEVEL) / 2
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
    good = [how for how in CI.INTERVALS if ok.get(how, False)]
    return min(good, key=lambda how: widths[how]) if good else None


def lowest(table: pd.DataFrame) -> list[str]:
    """The interval methods whose pooled false-hold rate is the lowest at every n of ``table``."""
    best = table.loc[table.groupby("n").false_holds.idxmin()]
    return [h for h in CI.INTERVALS if (best.interval == h).all()]


def calibration_page(runs: Sequence[Path], draws: int = DRAWS, resamples: int = CI.RESAMPLES) -> str:
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
        f"{(1 - CI.LEVEL) / 2:.1%} at every n); the verdicts use `intervals.INTERVAL = {CI.INTERVAL!r}`."
        if chosen
        else "**No interval method stays within the nominal rate at every n**; the lowest at every n: "
        f"{', '.join(f'`{h}`' for h in lowest(table)) or 'none'}; the verdicts use "
        f"`intervals.INTERVAL = {CI.INTERVAL!r}`. Draws of n queries with replacement from the pair's own queries "
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
            f'each judged "faster" both ways by every interval method at {CI.LEVEL:.0%} ({resamples} '
            "resamples); false_holds: held either way / 2, per side (nominal "
            f"{(1 - CI.LEVEL) / 2:.1%}); median_width: of the ratio's interval.",
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
        prog="python -m specbench.reproduction.aa_calibration",
        description="False-hold rates of each interval method on A/A runs (make aa-cpu); writes calibration.md "
        "into the first run directory.",
    )
    parser.add_argument(
        "runs", nargs="+", type=Path, help="eval run directories (the first holds again: pairs)"
    )
    parser.add_argument("--draws", type=int, default=DRAWS, help="exact null draws per (pair, n)")
    parser.add_argument("--resamples", type=int, default=CI.RESAMPLES, help="bootstrap resamples per draw")
    args = parser.parse_args(argv)
    try:
        existing(
            args.runs,
            "the eval run",
            "run `make aa-cpu` first (it writes the runs), or pass their directories",
        )
    except SpecbenchError as exc:
        exit_on(exc)
    page = calibration_page(args.runs, args.draws, args.resamples)
    atomic_write_text(args.runs[0] / "calibration.md", page)
    print(page)


if __name__ == "__main__":
    main()
