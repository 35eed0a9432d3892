"""Resume equality: a run interrupted and resumed into its directory equals an uninterrupted one,
record for record (every field but the timings and the id of the process that timed it).

Each pipeline runs in process on the tiny Llama, twice with the same config: once whole, once
interrupted then rerun into the same directory. Interruptions:

- ``interrupt``: a ``KeyboardInterrupt`` (Ctrl-C) raised where the pipeline writes its ``n``-th
  generation (``Records.write`` for eval and cascades, ``JsonlWriter.write`` of ``bench.jsonl``),
  so the run stops between two generations, as a kill between two appends leaves it;
- ``orphan_rounds`` (eval, cascades): the run's last ``examples.jsonl`` line deleted after a whole
  run, its rounds left in ``rounds.jsonl`` (a kill between the two appends; or the user deleting a
  damaged line); the resume redoes that generation and must not count its rounds twice;
- train-drafter: a ``KeyboardInterrupt`` where epoch 3 of 4 would save ``state.pt``; the rerun resumes
  after epoch 2 and must give the same weights, history and held-out metrics.

Covered: eval greedy (fixed drafters and a UCB selector), eval sampling (temperature 1, top-k 8,
the same), cascades (two rules), bench, train-drafter. Runtime: ~5-15 s per case.
"""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest
import torch
from hydra import compose, initialize_config_dir
from safetensors.torch import load_file

from specbench.configs import conf_dir
from specbench.pipelines import bench, cascades, evaluate, train_drafter
from specbench.pipelines.session.run_records import Records
from specbench.records import JsonlWriter
from specbench.training import fit

# timings, the process that timed a record, and how many generations a speedup pairs with a baseline timed
# in the same process (a resume times in another)
TIMING = {"seconds", "process", "pid", "tokens_per_s", "speedup", "time", "paired"}


def cfg_of(name: str, overrides: list[str]):
    with initialize_config_dir(config_dir=conf_dir(), version_base=None):
        return compose(config_name=name, overrides=overrides)


def untimed(row: dict) -> dict:
    """A record without its timings (``seconds``, ``t_*``) or the process that timed it."""
    return {k: v for k, v in row.items() if k not in TIMING and not k.startswith("t_") and "pid" not in k}


def lines(path: Path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()] if path.exists() else []


def assert_same_records(whole: Path, resumed: Path, files=("examples.jsonl", "rounds.jsonl")):
    for name in files:
        a, b = [untimed(r) for r in lines(whole / name)], [untimed(r) for r in lines(resumed / name)]
        assert len(b) == len(a), f"{name}: {len(b)} records after the resume, {len(a)} in the whole run"
        key = ("query_id", "method", "impl", "round")
        order = lambda r, key=key: tuple(str(r.get(k)) for k in key)  # noqa: E731
        a, b = sorted(a, key=order), sorted(b, key=order)
        for ra, rb in zip(a, b):
            assert ra == rb, f"{name}: {order(ra)} differs: " + ", ".join(
                f"{k}: {ra.get(k)!r} -> {rb.get(k)!r}"
                for k in sorted(set(ra) | set(rb))
                if ra.get(k) != rb.get(k)
            )


def assert_same_summary(whole: Path, resumed: Path, name: str, keys=("task", "method")):
    a, b = pd.read_csv(whole / name), pd.read_csv(resumed / name)
    assert list(a.columns) == list(b.columns)
    cols = [
        c
        for c in a.columns
        if c not in TIMING
        and not c.startswith("t_")
        and not c.endswith("_s")
        and not any(w in c for w in ("second", "speedup", "per_s", "share", "_vs_"))
    ]  # time shares, ratios
    if "method" in a.columns:  # the oracle is the fastest drafter per query: picked by timings
        a, b = a[a.method != "oracle"], b[b.method != "oracle"]
    a, b = (
        a[cols].sort_values(list(keys)).reset_index(drop=True),
        b[cols].sort_values(list(keys)).reset_index(drop=True),
    )
    pd.testing.assert_frame_equal(a, b, check_dtype=False)


def interrupt_at(monkeypatch, owner, attr: str, n: int):
    """Raise KeyboardInterrupt at the ``n``-th call of ``owner.attr`` (before it runs; a method or a
    module function: the wrapper passes its first argument on)."""
    original = getattr(owner, attr)
    calls = {"n": 0}

    def wrapper(self, *args, **kwargs):
        calls["n"] += 1
        if calls["n"] == n:
            raise KeyboardInterrupt(f"test interruption at call {n} of {attr}")
        return original(self, *args, **kwargs)

    monkeypatch.setattr(owner, attr, wrapper)
    return calls


def drop_last_example(run_dir: Path) -> dict:
    path = run_dir / "examples.jsonl"
    rows = path.read_text().splitlines()
    path.write_text("".join(r + "\n" for r in rows[:-1]))
    return json.loads(rows[-1])


def resumed_run(run, cfg_name, overrides, out: Path, monkeypatch, how: str, owner=Records, attr="write", n=7):
    """``run`` into ``out``: interrupted (``how``), then rerun into the same directory."""
    if how == "interrupt":
        calls = interrupt_at(monkeypatch, owner, attr, n)
        with pytest.raises(KeyboardInterrupt):
            run(cfg_of(cfg_name, overrides), out)
        assert calls["n"] == n
        monkeypatch.undo()
    elif how == "orphan_rounds":
        run(cfg_of(cfg_name, overrides), out)
        dropped = drop_last_example(out)
        assert any(
            r["query_id"] == dropped["query_id"] and r["method"] == dropped["method"]
            for r in lines(out / "rounds.jsonl")
        )  # its rounds stay behind
    run(cfg_of(cfg_name, overrides), out)
    return out


