"""Context-aware selection end to end on tiny models: collect (resume, shards, merge, refusals),
train-policy, and eval with selector=policy, in-process and through the CLI."""

from __future__ import annotations

import json
import math
import subprocess
import sys

import pandas as pd
import pytest
import torch
from hydra import compose, initialize_config_dir

from specbench.configs import conf_dir
from specbench.errors import SpecbenchError
from specbench.pipelines import collect, collected, train_policy
from specbench.policy import load_checkpoint, scores
from specbench.policy.scores import RewardSpec
from specbench.selection import PolicySelector

TINY = [
    "target=tiny_llama",
    "pool=tiny",
    "dataset.limit=1",
    "~dataset.sources.code",
    "decoding.max_new_tokens=6",
    "warmup.max_new_tokens=0",
    "collect.max_new_tokens=6",
    "collect.measure_speculative=true",
]


def cfg_of(name: str, overrides: list[str]):
    with initialize_config_dir(config_dir=conf_dir(), version_base=None):
        return compose(config_name=name, overrides=overrides)


def deterministic(row: dict) -> dict:
    """The fields of a row that do not depend on timing."""
    return {
        "query_id": row["query_id"],
        "index": row["index"],
        "target": row["target"]["tokens"],
        "embedding": [round(x, 5) for x in row["embedding"]],
        "arms": {
            a: {k: rec.get(k) for k in ("standalone", "alignment", "cost_params", "text")}
            for a, rec in row["arms"].items()
        },
    }


@pytest.fixture(scope="module")
def full_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("collect_full")
    collect.run(cfg_of("collect", TINY), out)
    return out


def test_collect_rows(full_run):
    rows = collected.read_rows([full_run])
    assert len(rows) == 4 and [r["index"] for r in rows] == [0, 1, 2, 3]  # 4 embedded tasks x limit 1
    for row in rows:
        assert set(row["arms"]) == {"autoregressive", "quantized", "prompt_lookup", "early_exit_1"}
        ar = row["arms"]["autoregressive"]
        assert ar["alignment"] == 1.0 and ar["cost_params"] == 1.0
        assert (
            row["arms"]["prompt_lookup"]["standalone"] is False
            and row["arms"]["prompt_lookup"]["alignment"] is None
        )
        for arm in ("quantized", "early_exit_1"):
            rec = row["arms"][arm]
            assert rec["standalone"] and 0.0 <= rec["alignment"] <= 1.0 and 0.0 < rec["cost_params"] < 1.0
        assert row["embedding_dim"] == len(row["embedding"]) == 64
        for arm, rec in row["arms"].items():  # the speculative runs keep drafted and accepted tokens
            spec = rec["spec"]
            assert 0 <= spec["accepted"] <= spec["drafted"]
            assert (
                (spec["drafted"] == 0)
                if arm == "autoregressive"
                else (arm == "prompt_lookup" or spec["drafted"] > 0)
            )
            assert (
                spec["new_tokens"] <= spec["accepted"] + spec["target_calls"]
            )  # each call adds at most 1 of its own
        assert 1 <= len(row["target"]["tokens"]) <= 6


def test_interrupted_collect_resumes_to_the_same_rows(full_run, tmp_path):
    lines = (full_run / "rows.jsonl").read_text().splitlines()
    out = tmp_path / "resumed"
    out.mkdir()
    (out / "collect_config.yaml").write_text((full_run / "collect_config.yaml").read_text())
    (out / "rows.jsonl").write_text("\n".join(lines[:2]) + "\n" + lines[2][:40])  # killed mid-write
    collect.run(cfg_of("collect", TINY), out)
    resumed = [json.loads(x) for x in (out / "rows.jsonl").read_text().splitlines()]
    assert len(resumed) == len({r["query_id"] for r in resumed}) == 4
    assert [deterministic(r) for r in collected.read_rows([out])] == [
        deterministic(r) for r in collected.read_rows([full_run])
    ]


