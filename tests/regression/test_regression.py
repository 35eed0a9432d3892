"""The reshaped code changed no result: every experiment config, on tiny models, gives the output
ids and counts recorded before the refactor (``fixture.json``, written by ``capture.py``)."""

from __future__ import annotations

import json

import pytest

from tests.regression.scenarios import FIXTURE, run_scenario, unique_scenarios

SCENARIOS = unique_scenarios()
RECORDED = json.loads(FIXTURE.read_text())


def test_fixture_covers_every_scenario():
    assert set(SCENARIOS) == set(RECORDED), "rerun `python -m tests.regression.capture` only for an intended change"


@pytest.mark.parametrize("key", sorted(SCENARIOS))
def test_results_unchanged(key, tmp_path):
    got = json.loads(json.dumps(run_scenario(SCENARIOS[key], key.split("/")[1], tmp_path)))
    want = RECORDED[key]
    assert sorted(got) == sorted(want)
    for gen in want:
        assert got[gen] == want[gen], f"{key}: {gen} differs"
