"""The command line end to end on tiny in-process models (Hydra overrides, files, resume, errors)."""

import json
import subprocess
import sys

import pandas as pd
import pytest

TINY = [
    "target=tiny_llama",
    "pool=tiny",
    "dataset.limit=1",
    "decoding.max_new_tokens=8",
    "warmup.max_new_tokens=2",
]


def specbench(*args, cwd=None):
    return subprocess.run(
        [sys.executable, "-m", "specbench.cli", *args], capture_output=True, text=True, cwd=cwd, timeout=600
    )


def test_help_lists_commands():
    res = specbench("--help")
    assert res.returncode == 0
    for cmd in ("eval", "collect", "train-policy", "profile"):
        assert cmd in res.stdout


def test_eval_writes_records_and_resumes(tmp_path):
    run_dir = tmp_path / "run"
    res = specbench("eval", *TINY, f"hydra.run.dir={run_dir}")
    assert res.returncode == 0, res.stderr[-3000:]
    for name in ("config.yaml", "rounds.jsonl", "examples.jsonl", "summary.csv", "summary.md"):
        assert (run_dir / name).exists(), name
    summary = pd.read_csv(run_dir / "summary.csv")
    for col in (
        "task",
        "method",
        "n_examples",
        "new_tokens",
        "seconds",
        "tokens_per_s",
        "speedup",
        "mat",
        "acceptance_rate",
        "exact_match",
    ):
        assert col in summary.columns
    methods = set(summary.method)
    assert {"autoregressive", "fixed:quantized", "fixed:prompt_lookup", "fixed:early_exit_1"} <= methods
    assert (summary.exact_match == 1.0).all()  # greedy speculative decoding is lossless
    assert "Forks judged at tie tolerance 0.0001" in (run_dir / "summary.md").read_text()  # tiny_llama: fp32
    assert set(summary.task) == {"translation", "summarization", "math", "chat", "code", "all"}
    assert "| method" in res.stdout  # the table is printed
    examples = [json.loads(x) for x in (run_dir / "examples.jsonl").read_text().splitlines()]
    assert len(examples) == 5 * 4  # 5 tasks x 1 example x 4 methods
    rounds = (run_dir / "rounds.jsonl").read_text().splitlines()
    assert sum(e["rounds"] for e in examples) == len(rounds)

    # Rerunning into the same directory skips every finished generation.
    again = specbench("eval", *TINY, f"hydra.run.dir={run_dir}")
    assert again.returncode == 0, again.stderr[-3000:]
    assert len((run_dir / "examples.jsonl").read_text().splitlines()) == len(examples)


def test_eval_resumes_after_interruption(tmp_path):
    """A run killed half way keeps its finished lines and completes them without duplicates."""
    run_dir = tmp_path / "run"
    full = specbench("eval", *TINY, f"hydra.run.dir={run_dir}")
    assert full.returncode == 0, full.stderr[-3000:]
    lines = (run_dir / "examples.jsonl").read_text().splitlines()
    (run_dir / "examples.jsonl").write_text("\n".join(lines[:5]) + "\n" + lines[5][:20])  # torn last line
    res = specbench("eval", *TINY, f"hydra.run.dir={run_dir}")
    assert res.returncode == 0, res.stderr[-3000:]
    keys = [(r["query_id"], r["method"]) for r in map(json.loads, filter(None, _complete_lines(run_dir)))]
    assert len(keys) == len(set(keys)) == len(lines)


def _complete_lines(run_dir):
    out = []
    for line in (run_dir / "examples.jsonl").read_text().splitlines():
        try:
            json.loads(line)
            out.append(line)
        except json.JSONDecodeError:
            pass
    return out


def test_eval_encoder_decoder_with_hf_drafter(tmp_path):
    res = specbench(
        "eval",
        "target=tiny_t5",
        "pool=tiny_t5_hf",
        "dataset.limit=1",
        "decoding.max_new_tokens=8",
        "warmup.max_new_tokens=0",
        f"hydra.run.dir={tmp_path}",
    )
    assert res.returncode == 0, res.stderr[-3000:]
    summary = pd.read_csv(tmp_path / "summary.csv")
    assert "fixed:tiny_draft" in set(summary.method)
    assert (summary.exact_match == 1.0).all()


@pytest.mark.slow  # 24 s: the slow set
def test_several_selectors_in_one_run(tmp_path):
    res = specbench(
        "eval",
        *TINY,
        "methods=[autoregressive,fixed:*,selector:ucb,selector:exp3]",
        f"hydra.run.dir={tmp_path}",
    )
    assert res.returncode == 0, res.stderr[-3000:]
    summary = pd.read_csv(tmp_path / "summary.csv")
    assert {"ucb-bd", "exp3-bd", "oracle"} <= set(summary.method)
    assert (summary.exact_match == 1.0).all()  # switching drafters every round stays lossless
    bad = specbench("eval", *TINY, "methods=[selector:nope]", f"hydra.run.dir={tmp_path / 'bad'}")
    assert bad.returncode == 2 and "no selector config named 'nope'" in bad.stderr


def test_multirun_sweep(tmp_path):
    res = specbench(
        "eval",
        "-m",
        *TINY,
        "methods=[autoregressive,fixed:quantized]",
        "decoding.draft_length=1,3",
        f"hydra.sweep.dir={tmp_path}",
    )
    assert res.returncode == 0, res.stderr[-3000:]
    assert (tmp_path / "0" / "summary.csv").exists() and (tmp_path / "1" / "summary.csv").exists()


