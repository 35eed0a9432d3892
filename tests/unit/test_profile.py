"""The pure parts of ``specbench profile`` (``specbench.profiling`` and the pipeline's tables): the best
draft length on hand-made cases, the expected-accepted and acceptance estimators, the tables' shape,
``cost: measured`` lookups against a fake target, and the validation of the new keys. No model runs."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
import torch
from hydra import compose, initialize_config_dir

from specbench import profiling
from specbench.configs import conf_dir
from specbench.errors import SpecbenchError
from specbench.pipelines import profile as pipeline
from specbench.pipelines import profile_tables
from specbench.pipelines.keys import check as validate


def full(accepted, K=4, name="d"):
    return [
        {"method": f"fixed:{name}", "arm": name, "drafted": K, "n_max": K, "accepted": a} for a in accepted
    ]


# -- the estimators --------------------------------------------------------------------------------


def test_acceptance_keeps_the_drafters_full_rounds_at_the_largest_draft_length():
    rows = full([0, 2, 4, 4]) + [
        {"method": "fixed:d", "arm": "d", "drafted": 2, "n_max": 4, "accepted": 1},  # a short draft: not full
        {
            "method": "fixed:d",
            "arm": "d",
            "drafted": 2,
            "n_max": 2,
            "accepted": 2,
        },  # the last round: full, K = 2
        {"method": "fixed:d", "arm": "d", "drafted": 0, "n_max": 4, "accepted": 0},  # nothing drafted
        {"method": "fixed:other", "arm": "other", "drafted": 4, "n_max": 4, "accepted": 1},
        {
            "method": "selector:ucb",
            "arm": "d",
            "drafted": 4,
            "n_max": 4,
            "accepted": 3,
        },  # not the fixed method
        {"method": "autoregressive", "arm": "autoregressive", "drafted": 0, "n_max": 0, "accepted": 0},
    ]
    acc = profiling.acceptance_of(profiling.drafter_rounds(rows, "d"))
    assert acc.counts == (0, 2, 4, 4) and acc.K == 4 and acc.rounds == 7
    # accepted 0+2+4+4+1+2+0 = 13; at risk: 1+3+4+4 (full), 1+1 (short, rejected), 2 (censored), 0
    assert acc.alpha == pytest.approx(13 / 16)
    assert profiling.acceptance_of(profiling.drafter_rounds(rows, "nobody")) is None


def test_alpha_is_accepted_over_positions_at_risk():
    # a < d: a acceptances and one rejection; a == d: censored (no rejection seen)
    assert profiling.alpha_estimate(full([0, 2, 4, 4])) == pytest.approx(10 / 12)
    assert profiling.alpha_estimate(full([3, 3], K=3)) == 1.0  # every draft fully accepted
    assert profiling.alpha_estimate(full([3, 3])) == 0.75  # K = 4: 3 accepted, then a rejection
    assert profiling.alpha_estimate(full([0, 0])) == 0.0
    assert profiling.alpha_estimate([]) == 0.0


def test_expected_accepted_is_exact_up_to_K_then_a_geometric_tail():
    acc = profiling.Acceptance(counts=(0, 2, 4, 4), K=4, alpha=0.5, rounds=4)
    assert profiling.expected_accepted(acc, 0) == (0.0, False)
    assert profiling.expected_accepted(acc, 1) == (0.75, False)  # min(a, 1): 0, 1, 1, 1
    assert profiling.expected_accepted(acc, 3) == (2.0, False)  # 0, 2, 3, 3
    assert profiling.expected_accepted(acc, 4) == (2.5, False)
    # P(a >= 4) = 1/2, then alpha, alpha^2: 2.5 + 0.5 * (0.5 + 0.25)
    value, extrapolated = profiling.expected_accepted(acc, 6)
    assert extrapolated and value == pytest.approx(2.875)


# -- the best draft length -------------------------------------------------------------------------

C_VERIFY = {1: 1.0, 2: 1.1, 3: 1.2, 4: 1.3, 5: 1.4, 6: 2.0}


def test_best_draft_length_by_hand():
    acc = profiling.acceptance_of(full([0, 2, 4, 4]))  # alpha = 10/12
    rows = profiling.best_draft_length(acc, C_VERIFY, c_draft=0.1)
    assert [r["k"] for r in rows] == [1, 2, 3, 4, 5]  # k needs q = k + 1 in the profile
    by_k = {r["k"]: r for r in rows}
    # (E + 1) / (c_verify(k + 1) + k * 0.1)
    expected = {1: 1.75 / 1.2, 2: 2.5 / 1.4, 3: 3.0 / 1.6, 4: 3.5 / 1.8, 5: (3.5 + 0.5 * 10 / 12) / 2.5}
    for k, speedup in expected.items():
        assert by_k[k]["predicted_speedup"] == pytest.approx(speedup), k
    assert by_k[3]["verify_cost"] == 1.3 and by_k[3]["draft_cost"] == pytest.approx(0.3)
    assert [r["extrapolated"] for r in rows] == [False, False, False, False, True]
    assert [r["k"] for r in rows if r["best"]] == [4]


def test_an_extrapolated_draft_length_can_win():
    acc = profiling.acceptance_of(full([0, 2, 4, 4]))
    flat = {q: 1.0 for q in range(1, 9)}  # free verification and free drafts: longer is always better
    rows = profiling.best_draft_length(acc, flat, c_draft=0.0)
    best = [r for r in rows if r["best"]]
    assert len(best) == 1 and best[0]["k"] == 7 and best[0]["extrapolated"]
    a = 10 / 12
    assert best[0]["predicted_speedup"] == pytest.approx(1 + 2.5 + 0.5 * (a + a**2 + a**3))


def test_ties_go_to_the_shorter_draft_and_expensive_drafts_to_k_1():
    acc = profiling.acceptance_of(full([0, 0, 0]))  # never accepted: every k predicts 1 / cost
    rows = profiling.best_draft_length(acc, {q: 1.0 for q in range(1, 5)}, c_draft=0.0)
    assert [r["k"] for r in rows if r["best"]] == [1]
    acc = profiling.acceptance_of(full([4, 4]))
    rows = profiling.best_draft_length(acc, C_VERIFY, c_draft=5.0)
    assert [r["k"] for r in rows if r["best"]] == [1]


# -- tables ---------------------------------------------------------------------------------------

PROF = {
    "target": "m",
    "dtype": "float32",
    "device": "cpu",
    "q": [1, 2, 4],
    "contexts": [128, 512],
    "step_seconds": {"128": 0.02, "512": 0.04},
    "seconds": {"128": [0.02, 0.03, 0.05], "512": [0.04, 0.05, 0.06]},
    "c_verify": {"128": [1.0, 1.5, 2.5], "512": [1.0, 1.25, 1.5]},
    "draft_context": 128,
    "draft_tokens": 8,
    "drafters": {
        "a": {"kind": "quantized", "seconds_per_token": 0.01, "drafted": 8, "c_draft": 0.5},
        "b": {"kind": "prompt_lookup", "seconds_per_token": 0.0001, "drafted": 3, "c_draft": 0.005},
    },
}


def test_verify_table_rows_are_contexts_and_columns_q():
    table = profile_tables.verify_table(PROF)
    assert list(table.columns) == ["context", "step_ms", "q=1", "q=2", "q=4"]
    assert list(table.context) == ["128", "512"]
    assert list(table.step_ms) == pytest.approx([20.0, 40.0])
    assert list(table["q=2"]) == [1.5, 1.25]
    verify_md, drafter_md = profile_tables.profile_markdown(PROF)
    lines = verify_md.splitlines()
    assert len(lines) == 2 + 2  # header, separator, one line per context
    assert all(line.count("|") == 6 for line in lines)  # 5 columns
    assert lines[2].split("|")[1].strip() == "128" and lines[2].split("|")[-2].strip() == "2.500"
    assert len(drafter_md.splitlines()) == 2 + 2 and "prompt_lookup" in drafter_md


def test_profile_rows_one_per_point_and_drafter():
    rows = profile_tables.profile_rows(PROF)
    assert list(rows.columns) == ["kind", "name", "context", "q", "seconds", "relative"]
    target = rows[rows.kind == "target"]
    assert len(target) == 6 and set(target.context) == {128, 512}
    assert target[(target.context == 512) & (target.q == 4)].relative.item() == 1.5
    drafters = rows[rows.kind == "drafter"].set_index("name")
    assert list(drafters.index) == ["a", "b"] and drafters.loc["a", "relative"] == 0.5
    assert drafters.loc["a", "context"] == 128 and drafters.loc["a", "q"] == 8


def test_best_k_tables_from_rounds():
    rounds = full([0, 2, 4, 4], K=2, name="a")  # min(a, 2) for K = 2
    summary, curve = profile_tables.best_k_tables(
        PROF, rounds
    )  # only drafter a has rounds; q = 2, 4: k = 1, 3
    assert list(summary.drafter) == ["a"] and summary.K.item() == 2
    assert list(curve.k) == [1, 3] and list(curve.extrapolated) == [False, True]
    with pytest.raises(SpecbenchError, match="no rounds of fixed:<drafter>"):
        profile_tables.best_k_tables(PROF, full([1], name="zzz"))


def test_interleaved_rotates_and_drops_the_warm_up():
    calls = []
    readings = pipeline.interleaved(
        3, repeats=2, warmup=1, timed=lambda i: calls.append(i) or float(len(calls))
    )
    assert calls == [0, 1, 2, 1, 2, 0, 2, 0, 1]
    assert readings == [[6.0, 8.0], [4.0, 9.0], [5.0, 7.0]]


def test_repeat_to():
    assert pipeline.repeat_to([1, 2, 3], 7) == [1, 2, 3, 1, 2, 3, 1]
    assert pipeline.repeat_to([1, 2, 3], 2) == [1, 2]


# -- cost: measured --------------------------------------------------------------------------------


def fake_target(name="m", dtype=torch.float32):
    model = torch.nn.Linear(1, 1).to(dtype)
    return SimpleNamespace(model=model, loaded=SimpleNamespace(name=name), device=torch.device("cpu"))


def test_measured_cost_reads_c_draft_of_the_same_target(tmp_path):
    (tmp_path / "profile.json").write_text(json.dumps(PROF))
    prof = profiling.load_profile(tmp_path)  # a directory: its profile.json
    assert profiling.measured_cost(prof, "a", fake_target()) == 0.5
    assert profiling.load_profile(tmp_path / "profile.json")["drafters"] == PROF["drafters"]
    with pytest.raises(SpecbenchError, match="no measured cost of drafter 'c'") as exc:
        profiling.measured_cost(prof, "c", fake_target())
    assert "specbench profile" in exc.value.fix
    for target in (fake_target(name="other"), fake_target(dtype=torch.bfloat16)):
        with pytest.raises(SpecbenchError, match="was measured on m \\(float32, cpu\\)") as exc:
            profiling.measured_cost(prof, "a", target)
        assert "specbench profile" in exc.value.fix
    with pytest.raises(SpecbenchError, match="no profile is given") as exc:
        profiling.measured_cost(None, "a", fake_target())
    assert "specbench profile" in exc.value.fix and "profile_path" in exc.value.fix


def test_load_profile_refuses_missing_and_damaged_files(tmp_path):
    with pytest.raises(SpecbenchError, match="no profile.json there"):
        profiling.load_profile(tmp_path)
    (tmp_path / "profile.json").write_text("{not json")
    with pytest.raises(SpecbenchError, match="not a readable profile"):
        profiling.load_profile(tmp_path)
    (tmp_path / "profile.json").write_text(json.dumps({"q": [1]}))
    with pytest.raises(SpecbenchError, match="not a profile written by `specbench profile`"):
        profiling.load_profile(tmp_path)


# -- the config -----------------------------------------------------------------------------------


def composed(*overrides):
    with initialize_config_dir(config_dir=conf_dir(), version_base=None):
        return compose(config_name="profile", overrides=list(overrides))


def test_profile_config_defaults_and_validation():
    cfg = composed()
    validate(cfg, "profile")
    assert list(cfg.profile.q) == [*range(1, 18), 21, 25] and list(cfg.profile.contexts) == [128, 512]
    assert [list(t) for t in cfg.profile.trees] == [[2, 4], [2, 5], [2, 8], [3, 4], [3, 5], [2, 10], [3, 8]]
    assert cfg.profile.repeats == 15 and cfg.run_name == "profile" and cfg.profile.run is None
    for override, line in [
        ("profile.q=[]", "profile.q=[]: expected a non-empty list"),
        ("profile.q=[0,2]", "profile.q=[0, 2]: expected a non-empty list, each an integer >= 1"),
        ("profile.contexts=[1.5]", "profile.contexts=[1.5]: expected"),
        ("profile.repeats=0", "profile.repeats=0: expected an integer >= 1"),
    ]:
        with pytest.raises(SpecbenchError) as exc:
            validate(composed(override), "profile")
        assert line in exc.value.problem, (override, exc.value.problem)


@pytest.mark.parametrize("root", ["eval", "collect", "cascades", "bench"])
def test_profile_path_is_a_key_of_the_decoding_commands(root):
    with initialize_config_dir(config_dir=conf_dir(), version_base=None):
        cfg = compose(config_name=root, overrides=["profile_path=/x/profile.json"])
    assert cfg.profile_path == "/x/profile.json"
    with initialize_config_dir(config_dir=conf_dir(), version_base=None):
        bad = compose(config_name=root, overrides=["profile_path=''"])
    with pytest.raises(SpecbenchError, match="profile_path"):
        validate(bad)
