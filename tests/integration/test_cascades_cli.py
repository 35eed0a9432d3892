"""``specbench cascades`` and ``eval cascade=...`` end to end on tiny models; the experiment configs compose."""

import json
import subprocess
import sys

import pandas as pd
import pytest

TINY = [
    "target=tiny_llama",
    "pool=tiny",
    "drafter_arm=early_exit_1",
    "dataset.limit=1",
    "decoding.max_new_tokens=10",
    "warmup.max_new_tokens=2",
    "rules=[chow,token_v3]",
    "alphas.chow=[0.5,1.0]",
    "alphas.token_v3=[-1.0,0.5]",
]


def specbench(*args):
    return subprocess.run(
        [sys.executable, "-m", "specbench.cli", *args], capture_output=True, text=True, timeout=600
    )


def test_cascades_writes_curves_and_resumes(tmp_path):
    res = specbench("cascades", *TINY, f"hydra.run.dir={tmp_path}")
    assert res.returncode == 0, res.stderr[-3000:]
    curves = pd.read_csv(tmp_path / "curves.csv")
    tasks = {"translation", "summarization", "math"}  # chat has no quality metric: left out by `tasks`
    assert set(curves.task) == tasks
    methods = {"autoregressive", "drafter_alone", "sd", "chow@0.5", "chow@1", "token_v3@-1", "token_v3@0.5"}
    assert set(curves.method) == methods
    for col in ("quality", "speedup", "rejection_rate", "mat", "agreement_exact", "deferral_rate"):
        assert col in curves.columns
    timed = {
        (e["task"], e["method"]): e
        for e in map(json.loads, (tmp_path / "examples.jsonl").read_text().splitlines())
    }
    for task in tasks:
        rows = curves[curves.task == task].set_index("method")
        # the speedup is the baseline's seconds per token over the method's, from the records (one query a task)
        base, sd = timed[task, "autoregressive"], timed[task, "sd"]
        expected = (base["seconds"] / base["new_tokens"]) / (sd["seconds"] / sd["new_tokens"])
        assert rows.loc["sd", "speedup"] == pytest.approx(expected, rel=1e-3, abs=1e-3)
        # lossless points agree with autoregressive; the never-deferring one is the drafter alone
        assert rows.loc["sd", "agreement_exact"] == 1.0 and rows.loc["token_v3@-1", "agreement_exact"] == 1.0
        assert rows.loc["chow@1", "rejection_rate"] == 0.0 and rows.loc["chow@1", "deferral_rate"] == 0.0
        assert rows.loc["sd", "deferral_rate"] == 1.0
        assert (tmp_path / f"curves_{task}.png").stat().st_size > 0
    examples = [json.loads(x) for x in (tmp_path / "examples.jsonl").read_text().splitlines()]
    assert len(examples) == 3 * len(methods)
    by = {(e["query_id"], e["method"]): e for e in examples}
    for (qid, method), e in by.items():
        assert "agreement" in e and "quality" in e and "deferred" in e
        if method == "chow@1":
            assert e["output_ids"] == by[qid, "drafter_alone"]["output_ids"]
    rounds = [json.loads(x) for x in (tmp_path / "rounds.jsonl").read_text().splitlines()]
    assert all("deferred" in r for r in rounds)
    assert "best rule per task" in res.stdout and (tmp_path / "curves.md").exists()

    again = specbench("cascades", *TINY, f"hydra.run.dir={tmp_path}")
    assert again.returncode == 0, again.stderr[-3000:]
    assert len((tmp_path / "examples.jsonl").read_text().splitlines()) == len(examples)


def test_eval_applies_a_cascade_to_every_speculative_method(tmp_path):
    res = specbench(
        "eval",
        "target=tiny_llama",
        "pool=tiny",
        "dataset.limit=1",
        "decoding.max_new_tokens=8",
        "warmup.max_new_tokens=0",
        "selector=ucb",
        "cascade=chow",
        "cascade.alpha=1.0",
        f"hydra.run.dir={tmp_path}",
    )
    assert res.returncode == 0, res.stderr[-3000:]
    rounds = [json.loads(x) for x in (tmp_path / "rounds.jsonl").read_text().splitlines()]
    spec = [r for r in rounds if r["method"] != "autoregressive"]
    assert {r["method"] for r in spec} >= {"fixed:quantized", "fixed:early_exit_1", "ucb-bd"}
    assert all(r["accepted"] == r["drafted"] and r["deferred"] == 0 for r in spec)  # never defers


@pytest.mark.parametrize(
    "override, message",
    [("cascade.alpha=1.5", "out of range"), ("cascade.rule=chow2", "unknown cascade rule")],
)
def test_bad_cascade_input_is_named(tmp_path, override, message):
    res = specbench(
        "eval",
        "target=tiny_llama",
        "pool=tiny",
        "dataset.limit=1",
        "cascade=chow",
        override,
        f"hydra.run.dir={tmp_path}",
    )
    assert res.returncode == 2
    assert message in res.stderr and "fix:" in res.stderr


@pytest.mark.parametrize(
    "experiment, target, drafter",
    [
        ("cascades_cpu", "embedded:smollm2_135m", "quantized"),
        ("cascades_cpu_local", "embedded:smollm2_135m", "small"),
        ("cascades_t5_wmt", "google-t5/t5-large", "t5_small"),
        ("cascades_t5_cnndm", "google-t5/t5-large", "t5_small"),
        ("cascades_t5_xsum", "sysresearch101/t5-large-finetuned-xsum", "t5_small"),
        ("cascades_gemma_gsm8k", "google/gemma-2-9b-it", "gemma_2b"),
        ("cascades_gemma27b_gsm8k", "google/gemma-2-27b-it", "gemma_2b"),
    ],
)
def test_experiment_configs_compose(experiment, target, drafter):
    """Paper-scale configs cannot run here (GPU, hub); they must compose into valid rule grids."""
    from hydra import compose, initialize_config_dir

    from specbench.configs import conf_dir
    from specbench.pipelines.cascades import variants

    with initialize_config_dir(config_dir=conf_dir(), version_base=None):
        cfg = compose(config_name="cascades", overrides=[f"experiment={experiment}"])
    assert cfg.target.model == target and cfg.drafter_arm == drafter
    assert drafter in cfg.pool.drafters and "_target_" in cfg.pool.drafters[drafter]
    runs = variants(cfg.rules, cfg.alphas)
    assert len(runs) > 3 + len(cfg.rules)
    if "t5" in target:  # T5's own layer paths (no model.norm) and prefixes
        assert cfg.target.layers_key == "num_decoder_layers" and cfg.target.prompt.templates == "t5"
        assert cfg.target.final_norm == "decoder.final_layer_norm"