@pytest.mark.parametrize(
    "override, message",
    [
        ("pool=nope", "smollm2_default"),  # Hydra lists the available pools
        ("decoding.draft_length=0", "decoding.draft_length=0: expected an integer >= 1"),
        ("methods=[fixed:nope]", "no arm named 'nope'"),
        ("target.model=embedded:nope", "unknown embedded model"),
        ("target.model=./no/such/model", "does not exist"),
        ("dataset=gsm8k dataset.path=./missing.jsonl", "does not exist"),
        ("decoding.temperature=-1", "decoding.temperature=-1: expected a finite number >= 0"),
    ],
)
def test_bad_input_is_named(tmp_path, override, message):
    res = specbench("eval", *TINY, *override.split(), f"hydra.run.dir={tmp_path}")
    assert res.returncode != 0
    assert message in res.stderr + res.stdout


def test_empty_dataset_is_an_error(tmp_path):
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    res = specbench(
        "eval", *TINY, "dataset=gsm8k", f"dataset.path={empty}", f"hydra.run.dir={tmp_path / 'run'}"
    )
    assert res.returncode == 2
    assert "empty" in res.stderr


@pytest.mark.slow  # 20 s: the slow set
def test_two_turn_chat_and_quality_columns(tmp_path):
    """MT-Bench-shaped data: both turns are generated and recorded; task metrics reach the summary."""
    mt = tmp_path / "question.jsonl"
    mt.write_text('{"question_id": 1, "category": "writing", "turns": ["Write a line.", "Shorter."]}\n')
    res = specbench(
        "eval",
        *TINY,
        "dataset=mt_bench",
        f"dataset.path={mt}",
        "methods=[autoregressive,fixed:quantized]",
        f"hydra.run.dir={tmp_path / 'mt'}",
    )
    assert res.returncode == 0, res.stderr[-3000:]
    examples = [json.loads(x) for x in (tmp_path / "mt" / "examples.jsonl").read_text().splitlines()]
    assert sorted((e["query_id"], e["turn"]) for e in examples if e["method"] == "autoregressive") == [
        ("q1", 1),
        ("q1/turn2", 2),
    ]
    res = specbench("eval", *TINY, f"hydra.run.dir={tmp_path / 'emb'}", "methods=[autoregressive]")
    assert res.returncode == 0, res.stderr[-3000:]
    summary = pd.read_csv(tmp_path / "emb" / "summary.csv")
    for col in ("bleu", "rouge2", "accuracy", "output_words"):
        assert col in summary.columns
    # the table's BLEU is corpus BLEU of the records' texts against their references (one translation query)
    from specbench.tasks.metrics import corpus_bleu

    emb = [json.loads(x) for x in (tmp_path / "emb" / "examples.jsonl").read_text().splitlines()]
    trans = [e for e in emb if e["task"] == "translation"]
    assert len(trans) == 1 and trans[0]["reference"] and 0.0 <= trans[0]["quality"]["bleu"] <= 100.0
    expected = corpus_bleu([trans[0]["text"]], [trans[0]["reference"]])
    assert summary.set_index("task").loc["translation", "bleu"] == pytest.approx(expected, abs=1e-3)


@pytest.mark.slow  # 33 s: the slow set
def test_metasd_experiment_writes_table_and_convergence(tmp_path):
    res = specbench(
        "eval",
        "+experiment=metasd_cpu",
        "target=tiny_llama",
        "pool=tiny",
        "dataset.limit=1",
        "decoding.max_new_tokens=8",
        "warmup.max_new_tokens=0",
        f"hydra.run.dir={tmp_path}",
    )
    assert res.returncode == 0, res.stderr[-3000:]
    summary = pd.read_csv(tmp_path / "summary.csv")
    assert {
        "ucb-bd",
        "ucb-be",
        "exp3-bd",
        "halving-bd",
        "ducb-bd",
        "swucb-bd",
        "etc-bd",
        "random",
        "oracle",
    } <= set(summary.method)
    conv = pd.read_csv(tmp_path / "convergence.csv")
    assert set(conv.columns) == {"method", "round", "share", "n"}
    assert conv.share.between(0, 1).all() and "fixed:quantized" not in set(conv.method)
    assert (tmp_path / "convergence.png").stat().st_size > 0


@pytest.mark.parametrize(
    "args",
    [
        [
            "eval",
            *TINY,
            "hydra.run.dir=/proc/specbench_run",
        ],  # a run directory that cannot be made (was a traceback)
        ["eval", *TINY, "+experiment=metasd_cpu", "+experiment=huang_cpu", "--cfg", "job"],  # two presets
        [
            "train-drafter",
            "target=tiny_llama",
            "train.epochs=1",
            "out=/proc/specbench_head",
        ],  # its fix names out=
    ],
)
def test_unmakeable_paths_and_two_experiments_are_clear_errors(args, tmp_path):
    """issue 34: an ENOENT run directory and two experiments (the last silently won) give error/fix lines."""
    res = specbench(*args, cwd=tmp_path)
    assert res.returncode == 2, res.stderr[-3000:]
    assert "Traceback" not in res.stderr and "error: " in res.stderr and "fix:   " in res.stderr, res.stderr[
        -3000:
    ]
    if args[0] == "train-drafter":
        assert "out=<a writable directory>" in res.stderr and "hydra.run.dir" not in res.stderr, res.stderr[
            -3000:
        ]


def test_a_directory_where_the_run_claim_file_goes_is_a_clear_error(tmp_path):
    run_dir = tmp_path / "run"
    (run_dir / ".specbench.yaml").mkdir(parents=True)
    res = specbench("eval", *TINY, f"hydra.run.dir={run_dir}", cwd=tmp_path)
    assert res.returncode == 2 and "Traceback" not in res.stderr, res.stderr[-3000:]
    assert ".specbench.yaml" in res.stderr and "fix:   " in res.stderr
