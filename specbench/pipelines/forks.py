"""Where a method's output first departs from the autoregressive output of the same query (``forks.csv``): each
fork certified as a rounding tie or flagged a defect (``decoding/certify.py``), the summary's ``defects`` counted
from these verdicts."""

from __future__ import annotations

from collections.abc import Iterable

import pandas as pd

from specbench.arms import AUTOREGRESSIVE
from specbench.decoding import certify

INHERITED = "inherited"  # a fork after an earlier turn's fork: the prompts differ, the earlier fork carries the verdict


def fork_of(example: dict, base: dict | None) -> dict | None:
    """How ``example``'s output first departs from the autoregressive output ``base`` of the same query:
    None when identical or not judgeable (no baseline, or either run kept no deciders: sampling, lossy
    cascade rules, records of older versions); else the fork (``certify.classify``) with its verdict,
    ``inherited`` when the two prompts differ (an earlier turn of the conversation forked)."""
    if base is None or list(example["output_ids"]) == list(base["output_ids"]):
        return None
    mine, theirs = example.get("deciders"), base.get("deciders")
    if mine is None or theirs is None:
        return None
    tolerance = example.get("tie_tolerance")
    fork = certify.classify(
        base["output_ids"],
        theirs,
        example["output_ids"],
        mine,
        float(tolerance) if tolerance is not None else 0.0,
    ).as_dict()
    if example.get("prompt_sha") and base.get("prompt_sha") and example["prompt_sha"] != base["prompt_sha"]:
        fork["verdict"] = INHERITED
    fork.update(
        query_id=example["query_id"], task=example["task"], method=example["method"], tolerance=tolerance
    )
    return fork


def forks(examples: Iterable[dict], baseline: str = AUTOREGRESSIVE) -> pd.DataFrame:
    """Every fork of a method's output from the baseline's output of the same query (:func:`fork_of`)."""
    examples = list(examples)
    base = {e["query_id"]: e for e in examples if e["method"] == baseline}
    rows = [
        f
        for e in examples
        if e["method"] != baseline
        for f in [fork_of(e, base.get(e["query_id"]))]
        if f is not None
    ]
    return pd.DataFrame(
        rows,
        columns=[
            "task",
            "query_id",
            "method",
            "position",
            "base_token",
            "token",
            "base_margin",
            "margin",
            "tolerance",
            "verdict",
        ],
    )
