"""The Spec-Bench leaderboard's reference rows (paper scale): each drafter alone on Spec-Bench's question.jsonl,
our speedups beside the published ones, and whether EAGLE is the fastest of them, as on the leaderboard."""

from __future__ import annotations

import math
from pathlib import Path

import pandas as pd

from specbench.pipelines.tables import ALL_TASKS
from specbench.records import SUMMARY_CSV
from specbench.reproduction import verdicts as V
from specbench.reproduction.compare import faster_on, fixed_methods, short_name, with_published
from specbench.reproduction.exhibit import Exhibit, ExhibitSpec, Layout
from specbench.reproduction.inputs import drafter_speeds, load_examples, run_table
from specbench.reproduction.published import Published
from specbench.reproduction.runs import EXAMPLES, SPEC_BENCH_EVAL

SPEC_BENCH_ROWS = {"vicuna_68m": "SpS (vicuna-68m)", "prompt_lookup": "prompt lookup", "eagle": "EAGLE"}


def spec_bench_leaderboard(root: Path, published: list[Published], lay: Layout) -> Exhibit:
    summary = run_table(root, f"{SPEC_BENCH_EVAL.dir}/{SUMMARY_CSV}")
    ds = drafter_speeds(summary)
    tasks = [t for t in ds if t != ALL_TASKS]
    table = pd.DataFrame(
        [
            {"method": SPEC_BENCH_ROWS.get(d, d), "speedup": v, **{t: ds[t].get(d, math.nan) for t in tasks}}
            for d, v in ds.get(ALL_TASKS, {}).items()
        ]
    )
    table = with_published(
        table, published, "spec_bench", "leaderboard", {r: r for r in SPEC_BENCH_ROWS.values()}, ["speedup"]
    )
    ex = load_examples(root, SPEC_BENCH_EVAL.dir)
    claim = "EAGLE is the fastest of the reference drafters, as on the leaderboard"
    verdict = (
        V.all_of(
            claim,
            [
                (f"vs {short_name(d)}", faster_on(ex, "", "fixed:eagle", d))
                for d in fixed_methods(ex)
                if d != "fixed:eagle"
            ],
            "each part: speedup ratio EAGLE / that drafter > 1",
        )
        if "fixed:eagle" in set(ex.method)
        else V.missing(
            claim, f"per-query records of EAGLE ({SPEC_BENCH_EVAL.dir}/{EXAMPLES})", "speedup ratio"
        )
    )
    return Exhibit(
        "Spec-Bench reference rows: each drafter alone on question.jsonl",
        table,
        [verdict],
        "Speedup over autoregressive decoding on every question and turn of Spec-Bench's question.jsonl "
        "(greedy, 1024 new tokens). Our drafters draft a chain of draft_length tokens; Spec-Bench's SpS uses "
        "Hugging Face's adaptive assistant length and EAGLE a tree, so equal numbers are not expected.",
    )


LEADERBOARD = ExhibitSpec(
    "spec_bench/leaderboard", spec_bench_leaderboard, (SPEC_BENCH_EVAL,), ("spec_bench/leaderboard",)
)
