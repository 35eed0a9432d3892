"""Issue 13's fixes end to end on tiny in-process models: a Spec-Bench question.jsonl runs whole (every
category a chat query on its turns, both turns), templates are checked before anything is decoded, a
run that stops still writes its summary, eval writes Spec-Bench's answer format, and a policy refuses
to be evaluated on the queries it was trained on."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest
from hydra import compose, initialize_config_dir

from specbench.configs import conf_dir
from specbench.errors import SpecbenchError
from specbench.pipelines import collect, collected, evaluate, spec_bench, train_policy

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
SPEC_BENCH = FIXTURES / "spec_bench_question.jsonl"
TINY = ["target=tiny_llama", "pool=tiny", "decoding.max_new_tokens=5", "warmup.max_new_tokens=0"]


def cfg_of(name: str, overrides: list[str]):
    with initialize_config_dir(config_dir=conf_dir(), version_base=None):
        return compose(config_name=name, overrides=overrides)


def lines(path: Path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()]


def test_spec_bench_file_runs_whole_with_answer_files(tmp_path):
    """Every record of a Spec-Bench file (categories named translation, summarization, math included)
    is decoded on its turns, both turns of the two-turn questions, and the answer files carry the
    fields Spec-Bench's evaluation/speed.py reads, consistent with examples.jsonl and rounds.jsonl."""
    cfg = cfg_of(
        "eval",
        TINY
        + [
            "dataset=spec_bench",
            f"dataset.path={SPEC_BENCH}",
            "spec_bench_answers=true",
            "methods=[autoregressive,fixed:quantized,fixed:prompt_lookup]",
        ],
    )
    out = evaluate.run(cfg, tmp_path)
    examples = lines(out / "examples.jsonl")
    ar = [e for e in examples if e["method"] == "autoregressive"]
    questions = lines(SPEC_BENCH)
    assert len(ar) == sum(len(q["turns"]) for q in questions) == 9
    assert {e["task"] for e in ar} == {q["category"] for q in questions}
    summary = pd.read_csv(out / "summary.csv")
    assert {"translation", "summarization", "math", "writing", "all"} <= set(summary.task)

    files = sorted((out / "spec_bench").glob("*.jsonl"))
    assert [f.name for f in files] == [
        "tiny_llama-autoregressive.jsonl",
        "tiny_llama-fixed-prompt_lookup.jsonl",
        "tiny_llama-fixed-quantized.jsonl",
    ]
    rounds = lines(out / "rounds.jsonl")
    for f in files:
        answers = lines(f)
        method = answers[0]["model_id"].removeprefix("tiny_llama-")
        assert [a["question_id"] for a in answers] == [q["question_id"] for q in questions]
        assert [a["category"] for a in answers] == [q["category"] for q in questions]
        for a, q in zip(answers, questions):
            (choice,) = a["choices"]
            n = len(q["turns"])
            assert len(choice["turns"]) == len(choice["new_tokens"]) == len(choice["wall_time"]) == n
            mine = [
                e
                for e in examples
                if e["method"] == method and e["query_id"].split("/")[0] == f"q{q['question_id']}"
            ]
            assert choice["new_tokens"] == [e["new_tokens"] for e in sorted(mine, key=lambda e: e["turn"])]
            # speed.py's accepted length per step: tokens each target step emitted, every turn
            assert sum(choice["accept_lengths"]) == sum(choice["new_tokens"])
            assert len(choice["accept_lengths"]) == sum(
                1
                for r in rounds
                if r["method"] == method and r["query_id"].split("/")[0] == f"q{q['question_id']}"
            )
    baseline = lines(files[0])
    assert all(set(a["choices"][0]["accept_lengths"]) <= {1} for a in baseline)


def test_a_template_that_does_not_fit_stops_before_anything_is_decoded(tmp_path):
    """The chat query is the last of the embedded suite: a template it does not fit used to stop the run
    after three tasks had been decoded; now nothing is decoded and the error names the record."""
    cfg = cfg_of("eval", TINY + ["dataset.limit=1", "templates.instruct.chat='{document}'"])
    with pytest.raises(
        SpecbenchError,
        match=r"query .* \(task 'chat'\): the template for task 'chat' uses field "
        r"'document'.*nothing was decoded",
    ):
        evaluate.run(cfg, tmp_path)
    assert not (tmp_path / "examples.jsonl").exists()


def test_a_run_that_stops_on_an_error_writes_the_summary_of_what_it_finished(tmp_path, monkeypatch):
    cfg = cfg_of("eval", TINY + ["dataset.limit=1", "methods=[autoregressive,fixed:quantized]"])
    real = evaluate.Session.decode
    calls = {"n": 0}

    def failing(self, *args, **kwargs):
        calls["n"] += 1
        if calls["n"] == 6:  # the third query's second method (no warm-up: one decode per generation)
            raise RuntimeError("CUDA out of memory (simulated)")
        return real(self, *args, **kwargs)

    monkeypatch.setattr(evaluate.Session, "decode", failing)
    with pytest.raises(RuntimeError, match="simulated"):
        evaluate.run(cfg, tmp_path)
    summary = pd.read_csv(tmp_path / "summary.csv")
    done = lines(tmp_path / "examples.jsonl")
    assert len(done) == 5  # two queries x two methods, and the third query's first method
    assert set(summary.task) == {e["task"] for e in done} | {"all"}
    assert "stopped early" in (tmp_path / "summary.md").read_text()


