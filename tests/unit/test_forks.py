"""The fork classification of decoding/certify.py and the summary's tie / defect columns, on hand-made records."""

from __future__ import annotations

import math

import pytest
import torch

from specbench.decoding import certify
from specbench.pipelines import forks, speed, tables


def row(*pairs):
    """A decider row from (id, logit) pairs, best first."""
    return [[i for i, _ in pairs], [v for _, v in pairs]]


def test_deciders_are_the_top_rows_of_the_emitted_positions():
    logits = torch.tensor([[0.0, 3.0, 1.0, 2.0, -1.0], [5.0, 0.5, 0.25, 0.0, 4.0], [9.0, 9, 9, 9, 9]])
    got = certify.deciders(logits, 2)
    assert got == [
        [[1, 3, 2, 0, 4], [3.0, 2.0, 1.0, 0.0, -1.0]],
        [[0, 4, 1, 2, 3], [5.0, 4.0, 0.5, 0.25, 0.0]],
    ]
    assert certify.deciders(logits, 1, top=2) == [[[1, 3], [3.0, 2.0]]]


@pytest.mark.parametrize(
    "a, b, expected",
    [([1, 2, 3], [1, 2, 3], None), ([1, 2, 3], [1, 5, 3], 1), ([1, 2], [1, 2, 3], 2), ([4], [], 0)],
)
def test_first_divergence(a, b, expected):
    assert certify.first_divergence(a, b) == expected


def test_identical_outputs_have_no_fork():
    d = [row((7, 2.0), (8, 1.0))]
    assert certify.classify([7], d, [7], d, tolerance=0.5) is None


def test_a_near_tie_within_twice_the_tolerance_is_a_tie():
    base = [row((5, 1.0), (6, 0.0)), row((7, 3.0), (9, 2.9))]  # the baseline chose 7 over 9 by 0.1
    mine = [row((5, 1.0), (6, 0.0)), row((9, 3.0), (7, 2.85))]  # the method chose 9 over 7 by 0.15
    fork = certify.classify([5, 7], base, [5, 9], mine, tolerance=0.125)
    assert (fork.position, fork.base_token, fork.token) == (1, 7, 9)
    assert fork.base_margin == pytest.approx(0.1) and fork.margin == pytest.approx(0.15)
    assert fork.verdict == certify.TIE  # 0.25 <= 2 * 0.125
    # the same fork under a tighter tolerance cannot be rounding
    assert certify.classify([5, 7], base, [5, 9], mine, tolerance=0.12).verdict == certify.DEFECT


def test_a_fork_the_method_did_not_choose_by_argmax_is_a_defect():
    # the method emitted 9 although its own row ranked 7 first: a verifier that kept a rejected token
    base = [row((7, 3.0), (9, 2.99))]
    mine = [row((7, 3.0), (9, 2.99))]
    assert certify.classify([7], base, [9], mine, tolerance=10.0).verdict == certify.DEFECT


def test_a_token_outside_the_recorded_top_is_never_a_tie():
    base = [row((7, 3.0), (8, 2.99))]
    mine = [row((9, 3.0), (8, 2.99))]  # 7 is not among the method's recorded top entries
    fork = certify.classify([7], base, [9], mine, tolerance=10.0)
    assert fork.margin is None and fork.verdict == certify.DEFECT


def test_missing_deciders_make_a_fork_a_defect():
    assert (
        certify.classify([7], None, [9], [row((9, 1.0), (7, 1.0))], tolerance=1.0).verdict == certify.DEFECT
    )


def example(qid, method, ids, deciders, seconds=1.0, prompt="p", tol=0.5):
    return {
        "query_id": qid,
        "task": "t",
        "method": method,
        "output_ids": ids,
        "deciders": deciders,
        "tie_tolerance": tol,
        "prompt_sha": prompt,
        "new_tokens": len(ids),
        "seconds": seconds,
        "target_calls": len(ids),
        "rounds": len(ids),
        "drafted": 0,
        "accepted": 0,
        "switches": 0,
        "t_select": 0.0,
        "quality": {},
    }


def test_summary_counts_ties_and_defects_and_forks_lists_them():
    tie_base, tie_mine = [row((1, 1.0), (2, 0.9))], [row((2, 1.0), (1, 0.95))]
    bad = [row((1, 5.0), (2, 1.0))]
    examples = [
        example("q0", "autoregressive", [1], tie_base),
        example("q0", "fixed:x", [2], tie_mine),
        example("q1", "autoregressive", [1], bad),
        example("q1", "fixed:x", [2], [row((2, 5.0), (1, 1.0))]),
        example("q2", "autoregressive", [3], [row((3, 1.0), (4, 0.0))]),
        example("q2", "fixed:x", [3], [row((3, 1.0), (4, 0.0))]),
        # a later turn after a differing prompt: inherited, counted neither as a tie nor as a defect
        example("q3", "autoregressive", [1], tie_base, prompt="a"),
        example("q3", "fixed:x", [2], bad, prompt="b"),
    ]
    table = tables.summarize(examples)
    got = table[(table.task == "all") & (table.method == "fixed:x")].iloc[0]
    assert (got.ties, got.defects, got.exact_match) == (1.0, 1.0, 0.25)
    found = forks.forks(examples)
    assert dict(zip(found.query_id, found.verdict)) == {"q0": "tie", "q1": "defect", "q3": "inherited"}
    base = table[(table.task == "all") & (table.method == "autoregressive")].iloc[0]
    assert (base.ties, base.defects) == (0.0, 0.0)


def test_sampling_records_have_no_verdict_columns():
    examples = [example("q0", "autoregressive", [1], None), example("q0", "fixed:x", [2], None)]
    got = tables.summarize(examples)
    assert math.isnan(got.iloc[-1].ties) and math.isnan(got.iloc[-1].defects)


def test_speedup_compares_seconds_per_token():
    # the method took as long but made twice the tokens: twice as fast per token
    assert speed.speedup([2.0], [2.0], [10], [20]) == (2.0, 2.0)
    # equal lengths: the plain ratio of seconds
    assert speed.speedup([3.0, 1.0], [1.0, 1.0], [5, 5], [5, 5]) == pytest.approx((2.0, 2.0))
    assert speed.speedup([3.0, 1.0], [1.0, 1.0]) == pytest.approx((2.0, 2.0))
