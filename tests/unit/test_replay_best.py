"""Issue 56: a replay's best drafter of a query is the fastest of the drafters its selectors play. A trace's reference
rows (prompt lookup beside six heads) are no selector's arm, so a convergence share measured against them would be
near zero by construction; a selector that plays the whole pool keeps every fixed arm a candidate."""

from __future__ import annotations

from specbench.pipelines.methods import Method
from specbench.pipelines.replay import best_arms, playable


def _row(method, query, seconds, tokens=10):
    return {"method": method, "query_id": query, "seconds": seconds, "new_tokens": tokens}


def test_the_best_drafter_is_the_fastest_of_those_the_selectors_play():
    rows = [
        _row("autoregressive", "q", 0.5),  # never a drafter
        _row("fixed:prompt_lookup", "q", 1.0),  # the fastest, a reference row
        _row("fixed:head_a", "q", 3.0),
        _row("fixed:head_b", "q", 2.0),
        _row("fixed:head_a", "r", 1.0),
        _row("fixed:head_b", "r", 1.0, tokens=0),  # made nothing: not a candidate
    ]
    assert best_arms(rows) == {"q": "prompt_lookup", "r": "head_a"}
    assert best_arms(rows, {"head_a", "head_b"}) == {"q": "head_b", "r": "head_a"}


def test_the_arms_played_are_the_selectors_candidates_or_every_drafter():
    def selector(candidates):
        return Method("s", lambda: None, {"candidates": candidates})

    fixed = Method("fixed:a", lambda: None)
    assert playable([fixed, selector(["a", "b"]), selector(["c"])]) == {"a", "b", "c"}
    assert playable([fixed, selector(["a"]), selector(None)]) is None  # one plays the whole pool
    assert playable([fixed]) is None