@pytest.fixture(scope="module")
def whole_runs(tmp_path_factory):
    """Each uninterrupted run, made once per module."""
    made = {}

    def get(name, run, cfg_name, overrides):
        if name not in made:
            out = tmp_path_factory.mktemp(f"whole_{name}")
            run(cfg_of(cfg_name, overrides), out)
            made[name] = out
        return made[name]

    return get


EVAL = [
    "target=tiny_llama",
    "pool=tiny",
    "dataset.limit=1",
    "decoding.max_new_tokens=10",
    "warmup.max_new_tokens=2",
    "methods=[autoregressive,fixed:*,selector:ucb]",
]
EVAL_CASES = {
    "greedy": EVAL,
    "sampling": EVAL + ["decoding=sampling", "decoding.max_new_tokens=10", "decoding.top_k=8", "seed=3"],
}
CASCADES = [
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
BENCH = [
    "target=tiny_llama",
    "pool=tiny",
    "dataset.limit=1",
    "decoding.max_new_tokens=8",
    "warmup.max_new_tokens=2",
]


@pytest.mark.parametrize("how", ["interrupt", "orphan_rounds"])
@pytest.mark.parametrize("case", list(EVAL_CASES))
def test_eval_resume_equals_a_whole_run(whole_runs, tmp_path, monkeypatch, case, how):
    whole = whole_runs(f"eval_{case}", evaluate.run, "eval", EVAL_CASES[case])
    assert len(lines(whole / "examples.jsonl")) == 5 * 5  # 5 tasks x (autoregressive, 3 drafters, ucb)
    resumed = resumed_run(evaluate.run, "eval", EVAL_CASES[case], tmp_path / "run", monkeypatch, how)
    assert_same_records(whole, resumed)
    assert_same_summary(whole, resumed, "summary.csv")


@pytest.mark.parametrize("how", ["interrupt", "orphan_rounds"])
def test_cascades_resume_equals_a_whole_run(whole_runs, tmp_path, monkeypatch, how):
    whole = whole_runs("cascades", cascades.run, "cascades", CASCADES)
    resumed = resumed_run(cascades.run, "cascades", CASCADES, tmp_path / "run", monkeypatch, how, n=9)
    assert_same_records(whole, resumed)
    assert_same_summary(whole, resumed, "curves.csv")


def test_bench_resume_equals_a_whole_run(whole_runs, tmp_path, monkeypatch):
    whole = whole_runs("bench", bench.run, "bench", BENCH)
    n = len(lines(whole / "bench.jsonl"))
    assert n >= 8
    resumed = resumed_run(
        bench.run,
        "bench",
        BENCH,
        tmp_path / "run",
        monkeypatch,
        "interrupt",
        owner=JsonlWriter,
        attr="write",
        n=n // 2,
    )
    assert_same_records(whole, resumed, files=("bench.jsonl",))
    assert_same_summary(whole, resumed, "bench.csv", keys=("method",))


SENTENCE = "A farmer has twelve cows and buys five more cows at the market. How many cows are there now?"


def test_train_drafter_resume_equals_a_whole_run(tmp_path, monkeypatch):
    toy = tmp_path / "toy.jsonl"
    toy.write_text(
        "".join(
            json.dumps({"question": f"Case {i}. {SENTENCE}", "answer": "#### 17"}) + "\n" for i in range(24)
        )
    )

    def overrides(out):
        return [
            "target=tiny_llama",
            "dataset=gsm8k",
            f"dataset.path={toy}",
            "dataset.limit=16",
            "train.responses=target",
            "train.max_new_tokens=8",
            "train.epochs=4",
            "train.lr=0.003",
            "train.val_examples=3",
            "drafter.vocab=120",
            f"out={out}",
            f"+eval_sets.toy={{format: gsm8k, task: math, path: {toy}, offset: 16, limit: 4}}",
            "~eval_sets.math",
            "~eval_sets.summarization",
            "~eval_sets.translation",
            "~eval_sets.chat",
            "~eval_sets.code",
        ]

    whole, parts = tmp_path / "whole", tmp_path / "parts"
    train_drafter.run(cfg_of("train_drafter", overrides(whole)), tmp_path / "r1")
    calls = interrupt_at(monkeypatch, fit, "atomic_path", 3)  # epoch 3's state.pt save (training/fit.py)
    with pytest.raises(KeyboardInterrupt):
        train_drafter.run(cfg_of("train_drafter", overrides(parts)), tmp_path / "r2")
    assert calls["n"] == 3
    monkeypatch.undo()
    assert torch.load(parts / "state.pt", weights_only=False)["epoch"] == 2
    train_drafter.run(cfg_of("train_drafter", overrides(parts)), tmp_path / "r2")
    a, b = load_file(str(whole / "model.safetensors")), load_file(str(parts / "model.safetensors"))
    assert a.keys() == b.keys()
    for k in a:
        torch.testing.assert_close(a[k], b[k], atol=0, rtol=0)
    untimed = lambda path: pd.read_csv(path).drop(columns=["seconds"])  # noqa: E731 - an epoch's wall time
    pd.testing.assert_frame_equal(untimed(whole / "history.csv"), untimed(parts / "history.csv"))
    unnamed = lambda d: {k: v for k, v in d.items() if k not in ("head", "seconds")}  # noqa: E731 - its name, wall times
    assert unnamed(json.loads((whole / "metrics.json").read_text())) == unnamed(
        json.loads((parts / "metrics.json").read_text())
    )
    assert unnamed(json.loads((whole / "config.json").read_text())["specbench"]) == unnamed(
        json.loads((parts / "config.json").read_text())["specbench"]
    )
