"""Bad input through the command line (issue 14): one ``error:`` line, one ``fix:`` line, exit code 2,
no traceback, and no half-made run directory left behind. The CLI runs in process (Typer's runner)
on the tiny models, so each case costs about a second."""

from __future__ import annotations

import errno
import json
import os
from pathlib import Path

import pytest
from typer.testing import CliRunner

import specbench.pipelines.session.prompting as prompting
from specbench.cli import app
from specbench.configs import group_options

TINY = [
    "target=tiny_llama",
    "pool=tiny",
    "dataset.limit=1",
    "decoding.max_new_tokens=4",
    "warmup.max_new_tokens=0",
]


# Hydra's logging setup (logging.config.dictConfig) would close pytest's log capture in this process.
QUIET = ["hydra/job_logging=none", "hydra/hydra_logging=none"]


def run(*args: str):
    res = CliRunner().invoke(app, [*args, *QUIET])
    return res.exit_code, res.stderr, res.stdout


def assert_clear_error(code: int, err: str, *words: str) -> None:
    assert code == 2, err[-3000:]
    assert "Traceback" not in err, err[-3000:]
    lines = err.strip().splitlines()
    assert any(line.startswith("error: ") for line in lines) and any(
        line.startswith("fix:   ") for line in lines
    ), err
    for word in words:
        assert word in err, (word, err[-3000:])


@pytest.fixture
def no_model_loads(monkeypatch):
    """Loading a model fails the test: validation must stop the run before."""

    def load_model(*args, **kwargs):
        raise AssertionError("a model was loaded before the config was validated")

    monkeypatch.setattr(prompting, "load_model", load_model)


# -- wrong types and ranges: caught before anything loads ---------------------------------------


@pytest.mark.parametrize(
    "command, override, line",
    [
        ("eval", "decoding.draft_length=abc", "error: decoding.draft_length=abc: expected an integer >= 1"),
        (
            "eval",
            "decoding.temperature=abc",
            "error: decoding.temperature=abc: expected a finite number >= 0",
        ),
        (
            "eval",
            "decoding.temperature=nan",
            "error: decoding.temperature=nan: expected a finite number >= 0",
        ),
        ("eval", "decoding.temperature=-1", "error: decoding.temperature=-1: expected a finite number >= 0"),
        ("eval", "dataset.limit=abc", "error: dataset.limit=abc: expected an integer >= 1 or null"),
        ("eval", "threads=-1", "error: threads=-1: expected an integer >= 1 or null"),
        ("eval", "seed=abc", "error: seed=abc: expected an integer >= 0"),
        ("eval", "decoding.draft_length=2.9", "error: decoding.draft_length=2.9: expected an integer >= 1"),
        ("eval", "dataset=spec_bench", "error: dataset.path is not set (the config leaves it as ???)"),
        ("collect", "seed=abc", "error: seed=abc: expected an integer >= 0"),
        ("cascades", "decoding.draft_length=abc", "error: decoding.draft_length=abc"),
        ("bench", "threads=-1", "error: threads=-1"),
        ("train-policy", "train.epochs=abc", "error: train.epochs=abc: expected an integer >= 1"),
        ("train-drafter", "drafter.layers=abc", "error: drafter.layers=abc: expected an integer >= 1"),
    ],
)
def test_wrong_types_fail_before_anything_loads(tmp_path, no_model_loads, command, override, line):
    run_dir = tmp_path / "run"
    base = {"train-policy": [], "train-drafter": ["target=tiny_llama"]}.get(command, TINY)
    code, err, _ = run(command, *base, override, f"hydra.run.dir={run_dir}")
    key = line.removeprefix("error: ").split("=")[0].split(" ")[0]
    assert_clear_error(code, err, line, f"fix:   set {key}=<")
    assert not run_dir.exists()  # nothing was written: the run stopped before it started


# -- Hydra's composition errors: exit 2 with error/fix lines ------------------------------------


