"""``specbench profile`` end to end on the tiny in-process models (Typer's runner, in process): the files
it writes and their rows, the best draft length from a tiny eval run, ``cost: measured`` read back into a
built pool, and the clear errors around it. Times are measured, so only shapes, rows and consistency
are asserted, never a time."""

from __future__ import annotations

import json
import shutil

import pandas as pd
import pytest
from typer.testing import CliRunner

from specbench.cli import app
from specbench.drafters import build_pool
from specbench.errors import SpecbenchError
from specbench.models import Target, load_model

# Hydra's logging setup (logging.config.dictConfig) would close pytest's log capture in this process.
QUIET = ["hydra/job_logging=none", "hydra/hydra_logging=none"]
TINY = ["target=tiny_llama", "pool=tiny"]
PROFILE = [
    *TINY,
    "profile.q=[1,2,4]",
    "profile.contexts=[16]",
    "profile.repeats=2",
    "profile.trees=[[2,2],[3,1]]",
]
DRAFTERS = ["quantized", "prompt_lookup", "early_exit_1"]  # conf/pool/tiny.yaml


def run(*args: str):
    res = CliRunner().invoke(app, [*args, *QUIET])
    return res.exit_code, res.stderr, res.stdout


def assert_clear_error(code, err, *words):
    assert code == 2, err[-3000:]
    assert "Traceback" not in err, err[-3000:]
    lines = err.strip().splitlines()
    assert any(x.startswith("error: ") for x in lines) and any(x.startswith("fix:   ") for x in lines), err
    for word in words:
        assert word in err, (word, err[-3000:])


