"""The budget's start-up cost profile (``selector.costs: profile``) on the tiny Llama target: measured at each
context of its grid, once, and cached per machine, target, pool and grid; read back by the next run; another pool (a drafter's draft length, its tree)
is another file; an unreadable file is measured again; a budget given ``profile`` with nothing to measure it is
refused; eval's methods get the measured numbers."""

from __future__ import annotations

import json

import pytest

from specbench.decoding.sampling import SamplingParams
from specbench.errors import SpecbenchError
from specbench.pipelines import cost_cache
from specbench.pipelines.cost_cache import (
    Probe,
    cache_file,
    cost_key,
    fit_line,
    profile_key,
    run_contexts,
    startup_costs,
)
from specbench.selection import Budget
from specbench.timing import Clock
from tests.conftest import build_tiny_pool


@pytest.fixture
def small_pool(tiny_llama_target, tmp_path, monkeypatch):
    monkeypatch.setenv("SPECBENCH_CACHE", str(tmp_path))
    return tiny_llama_target, build_tiny_pool(tiny_llama_target, "tiny_llama", ("prompt_lookup", "hf"))


def _probe(target, pool, draft_length=4, contexts=(32, 96)):
    prompt = target.tokenizer("the cat sat on the mat and the dog")["input_ids"]
    return Probe(target, pool, prompt, draft_length, SamplingParams(), Clock(), contexts)


def _costs(target, pool, draft_length=4, contexts=(32, 96)):
    return startup_costs(_probe(target, pool, draft_length, contexts))


def test_measured_once_then_read_from_the_cache(small_pool, monkeypatch):
    target, pool = small_pool
    costs = _costs(target, pool)
    assert costs["contexts"] == [32, 96] and costs["profiled"] is True
    assert len(costs["verify"]) == 2 and all(a > 0 and b >= 0 for a, b in costs["verify"])
    assert set(costs["draft"]) == {"prompt_lookup", "hf"}
    assert all(len(v) == 2 and min(v) >= 0 for v in costs["draft"].values())
    budget = Budget(["autoregressive", "prompt_lookup", "hf"], retrieval="prompt_lookup", costs=costs)
    assert budget.costs.correct and budget.costs.profiled  # a measured profile is corrected online
    path = cache_file(profile_key(_probe(target, pool)))
    assert json.loads(path.read_text())["costs"] == costs

    def never(*args, **kwargs):
        raise AssertionError("measured again although the cache holds this machine's profile")

    monkeypatch.setattr(cost_cache, "measure_costs", never)
    assert _costs(target, pool) == costs  # read, not measured
    with pytest.raises(AssertionError, match="measured again"):
        _costs(target, pool, draft_length=2)  # another draft length: another profile
    with pytest.raises(AssertionError, match="measured again"):
        _costs(target, pool, contexts=(32, 64))  # another grid: another profile


def test_an_unreadable_cache_file_is_measured_again(small_pool):
    target, pool = small_pool
    path = cache_file(profile_key(_probe(target, pool)))
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("{not json")
    costs = _costs(target, pool)
    assert json.loads(path.read_text())["costs"] == costs


def test_the_key_names_each_drafters_shape(small_pool):
    target, pool = small_pool
    before = cost_key(target, pool, 4)
    pool["hf"].draft_length = 6
    assert cache_file(cost_key(target, pool, 4)) != cache_file(before)
    pool["hf"].draft_length = None


def test_the_grid_spans_the_runs_contexts():
    assert run_contexts(100, 1600) == (96, 400, 1600)  # geometric, in steps of 16 tokens
    assert run_contexts(100, 5000, limit=2000) == (96, 448, 2000)  # within the target's positions
    assert run_contexts(300, 300) == (304,)


def test_fit_line_recovers_a_line_and_keeps_its_signs():
    assert fit_line([0, 4, 8, 16], [0.03 + 0.001 * n for n in (0, 4, 8, 16)]) == pytest.approx((0.03, 0.001))
    a, b = fit_line([0, 4, 8], [0.05, 0.04, 0.03])  # a falling line (noise): no node saves time
    assert b == 0.0 and a == pytest.approx(0.04)


def test_profile_without_a_measuring_command_is_refused():
    with pytest.raises(SpecbenchError, match="costs: profile is measured by the command"):
        Budget(["autoregressive", "suffix", "head"], retrieval="suffix", costs="profile")


def test_parse_methods_gives_the_budget_the_measured_costs():
    from omegaconf import OmegaConf

    from specbench.pipelines.methods import parse_methods

    pool = {"autoregressive": None, "suffix": None, "head": None}
    cfg = OmegaConf.create(
        {
            "_target_": "specbench.selection.Budget",
            "name": "budget",
            "retrieval": "suffix",
            "costs": "profile",
        }
    )

    def measured():
        return {
            "contexts": [64, 512],
            "verify": [[0.03, 0.001], [0.05, 0.002]],
            "draft": {"head": [0.008, 0.01]},
            "profiled": True,
        }

    methods = parse_methods(["selector", "again:selector"], pool, cfg, None, measured)
    budget = methods[1].make_selector()
    assert budget.costs.profiled and budget.costs.correct and not budget.fixed  # measured: corrected online
    assert budget.costs.verify(4, 288) == pytest.approx(0.04 + 0.0015 * 4)
    assert budget.costs.draft("head", 512) == pytest.approx(0.01) and budget.costs.draft("suffix", 64) == 0.0
    assert methods[1].config["costs"]["verify"] == [[0.03, 0.001], [0.05, 0.002]]
    with pytest.raises(SpecbenchError, match="costs: profile"):
        parse_methods(["selector"], pool, cfg, None, None)