def test_collect_refuses_to_resume_rows_of_other_checkpoints(full_run, tmp_path):
    """issue 34: a head rebuilt in place under the same name; the rows carry the run's drafter fingerprints."""
    out = tmp_path / "rebuilt"
    out.mkdir()
    (out / "collect_config.yaml").write_text((full_run / "collect_config.yaml").read_text())
    rows = [json.loads(x) for x in (full_run / "rows.jsonl").read_text().splitlines()]
    assert all(r["drafters"] == {} for r in rows)  # the tiny pool loads no checkpoint files
    (out / "rows.jsonl").write_text(
        "".join(json.dumps({**r, "drafters": {"quantized": "old"}}) + "\n" for r in rows[:2])
    )
    with pytest.raises(
        SpecbenchError,
        match="rows collected with other drafter checkpoints than this run's "
        r"\(quantized changed since\)",
    ) as err:
        collect.run(cfg_of("collect", TINY), out)
    assert "collect.overwrite=true" in err.value.fix
    collect.run(cfg_of("collect", TINY + ["collect.overwrite=true"]), out)
    assert [r["drafters"] for r in collected.read_rows([out])] == [{}] * 4


def test_shards_merged_equal_one_run(full_run, tmp_path):
    for shard in (0, 1):
        collect.run(
            cfg_of("collect", TINY + [f"collect.shard={shard}", "collect.num_shards=2"]),
            tmp_path / f"s{shard}",
        )
    assert len(collected.read_rows([tmp_path / "s0"])) == 2
    merged = collected.merge([str(tmp_path / "s0"), str(tmp_path / "s1")], tmp_path / "merged")
    assert [deterministic(r) for r in collected.read_rows([merged.parent])] == [
        deterministic(r) for r in collected.read_rows([full_run])
    ]


def test_collect_refuses_a_directory_of_another_config(full_run, tmp_path):
    out = tmp_path / "other"
    collect.run(cfg_of("collect", TINY), out)
    with pytest.raises(SpecbenchError, match="different config .*collect"):
        collect.run(cfg_of("collect", TINY + ["collect.alignment=bleu"]), out)
    collect.run(cfg_of("collect", TINY + ["collect.alignment=bleu", "collect.overwrite=true"]), out)
    assert len(collected.read_rows([out])) == 4


def test_bad_collect_settings(tmp_path):
    with pytest.raises(SpecbenchError, match="collect.alignment"):
        collect.run(cfg_of("collect", TINY + ["collect.alignment=meteor"]), tmp_path / "a")
    with pytest.raises(SpecbenchError, match="not a valid shard"):
        collect.run(cfg_of("collect", TINY + ["collect.shard=2", "collect.num_shards=2"]), tmp_path / "b")


def test_train_policy_writes_a_checkpoint_the_selector_accepts(full_run, tmp_path):
    out = tmp_path / "policy"
    train_policy.run(
        cfg_of("train_policy", [f"data={full_run}", "train.epochs=5", "train.val_fraction=0.5"]), out
    )
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["arms"] == [
        "autoregressive",
        "quantized",
        "early_exit_1",
    ]  # prompt lookup has no proxy score
    with_acceptance = tmp_path / "policy_acceptance"  # the speculative runs' acceptance scores every arm
    train_policy.run(
        cfg_of(
            "train_policy",
            [f"data={full_run}", "train.epochs=5", "train.val_fraction=0.5", "reward.alignment=acceptance"],
        ),
        with_acceptance,
    )
    assert json.loads((with_acceptance / "metrics.json").read_text())["arms"] == [
        "autoregressive",
        "quantized",
        "prompt_lookup",
        "early_exit_1",
    ]
    policy = load_checkpoint(out / "policy.pt")
    assert policy.arms == metrics["arms"] and policy.meta["embedding"]["dim"] == 64
    assert policy.meta["embedding"]["target"] == "embedded:tiny_llama"
    sel = PolicySelector(
        ["autoregressive", "quantized", "prompt_lookup", "early_exit_1"], str(out / "policy.pt")
    )
    sel.set_embedding(torch.zeros(64))
    sel.reset()
    assert sel.select() in policy.arms
    with pytest.raises(SpecbenchError, match="early_exit_1"):
        PolicySelector(["autoregressive", "quantized"], str(out / "policy.pt"))
    with pytest.raises(SpecbenchError, match="32"):
        sel.set_embedding(torch.zeros(32))