@pytest.fixture(scope="module")
def profiled(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("profile") / "run"
    code, err, out = run("profile", *PROFILE, f"hydra.run.dir={run_dir}")
    assert code == 0, err[-3000:]
    return run_dir, out


@pytest.fixture(scope="module")
def eval_run(tmp_path_factory):
    """A tiny eval with every drafter alone at draft length 2."""
    run_dir = tmp_path_factory.mktemp("eval") / "run"
    code, err, _ = run(
        "eval",
        *TINY,
        "dataset.limit=1",
        "decoding.max_new_tokens=12",
        "decoding.draft_length=2",
        "warmup.max_new_tokens=0",
        "methods=[autoregressive,fixed:*]",
        f"hydra.run.dir={run_dir}",
    )
    assert code == 0, err[-3000:]
    return run_dir


def test_profile_writes_its_files_with_one_row_per_measurement(profiled):
    run_dir, out = profiled
    for name in ("config.yaml", "profile.csv", "profile.md", "profile.json", "verify_cost.png"):
        assert (run_dir / name).is_file(), name
    rows = pd.read_csv(run_dir / "profile.csv")
    assert list(rows.columns) == ["kind", "name", "context", "q", "seconds", "relative"]
    target = rows[rows.kind == "target"]
    assert (
        list(target.q) == [1, 2, 4]
        and set(target.context) == {16}
        and set(target.name) == {"embedded:tiny_llama"}
    )
    assert (target.seconds > 0).all() and target[target.q == 1].relative.item() == 1.0
    assert target.relative.tolist() == pytest.approx(
        (target.seconds / target[target.q == 1].seconds.item()).tolist()
    )
    drafters = rows[rows.kind == "drafter"]
    assert drafters.name.tolist() == DRAFTERS  # the autoregressive arm is not profiled
    assert set(drafters.context) == {16} and (drafters.seconds > 0).all()

    prof = json.loads((run_dir / "profile.json").read_text())
    assert prof["target"] == "embedded:tiny_llama" and prof["dtype"] == "float32" and prof["device"] == "cpu"
    assert prof["q"] == [1, 2, 4] and prof["contexts"] == [16] and prof["repeats"] == 2
    assert isinstance(prof["threads"], int) and prof["torch"]
    assert prof["c_verify"]["16"] == pytest.approx(target.relative.tolist())
    assert prof["step_seconds"]["16"] == pytest.approx(target[target.q == 1].seconds.item())
    assert list(prof["drafters"]) == DRAFTERS
    for name, d in prof["drafters"].items():
        assert d["c_draft"] == pytest.approx(d["seconds_per_token"] / prof["step_seconds"]["16"])
        assert d["c_draft"] == pytest.approx(drafters[drafters.name == name].relative.item())
    assert prof["drafters"]["quantized"]["kind"] == "quantized"
    assert prof["drafters"]["quantized"]["drafted"] == 8  # draft_tokens, EOS does not end a profiled draft

    # the tie tolerance's calibration: fp32 chunked forwards agree with one-token steps to rounding
    r = prof["rounding"]
    assert r["positions"] > 0 and r["argmax_agree"] == r["positions"] and 0 <= r["max_abs"] < 1e-3

    # token trees timed with the tree mask, beside the chain of as many tokens (q = nodes + 1)
    trees = prof["trees"]["16"]
    assert [(t["branches"], t["depth"], t["nodes"]) for t in trees] == [(2, 2, 4), (3, 1, 3)]
    for t in trees:
        assert t["seconds"] > 0 and t["c_verify"] == pytest.approx(t["seconds"] / prof["step_seconds"]["16"])

    md = (run_dir / "profile.md").read_text()
    assert "tree 2x2 (4 nodes)" in md and "chain q=5" in md
    assert "context |" in md and "step_ms" in md and "q=4" in md and "early_exit_1" in md
    assert "Rounding (the tie tolerance)" in md
    assert "step_ms" in out and "c_draft" in out  # printed too


def test_best_draft_length_from_an_eval_run(eval_run, tmp_path):
    run_dir = tmp_path / "best"
    code, err, out = run(
        "profile",
        *TINY,
        "profile.q=[1,2,3,4]",
        "profile.contexts=[16]",
        "profile.repeats=2",
        f"profile.run={eval_run}",
        f"hydra.run.dir={run_dir}",
    )
    assert code == 0, err[-3000:]
    curve = pd.read_csv(run_dir / "best_k.csv")
    assert set(curve.drafter) <= set(DRAFTERS) and "quantized" in set(curve.drafter)
    prof = json.loads((run_dir / "profile.json").read_text())
    rounds = [json.loads(x) for x in (eval_run / "rounds.jsonl").read_text().splitlines()]
    for name, rows in curve.groupby("drafter"):
        mine = [r for r in rounds if r["method"] == f"fixed:{name}" and r["arm"] == name]
        K = max(
            r["n_max"] for r in mine if r["drafted"] == r["n_max"] >= 1
        )  # 2 but for a drafter out of luck
        assert rows.k.tolist() == [1, 2, 3]  # q = k + 1 measured
        assert rows.extrapolated.tolist() == [k > K for k in (1, 2, 3)]
        assert rows.best.sum() == 1
        assert rows[rows.best].predicted_speedup.item() == rows.predicted_speedup.max()
        c_draft = prof["drafters"][name]["c_draft"]
        assert rows.draft_cost.tolist() == pytest.approx([c_draft, 2 * c_draft, 3 * c_draft])
        assert rows.verify_cost.tolist() == pytest.approx(prof["c_verify"]["16"][1:])
        # E[accepted(k)] for k <= K: the mean of min(accepted, k) over the full rounds at K = 2
        full = [r["accepted"] for r in mine if r["drafted"] == r["n_max"] == K]
        for k in range(1, K + 1):
            assert rows[rows.k == k].expected_accepted.item() == pytest.approx(
                sum(min(a, k) for a in full) / len(full)
            )
        assert rows.expected_accepted.is_monotonic_increasing
    md = (run_dir / "best_k.md").read_text()
    assert "best_k" in md and "extrapolated" in md
    assert "Best draft length" in out


def test_cost_measured_reads_the_profile(profiled, tmp_path):
    run_dir, _ = profiled
    prof = json.loads((run_dir / "profile.json").read_text())
    target = Target(load_model("embedded:tiny_llama", dtype="float32", device="cpu"))
    drafters = {
        "quantized": {"_target_": "specbench.drafters.quantized.build", "cost": "measured"},
        "prompt_lookup": {"_target_": "specbench.drafters.prompt_lookup.build", "cost": "measured"},
        "early_exit_1": {"_target_": "specbench.drafters.early_exit.build", "layers": 1, "cost": 0.25},
    }
    for where in (run_dir, run_dir / "profile.json"):
        pool = build_pool(target, drafters, profile=str(where))
        assert pool["quantized"].cost == prof["drafters"]["quantized"]["c_draft"]
        assert pool["prompt_lookup"].cost == prof["drafters"]["prompt_lookup"]["c_draft"]
        assert pool["early_exit_1"].cost == 0.25  # a number stays a number
    with pytest.raises(SpecbenchError, match="no profile is given"):
        build_pool(target, drafters)
    assert (
        build_pool(target, drafters, measuring=True)["quantized"].cost > 0
    )  # the profile command's own pool
    renamed = {"other": drafters["quantized"]}
    with pytest.raises(SpecbenchError, match="no measured cost of drafter 'other'"):
        build_pool(target, renamed, profile=str(run_dir))
    bf16 = tmp_path / "bf16"
    bf16.mkdir()
    (bf16 / "profile.json").write_text(json.dumps({**prof, "dtype": "bfloat16"}))
    with pytest.raises(SpecbenchError, match="measured on embedded:tiny_llama \\(bfloat16, cpu\\)"):
        build_pool(target, drafters, profile=str(bf16))


EVAL = [
    *TINY,
    "dataset.limit=1",
    "decoding.max_new_tokens=4",
    "warmup.max_new_tokens=0",
    "methods=[autoregressive]",
    "pool.drafters.quantized.cost=measured",
]


def test_eval_with_cost_measured_and_no_profile_path_is_a_clear_error(tmp_path):
    code, err, _ = run("eval", *EVAL, f"hydra.run.dir={tmp_path / 'run'}")
    assert_clear_error(
        code,
        err,
        "error: drafter 'quantized' has cost: measured, but no profile is given",
        "specbench profile",
        "profile_path=",
    )
    assert not (tmp_path / "run").exists()


def test_eval_passes_profile_path_to_the_pool(profiled, tmp_path):
    run_dir, _ = profiled
    lacking = tmp_path / "lacking"
    lacking.mkdir()
    prof = json.loads((run_dir / "profile.json").read_text())
    del prof["drafters"]["quantized"]
    (lacking / "profile.json").write_text(json.dumps(prof))
    code, err, _ = run("eval", *EVAL, f"profile_path={lacking}", f"hydra.run.dir={tmp_path / 'run'}")
    assert_clear_error(code, err, "has no measured cost of drafter 'quantized'", "specbench profile")
    ok = tmp_path / "ok"
    shutil.copytree(run_dir, ok)
    code, err, _ = run("eval", *EVAL, f"profile_path={ok}", f"hydra.run.dir={tmp_path / 'run2'}")
    assert code == 0, err[-3000:]


def test_profile_errors(tmp_path):
    code, err, _ = run("profile", *PROFILE, f"profile.run={tmp_path}", f"hydra.run.dir={tmp_path / 'a'}")
    assert_clear_error(code, err, f"profile.run={tmp_path}: no rounds.jsonl there", "specbench eval")
    assert not (tmp_path / "a").exists()
    code, err, _ = run("profile", *TINY, "profile.contexts=[5000]", f"hydra.run.dir={tmp_path / 'b'}")
    assert_clear_error(code, err, "profile.contexts: a context of 5,000 tokens", "lower profile.contexts")
    code, err, _ = run("profile", *PROFILE, "profile.trees=[[2,0]]", f"hydra.run.dir={tmp_path / 'd'}")
    assert_clear_error(
        code, err, "profile.trees: [2, 0] is not a [branches, depth] pair", "profile.trees=[[2,5]"
    )
    code, err, _ = run("profile", *TINY, "profile.repeats=0", f"hydra.run.dir={tmp_path / 'c'}")
    assert_clear_error(code, err, "error: profile.repeats=0: expected an integer >= 1")


def test_an_eagle_head_is_profiled_from_the_target_states(tmp_path):
    """A feature-level head reads the target's prefill states from the Query, as in the decode loop."""
    import torch

    from specbench.decoding.sampling import SamplingParams
    from specbench.drafters.eagle import EagleHead
    from specbench.drafters.head_files import save_head, vocab_fingerprint
    from specbench.pipelines import profile as pipeline
    from specbench.timing import Clock

    target = Target(load_model("embedded:tiny_llama", dtype="float32", device="cpu"))
    torch.manual_seed(0)
    save_head(
        EagleHead(target.model, layers=1).eval(),
        None,
        tmp_path / "head",
        {"kind": "eagle", "target": "embedded:tiny_llama", "vocab": vocab_fingerprint(target.tokenizer)},
    )
    pool = build_pool(
        target,
        {
            "eagle": {"_target_": "specbench.drafters.eagle.build", "checkpoint": str(tmp_path / "head")},
            "prompt_lookup": {"_target_": "specbench.drafters.prompt_lookup.build"},
        },
    )
    context = pipeline.repeat_to(target.tokenizer("profile me, profile me")["input_ids"], 24)
    drafters = {name: d for name, d in pool.items() if d.drafts}
    got = pipeline.measure_drafters(
        target,
        drafters,
        context,
        5,
        SamplingParams(),
        torch.Generator().manual_seed(0),
        pipeline.Readings(repeats=2, warmup=1, clock=Clock("cpu")),
    )
    assert list(got) == ["eagle", "prompt_lookup"]
    assert got["eagle"]["drafted"] == 5 and got["eagle"]["seconds_per_token"] > 0
    assert got["prompt_lookup"]["drafted"] == 5  # the context repeats itself: a match to copy


def test_profile_run_of_another_setting_is_refused(eval_run, tmp_path):
    """issue 34: profile.run combined any eval run's acceptance (another target, dtype, a sampling run) with this
    target's costs without a word."""
    from omegaconf import OmegaConf

    other = tmp_path / "other"
    shutil.copytree(eval_run, other)
    cfg = OmegaConf.load(other / "config.yaml")
    cfg.target.model, cfg.decoding.temperature = "embedded:tiny_t5", 1.0
    (other / "config.yaml").write_text(OmegaConf.to_yaml(cfg))
    code, err, _ = run("profile", *PROFILE, f"profile.run={other}", f"hydra.run.dir={tmp_path / 'p'}")
    assert_clear_error(
        code, err, "target.model embedded:tiny_t5 (here embedded:tiny_llama)", "decoding=greedy"
    )
    assert "decoding.temperature=1.0" in err
