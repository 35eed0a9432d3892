"""The budget's start-up cost profile (``selector.costs: profile``) on the tiny Llama target: measured once and
cached per machine, target and pool; read back by the next run; another pool (a drafter's draft length, its tree)
is another file; an unreadable file is measured again; a budget given ``profile`` with nothing to measure it is
refused; eval's methods get the measured numbers."""

from __future__ import annotations

import json

import pytest

from specbench.decoding.sampling import SamplingParams
from specbench.errors import SpecbenchError
from specbench.pipelines import cost_cache
from specbench.pipelines.cost_cache import Probe, cache_file, cost_key, fit_line, startup_costs
from specbench.selection import Budget
from specbench.timing import Clock
from tests.conftest import build_tiny_pool


@pytest.fixture
def small_pool(tiny_llama_target, tmp_path, monkeypatch):
    monkeypatch.setenv("SPECBENCH_CACHE", str(tmp_path))
    return tiny_llama_target, build_tiny_pool(tiny_llama_target, "tiny_llama", ("prompt_lookup", "hf"))


def _costs(target, pool, draft_length=4):
    prompt = target.tokenizer("the cat sat on the mat and the dog")["input_ids"]
    return startup_costs(Probe(target, pool, prompt, draft_length, SamplingParams(), Clock()))


def test_measured_once_then_read_from_the_cache(small_pool, monkeypatch):
    target, pool = small_pool
    costs = _costs(target, pool)
    a, b = costs["verify"]
    assert a > 0 and b >= 0
    assert set(costs["draft"]) == {"prompt_lookup", "hf"} and all(v >= 0 for v in costs["draft"].values())
    path = cache_file(cost_key(target, pool, 4))
    assert json.loads(path.read_text())["costs"] == costs

    def never(*args, **kwargs):
        raise AssertionError("measured again although the cache holds this machine's profile")

    monkeypatch.setattr(cost_cache, "measure_costs", never)
    assert _costs(target, pool) == costs  # read, not measured
    with pytest.raises(AssertionError, match="measured again"):
        _costs(target, pool, draft_length=2)  # another draft length: another profile


def test_an_unreadable_cache_file_is_measured_again(small_pool):
    target, pool = small_pool
    path = cache_file(cost_key(target, pool, 4))
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
        return {"verify": [0.03, 0.001], "draft": {"head": 0.008}}

    methods = parse_methods(["selector", "again:selector"], pool, cfg, None, measured)
    budget = methods[1].make_selector()
    assert budget.fixed == ((0.03, 0.001), {"suffix": 0.0, "head": 0.008})
    assert methods[1].config["costs"]["verify"] == [0.03, 0.001]
    with pytest.raises(SpecbenchError, match="costs: profile"):
        parse_methods(["selector"], pool, cfg, None, None)