def test_reward_sources_and_costs():
    rows = [
        {
            "arms": {
                "autoregressive": {
                    "alignment": 1.0,
                    "cost_params": 1.0,
                    "cost_measured": 1.0,
                    "spec": {"speedup": 1.0, "seconds": 2.0, "drafted": 0, "accepted": 0},
                },
                "d": {
                    "alignment": 0.6,
                    "cost_params": 0.5,
                    "cost_measured": 0.25,
                    "spec": {"speedup": 2.0, "seconds": 1.0, "drafted": 10, "accepted": 8},
                },
                "pl": {
                    "alignment": None,
                    "cost_params": 0.0,
                    "cost_measured": None,
                    "spec": {"speedup": 0.5, "seconds": 4.0, "drafted": 0, "accepted": 0},
                },
            }
        }
    ]
    arms = ["autoregressive", "d", "pl"]
    r = scores.rewards(rows, arms, RewardSpec(0.5, "params", "proxy"))[0]
    assert r[0].item() == pytest.approx(0.5) and r[1].item() == pytest.approx(0.5 * 0.6 + 0.5 * 0.5)
    assert math.isnan(r[2].item())
    r = scores.rewards(rows, arms, RewardSpec(0.0, "measured", "proxy"))[0]
    assert r[1].item() == pytest.approx(0.75) and r[0].item() == pytest.approx(0.0)
    r = scores.rewards(rows, arms, RewardSpec(0.5, "params", "measured"))[0]
    assert r.tolist() == pytest.approx([0.5, 1.0, 0.25])
    # acceptance alignment scores every arm: d accepted 8 of 10, pl drafted nothing (0), the target is 1
    r = scores.rewards(rows, arms, RewardSpec(0.5, "params", "proxy", "acceptance"))[0]
    assert r.tolist() == pytest.approx([0.5, 0.5 * 0.8 + 0.5 * 0.5, 0.5 * 0.0 + 0.5 * 1.0])
    sp = scores.replay(rows, torch.tensor([0]), arms, ["d"])
    assert (
        sp["policy"] == pytest.approx(2.0)
        and sp["oracle"] == pytest.approx(2.0)
        and sp["pl"] == pytest.approx(0.5)
    )
    pc = scores.proxy_check(rows, arms, RewardSpec(1.0, "params"))
    assert pc["queries"] == 1 and pc["top1_agreement"] == 0.0  # proxy prefers autoregressive, d is fastest
    with pytest.raises(SpecbenchError, match="reward.source"):
        RewardSpec(0.5, "params", "vibes")
    with pytest.raises(SpecbenchError, match="reward.alignment"):
        RewardSpec(0.5, "params", "proxy", "vibes")
    old = [
        {
            "arms": {
                "autoregressive": rows[0]["arms"]["autoregressive"],
                "d": {**rows[0]["arms"]["d"], "spec": {"speedup": 2.0, "seconds": 1.0}},
            }
        }
    ]
    with pytest.raises(
        SpecbenchError, match="collect again"
    ):  # rows collected before drafted/accepted were kept
        scores.rewards(old, ["autoregressive", "d"], RewardSpec(0.5, "params", "proxy", "acceptance"))