@pytest.mark.parametrize(
    "args, problem, fix",
    [
        (
            ["target=nope"],
            "error: no target config named 'nope'",
            "fix:   use one of: " + ", ".join(group_options("target")),
        ),
        (
            ["decoding.nope=1"],
            "error: unknown config key 'decoding.nope' (decoding has: temperature",
            "prefix it with +",
        ),
        (["selector.beta=2"], "error: unknown config key 'selector.beta'", "--help` lists the config groups"),
        (
            ["experiment=nope"],
            "error: no experiment config named 'nope'",
            "fix:   use one of: aa_cpu, batch_cpu, budget_by_task_local_cpu, budget_decisions_cpu, budget_decisions_local_cpu",
        ),
        (["decoding.draft_length=[1"], "error: cannot read the override", "KEY=VALUE"),
        (["-m", "target=tiny_llama,nope"], "error: no target config named 'nope'", "fix:   use one of:"),
    ],
)
def test_composition_errors_exit_2_with_error_and_fix(tmp_path, args, problem, fix):
    code, err, _ = run(
        "eval", *args, f"hydra.run.dir={tmp_path / 'run'}", f"hydra.sweep.dir={tmp_path / 'sweep'}"
    )
    assert_clear_error(code, err, problem, fix)
    assert "HYDRA_FULL_ERROR" not in err and "HYDRA_FULL_ERROR" not in os.environ
    assert not (tmp_path / "run").exists()


# -- unreadable inputs ---------------------------------------------------------------------------


def test_non_utf8_data_file(tmp_path):
    data = tmp_path / "latin1.jsonl"
    data.write_bytes(b'{"question": "caf\xe9 costs 3", "answer": "#### 3"}\n')
    code, err, _ = run(
        "eval", *TINY, "dataset=gsm8k", f"dataset.path={data}", f"hydra.run.dir={tmp_path / 'run'}"
    )
    assert_clear_error(code, err, f"{data}:1: not UTF-8 text (byte 0xe9", "iconv")


def test_damaged_parquet_file(tmp_path):
    data = tmp_path / "test.parquet"
    data.write_bytes(os.urandom(300))
    code, err, _ = run(
        "eval", *TINY, "dataset=gsm8k", f"dataset.path={data}", f"hydra.run.dir={tmp_path / 'run'}"
    )
    assert_clear_error(code, err, f"{data}: not a readable Parquet file")


@pytest.mark.parametrize("content", [None, "readme.txt"])
def test_directory_that_is_not_a_model(tmp_path, content):
    model = tmp_path / "model"
    model.mkdir()
    if content:
        (model / content).write_text("not a model")
    code, err, _ = run("eval", *TINY, f"target.model={model}", f"hydra.run.dir={tmp_path / 'run'}")
    assert_clear_error(
        code, err, f"'{model}' is not a model directory: it has no config.json", "save_pretrained"
    )


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory):
    """One finished tiny eval run (2 methods x 5 tasks), copied by the tests that damage it."""
    run_dir = tmp_path_factory.mktemp("finished") / "run"
    code, err, _ = run(
        "eval", *TINY, "methods=[autoregressive,fixed:prompt_lookup]", f"hydra.run.dir={run_dir}"
    )
    assert code == 0, err[-3000:]
    return run_dir


def damaged_copy(finished_run: Path, tmp_path: Path, damage) -> Path:
    import shutil

    run_dir = tmp_path / "run"
    shutil.copytree(finished_run, run_dir)
    examples = run_dir / "examples.jsonl"
    lines = examples.read_bytes().splitlines(keepends=True)
    lines[2] = damage(lines[2])
    examples.write_bytes(b"".join(lines))
    return run_dir