def test_answers_group_turns_and_keep_non_numeric_ids():
    examples = [
        {
            "query_id": "q7/turn2",
            "method": "m",
            "turn": 2,
            "text": "b",
            "target_calls": 1,
            "new_tokens": 2,
            "seconds": 0.2,
            "task": "writing",
            "category": "writing",
        },
        {
            "query_id": "q7",
            "method": "m",
            "turn": 1,
            "text": "a",
            "target_calls": 2,
            "new_tokens": 3,
            "seconds": 0.3,
            "task": "writing",
            "category": "writing",
        },
        {
            "query_id": "xsum-4",
            "method": "m",
            "turn": 1,
            "text": "c",
            "target_calls": 1,
            "new_tokens": 1,
            "seconds": 0.1,
            "task": "summarization",
            "category": None,
        },
    ]
    rounds = [
        {"query_id": "q7", "method": "m", "emitted": 2},
        {"query_id": "q7", "method": "m", "emitted": 1},
        {"query_id": "q7/turn2", "method": "m", "emitted": 2},
        {"query_id": "xsum-4", "method": "m", "emitted": 1},
    ]
    (q7, x) = spec_bench.answers(examples, rounds, "tiny")["m"]
    assert q7["question_id"] == 7 and q7["choices"][0]["turns"] == ["a", "b"]
    assert q7["choices"][0]["accept_lengths"] == [2, 1, 2] and q7["choices"][0]["decoding_steps"] == [2, 1]
    assert x["question_id"] == "xsum-4" and x["category"] == "summarization"


def test_eval_refuses_a_policy_trained_on_its_queries(tmp_path):
    """huang_t5's leak: a policy collected on some queries is refused on an evaluation slice that
    contains any of them, and accepted on a disjoint one (dataset.offset past the collected rows)."""
    # without the quantized drafter, the one kind of the tiny pool that does not batch, so the same policy runs at
    # every batch size below
    base = TINY + ["pool=tiny_llama_hf", "~pool.drafters.quantized", "dataset.limit=2"]
    collect.run(cfg_of("collect", base + ["collect.max_new_tokens=5"]), tmp_path / "c")
    rows = collected.read_rows([tmp_path / "c"])
    assert all(len(r["fingerprint"]) == 16 for r in rows)
    train_policy.run(cfg_of("train_policy", [f"data={tmp_path / 'c'}", "train.epochs=2"]), tmp_path / "p")
    policy = [
        "selector=policy",
        f"policy.checkpoint={tmp_path / 'p' / 'policy.pt'}",
        "methods=[autoregressive,selector]",
    ]
    with pytest.raises(
        SpecbenchError, match=r"evaluation queries were collected to train the policy"
    ) as info:
        evaluate.run(cfg_of("eval", base + policy + ["dataset.offset=1"]), tmp_path / "overlap")
    assert "dataset.offset" in info.value.fix
    assert not (tmp_path / "overlap" / "examples.jsonl").exists()
    # issue 71: every check a method's selectors get runs at every batch size (it was skipped when batching)
    for batch in (2, 4):
        with pytest.raises(SpecbenchError, match=r"evaluation queries were collected to train the policy"):
            evaluate.run(
                cfg_of("eval", base + policy + [f"decoding.batch_size={batch}", "dataset.limit=4"]),
                tmp_path / f"overlap_b{batch}",
            )
        assert not (tmp_path / f"overlap_b{batch}" / "examples.jsonl").exists()
    out = evaluate.run(
        cfg_of("eval", base + policy + ["dataset.offset=2", "dataset.limit=1"]), tmp_path / "held_out"
    )
    assert "policy" in set(pd.read_csv(out / "summary.csv").method)


def test_a_stopped_cascades_run_writes_the_curves_of_what_it_finished(tmp_path, monkeypatch):
    from specbench.pipelines import cascades

    cfg = cfg_of(
        "cascades",
        [
            "target=tiny_llama",
            "pool=tiny_llama_hf",
            "drafter_arm=tiny_draft",
            "dataset.limit=1",
            "decoding.max_new_tokens=4",
            "warmup.max_new_tokens=0",
            "rules=[chow]",
            "alphas.chow=[0.5]",
        ],
    )
    real = cascades.Session.decode
    calls = {"n": 0}

    def failing(self, *args, **kwargs):
        calls["n"] += 1
        if calls["n"] == 6:
            raise KeyboardInterrupt
        return real(self, *args, **kwargs)

    monkeypatch.setattr(cascades.Session, "decode", failing)
    with pytest.raises(KeyboardInterrupt):
        cascades.run(cfg, tmp_path)
    assert "stopped early" in (tmp_path / "curves.md").read_text()
    assert len(pd.read_csv(tmp_path / "curves.csv")) >= 1