@pytest.mark.slow  # 61 s: the slow set (the pipeline's pieces are tested apart in make test)
def test_collect_train_eval_through_the_cli(tmp_path):
    def run(*args):
        res = subprocess.run(
            [sys.executable, "-m", "specbench.cli", *args],
            capture_output=True,
            text=True,
            timeout=600,
            cwd=tmp_path,
        )
        assert res.returncode == 0, res.stderr[-3000:]
        return res

    run("collect", *TINY, f"hydra.run.dir={tmp_path / 'c'}")
    res = run(
        "train-policy",
        f"data={tmp_path / 'c'}",
        "train.epochs=5",
        "train.val_fraction=0.5",
        "reward.source=measured",
        "sweep.alpha=[0,1]",
        "sweep.n_examples=[1,2]",
        f"hydra.run.dir={tmp_path / 'p'}",
    )
    assert "speedup_replayed" in res.stdout
    for name in (
        "policy.pt",
        "summary.md",
        "alpha_sweep.csv",
        "data_efficiency.csv",
        "history.csv",
        "data_efficiency_queries.csv",
    ):
        assert (tmp_path / "p" / name).exists(), name
    per_query = pd.read_csv(
        tmp_path / "p" / "data_efficiency_queries.csv"
    )  # each size's arm per validation query
    same = per_query.groupby("n_examples").query_id.apply(lambda q: tuple(sorted(q)))
    assert same.nunique() == 1 and len(same) == 2  # both sizes judged on the same validation queries
    assert per_query.seconds.notna().all() and per_query.ar_seconds.notna().all()
    assert load_checkpoint(tmp_path / "p" / "policy.pt").arms == [
        "autoregressive",
        "quantized",
        "prompt_lookup",
        "early_exit_1",
    ]
    run(
        "eval",
        *TINY[:-2],
        "dataset.offset=1",
        "selector=policy",  # held-out rows: the collected ones are refused
        f"policy.checkpoint={tmp_path / 'p' / 'policy.pt'}",
        f"hydra.run.dir={tmp_path / 'e'}",
    )
    summary = pd.read_csv(tmp_path / "e" / "summary.csv")
    pol = summary[(summary.method == "policy") & (summary.task == "all")].iloc[0]
    assert pol.exact_match == 1.0 and pol.n_examples == 4
    # issue 35: with no pool= the policy's own pool (the collection's, kept in its checkpoint) is used; eval's
    # default pool (the SmolLM2 heads) would refuse the policy's arms
    run(
        "eval",
        *[o for o in TINY[:-2] if o != "pool=tiny"],
        "dataset.offset=1",
        "selector=policy",
        f"policy.checkpoint={tmp_path / 'p' / 'policy.pt'}",
        f"hydra.run.dir={tmp_path / 'e_own_pool'}",
    )
    saved = (tmp_path / "e_own_pool" / "config.yaml").read_text()
    assert "early_exit_1" in saved and "eagle_math" not in saved
    # issue 34: a policy retrained behind the same policy.checkpoint is not resumed under the old one's records
    run(
        "train-policy",
        f"data={tmp_path / 'c'}",
        "train.epochs=2",
        "train.val_fraction=0.5",
        "train.seed=7",
        "reward.source=measured",
        f"hydra.run.dir={tmp_path / 'p2'}",
    )
    (tmp_path / "p" / "policy.pt").write_bytes((tmp_path / "p2" / "policy.pt").read_bytes())
    res = subprocess.run(
        [
            sys.executable,
            "-m",
            "specbench.cli",
            "eval",
            *TINY[:-2],
            "dataset.offset=1",
            "selector=policy",
            f"policy.checkpoint={tmp_path / 'p' / 'policy.pt'}",
            f"hydra.run.dir={tmp_path / 'e'}",
        ],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=tmp_path,
    )
    assert res.returncode == 2 and "drafter checkpoint(s) changed: policy" in res.stderr, res.stderr[-3000:]


def test_pipelines_validate_their_config_at_the_door(tmp_path):
    """Validation runs inside the pipelines (run_dir.start_run), not only on the command line: a pipeline called
    directly, as the reproduction plan does, refuses a bad value before it makes its run directory."""
    with pytest.raises(SpecbenchError, match="reward.alpha"):
        train_policy.run(cfg_of("train_policy", [f"data={tmp_path}", "reward.alpha=2"]), tmp_path / "p")
    with pytest.raises(SpecbenchError, match="decoding.max_new_tokens"):
        collect.run(cfg_of("collect", TINY + ["decoding.max_new_tokens=-1"]), tmp_path / "c")
    assert not (tmp_path / "p").exists() and not (tmp_path / "c").exists()
