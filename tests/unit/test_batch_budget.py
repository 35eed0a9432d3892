"""The batch budget's pure parts (``decoding/batch_budget.py``): the forward cost grid (exact at its points, linear
between, extended beyond, never cheaper for more), the cap of the most expected tokens per second (none where the
forward's cost grows as fast as the tokens, the whole draft where it is flat, a short cap in between), and the
acceptance statistics it learns from verdicts."""

from __future__ import annotations

import pytest

from specbench.decoding.batch_budget import BatchBudget, ForwardCosts, best_cap, path_chances
from specbench.decoding.drafter import Draft
from specbench.errors import SpecbenchError

GRID = ForwardCosts((1, 4), (1, 3), ((1.0, 2.0), (3.0, 7.0)))


def test_forward_costs_are_exact_at_the_grid_and_linear_between():
    assert GRID(1, 1) == 1.0 and GRID(4, 3) == 7.0 and GRID(1, 3) == 2.0
    assert GRID(1, 2) == pytest.approx(1.5)
    assert GRID(2, 1) == pytest.approx(1.0 + 2.0 / 3)  # a third of the way from 1 to 4 rows
    assert GRID(4, 5) == pytest.approx(11.0)  # beyond q: the last segment's slope (2 s a token)
    assert GRID(8, 1) == pytest.approx(3.0 + 4 * 2.0 / 3)  # beyond rows: the same


def test_a_noisy_grid_never_makes_a_longer_forward_cheaper():
    noisy = ForwardCosts((1,), (1, 2, 3), ((1.0, 0.9, 1.2),))
    assert noisy(1, 2) >= noisy(1, 1)


@pytest.mark.parametrize(
    "rows, q, seconds",
    [((2, 1), (1,), ((1.0,), (1.0,))), ((1,), (1, 2), ((1.0,),)), ((1,), (1,), ((0.0,),))],
)
def test_a_malformed_grid_is_refused(rows, q, seconds):
    with pytest.raises(SpecbenchError, match="grid"):
        ForwardCosts(rows, q, seconds)


def test_the_grid_survives_its_cache_form():
    assert ForwardCosts.from_dict(GRID.as_dict()) == GRID
    with pytest.raises(SpecbenchError, match="rows"):
        ForwardCosts.from_dict({"q": [1]})


def test_path_chances_multiply_along_the_chain():
    assert path_chances([0.5, 0.5, 1.0]) == [0.5, 0.25, 0.25]


def test_the_cap_is_none_when_every_token_costs_a_step_and_all_when_tokens_are_free():
    chances = [[0.9, 0.8, 0.7], [0.5]]
    assert best_cap(chances, lambda q: float(q))[0] == 0  # (2 + E) / (1 + L) < 2 for any L
    cap, expected, seconds = best_cap(chances, lambda q: 1.0)
    assert cap == 3 and expected == pytest.approx(0.9 + 0.8 + 0.7 + 0.5) and seconds == 1.0


def test_the_cap_stops_where_the_next_token_costs_more_than_it_brings():
    # 2 rows; each token a row adds a tenth of a step: a position pays while its two rows' chances beat 0.2 * rate
    chances = [[0.9, 0.5, 0.05], [0.9, 0.4, 0.05]]
    cap, expected, seconds = best_cap(chances, lambda q: 1.0 + 0.1 * (q - 1))
    rate = {L: (2 + sum(sum(c[:L]) for c in chances)) / (1.0 + 0.1 * L) for L in range(4)}
    assert cap == max(rate, key=rate.get) == 2
    assert expected == pytest.approx(2.7) and seconds == pytest.approx(1.2)


def test_the_budget_learns_that_a_drafter_is_rejected_and_stops_drafting_it():
    costs = ForwardCosts((1, 2), (1, 5), ((1.0, 1.4), (1.2, 1.8)))
    budget = BatchBudget(costs, prior=2.0)
    draft = Draft([1, 2, 3, 4], None)
    cap, expected, seconds = budget.plan([("weak", draft), ("weak", draft)])
    # the prior: a half a depth; at 2 rows a token a row costs 0.15 s: (2 + 2 * 0.75) / 1.5 beats every other cap
    assert cap == 2 and expected == pytest.approx([0.75, 0.75]) and seconds == pytest.approx(1.5)
    for _ in range(20):
        budget.observe("weak", draft, 0)  # the first token rejected: depth 1 seen, the rest never judged
    assert budget.chances("weak", draft)[0] < 0.1
    assert budget.chances("other", draft)[0] == 0.5  # statistics are per drafter
    assert budget.plan([("weak", draft), ("weak", draft)])[0] == 0