@pytest.mark.parametrize(
    "damage, words",
    [
        (lambda line: line.replace(b'"task"', b'"t\xe4sk"'), "examples.jsonl:3: not UTF-8 text"),
        (
            lambda line: (
                json.dumps({k: v for k, v in json.loads(line).items() if k != "method"}) + "\n"
            ).encode(),
            "examples.jsonl: record 3 has no method",
        ),
    ],
)
def test_damaged_examples_on_resume(finished_run, tmp_path, damage, words):
    run_dir = damaged_copy(finished_run, tmp_path, damage)
    code, err, _ = run(
        "eval", *TINY, "methods=[autoregressive,fixed:prompt_lookup]", f"hydra.run.dir={run_dir}"
    )
    assert_clear_error(code, err, words, "repair or delete line")
    assert (run_dir / "examples.jsonl").exists()  # a directory with results is never removed


def test_read_only_output_directory(tmp_path, monkeypatch):
    parent = tmp_path / "read_only"
    parent.mkdir()
    parent.chmod(0o555)
    if os.geteuid() == 0:  # root writes anywhere: make the file system refuse, as a read-only mount does
        real_mkdir = os.mkdir

        def mkdir(path, *args, **kwargs):
            if Path(path).is_relative_to(parent):
                raise PermissionError(errno.EROFS, os.strerror(errno.EROFS), str(path))
            return real_mkdir(path, *args, **kwargs)

        monkeypatch.setattr(os, "mkdir", mkdir)
    try:
        code, err, _ = run("eval", *TINY, f"hydra.run.dir={parent / 'run'}")
    finally:
        parent.chmod(0o755)
    assert_clear_error(code, err, str(parent / "run"), "hydra.run.dir=<a writable directory>")


# -- half-made run directories -------------------------------------------------------------------


def test_a_run_that_fails_before_its_first_record_leaves_no_directory(tmp_path):
    empty = tmp_path / "empty_model"
    empty.mkdir()
    run_dir = tmp_path / "outputs" / "run"
    code, err, _ = run("eval", *TINY, f"target.model={empty}", f"hydra.run.dir={run_dir}")
    assert_clear_error(code, err, "is not a model directory")  # fails after the config was saved
    assert not run_dir.exists()


def test_a_failing_run_keeps_a_directory_that_held_something(tmp_path):
    empty = tmp_path / "empty_model"
    empty.mkdir()
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "notes.txt").write_text("mine")
    code, err, _ = run("eval", *TINY, f"target.model={empty}", f"hydra.run.dir={run_dir}")
    assert code == 2, err
    assert (run_dir / "notes.txt").read_text() == "mine"


# -- help ----------------------------------------------------------------------------------------


def test_an_experiment_is_selected_with_or_without_the_plus(tmp_path):
    """``experiment=NAME`` (the root configs list ``experiment: null``) and ``experiment=NAME`` compose the same."""
    printed = []
    for spelling in ("experiment=metasd_cpu", "+experiment=metasd_cpu"):
        code, err, out = run("eval", "--cfg", "job", spelling, f"hydra.run.dir={tmp_path / 'run'}")
        assert code == 0, err[-2000:]
        printed.append(out)
    assert printed[0] == printed[1] and "selector:sequential_halving" in printed[0]  # the preset's methods
    code, _, plain = run("eval", "--cfg", "job", f"hydra.run.dir={tmp_path / 'run'}")
    assert code == 0 and "selector:sequential_halving" not in plain


def test_eval_help_lists_config_groups_and_options():
    code, _, out = run("eval", "--help")
    assert code == 0
    text = " ".join(out.split())
    assert "Config groups" in text
    targets = ", ".join(t + ("*" if t == "smollm2_135m" else "") for t in group_options("target"))
    for line in (
        f"target: {targets}",
        "decoding: greedy*, sampling",
        "cascade: chow",
        "selector: budget, budget_by_query, budget_by_task, budget_kept, discounted_ucb",
        "experiment: aa_cpu, batch_cpu, budget_by_task_local_cpu, budget_decisions_cpu, budget_decisions_local_cpu",
    ):
        assert line in text, line
    code, _, out = run("train-policy", "--help")
    assert code == 0 and "conf/train_policy.yaml" in " ".join(out.split())