def test_a_scored_draft_is_calibrated_by_its_own_scores():
    budget = BatchBudget(ForwardCosts((1,), (1,), ((1.0,),)), prior=2.0)
    sure, unsure = Draft([1, 2], None, scores=[0.95, 0.9]), Draft([1, 2], None, scores=[0.15, 0.1])
    assert budget.chances("suffix", sure)[0] > budget.chances("suffix", unsure)[0]
    for _ in range(30):
        budget.observe("suffix", unsure, 2)  # low scores that the target accepts anyway
    assert budget.chances("suffix", unsure)[0] > 0.8


def _random_budget(rng, scored: bool) -> tuple[BatchBudget, list[Draft]]:
    """A budget with random costs and statistics, and random drafts of its drafter (scored or not)."""
    step = rng.uniform(0.02, 1.2)  # seconds a row's extra token adds, from nearly free to more than a step
    costs = ForwardCosts((1, 8), (1, 6), tuple((1.0 * r, 1.0 * r + step * r * 5) for r in (1, 8)))
    budget = BatchBudget(costs, prior=2.0)
    for _ in range(rng.randrange(0, 40)):
        n = rng.randrange(1, 6)
        made = Draft(list(range(n)), None, scores=sorted((rng.random() for _ in range(n)), reverse=True))
        budget.observe("d", made if scored else Draft(made.tokens, None), rng.randrange(0, n + 1))
    drafts = []
    for _ in range(rng.randrange(1, 8)):
        n = rng.randrange(0, 6)
        scores = sorted((rng.random() for _ in range(n)), reverse=True) if scored else None
        drafts.append(Draft(list(range(n)), None, scores=scores))
    return budget, drafts


@pytest.mark.parametrize("scored", [False, True])
def test_when_no_cap_could_pay_before_drafting_the_plan_of_any_drafts_is_no_cap(scored):
    # the bound behind skipping the drafting (decoding/batch.py): drafts of at most k tokens, whatever they are,
    # are never planned a cap when ``may_draft`` says no cap could pay; both answers occur in the seeded cases
    import random

    rng, answers = random.Random(57), set()
    for _ in range(400):
        budget, drafts = _random_budget(rng, scored)
        may = budget.may_draft([("d", 5, scored)] * len(drafts))
        answers.add(may)
        if not may:
            assert budget.plan([("d", d) for d in drafts])[0] == 0
    assert answers == {True, False}


def test_an_unscored_drafter_is_bounded_by_its_depth_and_a_scored_one_by_its_best_bin():
    budget = BatchBudget(ForwardCosts((1,), (1,), ((1.0,),)), prior=2.0)
    for _ in range(30):
        budget.observe("d", Draft([1, 2], None), 0)  # depth 1 always rejected
    assert budget.ceiling("d", 2, scored=False)[0] < 0.1
    assert budget.ceiling("d", 2, scored=True)[0] > 0.9  # an unseen top score bin keeps its prior (0.95)


def test_a_damaged_cached_cost_profile_is_measured_again_naming_its_file(tmp_path, caplog):
    """Issue 71: one ``seconds`` value "abc" in a cached batch profile stopped the run with a fix that named no file;
    it is measured again (``read_cached`` returns nothing) with a warning naming the file, as a garbage file is."""
    import json
    import logging

    from specbench.decoding.batch_budget import ForwardCosts
    from specbench.pipelines.cost_cache import budget_costs_of, read_cached

    key = {"machine": "m"}
    path = tmp_path / "batch-x.json"
    good = {"rows": [1, 2], "q": [1, 4], "seconds": [[0.01, 0.02], [0.02, 0.03]]}
    path.write_text(json.dumps({"key": key, "costs": good}))
    assert read_cached(path, key, ForwardCosts.from_dict)(2, 4) == 0.03
    path.write_text(json.dumps({"key": key, "costs": {**good, "seconds": [[0.01, "abc"], [0.02, 0.03]]}}))
    with caplog.at_level(logging.WARNING):
        assert read_cached(path, key, ForwardCosts.from_dict) is None
    assert str(path) in caplog.text and "measuring again" in caplog.text
    path.write_text(json.dumps({"key": key, "costs": {"verify": [0.01, "x"], "draft": {"a": 0.001}}}))
    assert read_cached(path, key, budget_costs_of) is None
    path.write_text(json.dumps({"key": key, "costs": {"verify": [0.01, 0.002], "draft": {"a": 0.001}}}))
    assert (
        read_cached(path, key, budget_costs_of) is None
    )  # one context, not measured: a profile before issue 69
    profile = {
        "contexts": [64, 512],
        "verify": [[0.01, 0.002], [0.02, 0.003]],
        "draft": {"a": [0.001, 0.002]},
    }
    path.write_text(json.dumps({"key": key, "costs": {**profile, "profiled": True}}))
    assert read_cached(path, key, budget_costs_of)["verify"] == [[0.01, 0.002], [0.02, 0.003]]
