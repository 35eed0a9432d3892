"""``conversation_length``: consecutive queries become the turns of one chat, so the task changes inside a
conversation (MetaSD's non-stationary setting): each later query is prompted after the earlier ones and
the model's own answers, and decoding stays lossless."""

from __future__ import annotations

import json

import torch
from hydra import compose, initialize_config_dir

from specbench.configs import conf_dir
from specbench.pipelines import evaluate
from specbench.pipelines.session.core import Session

TINY = [
    "target=tiny_llama",
    "pool=tiny",
    "dataset.limit=1",
    "decoding.max_new_tokens=5",
    "warmup.max_new_tokens=0",
    "methods=[autoregressive,fixed:early_exit_1]",
]


def config(*overrides):
    with initialize_config_dir(config_dir=conf_dir(), version_base=None):
        return compose(config_name="eval", overrides=[*TINY, *overrides])


def test_a_conversation_carries_each_answer_into_the_next_task(tmp_path):
    cfg = config("conversation_length=4", "~dataset.sources.code")  # translation, summarization, math, chat
    evaluate.run(cfg, tmp_path / "run")
    examples = [json.loads(x) for x in (tmp_path / "run" / "examples.jsonl").read_text().splitlines()]
    out = {(e["query_id"], e["method"]): e["output_ids"] for e in examples}
    s = Session.open(cfg, tmp_path / "probe")
    assert len({q.task for q in s.queries}) == 4  # the task changes at every turn of the conversation
    history, prompts = [], []
    for q in s.queries:
        assert (
            out[(q.id, "autoregressive")] == out[(q.id, "fixed:early_exit_1")]
        )  # lossless inside a conversation
        prompt = s.prompter(q, 0, history)
        prompts.append(prompt)
        with (
            torch.no_grad()
        ):  # Hugging Face's greedy decoding of the conversation so far gives the same answer
            ref = s.loaded.model.generate(torch.tensor([prompt]), max_new_tokens=5, do_sample=False)[
                0, len(prompt) :
            ].tolist()
        ours = out[(q.id, "autoregressive")]
        assert ours == ref[: len(ours)], q.id
        history.append((s.prompter.user_text(q, 0), s.text(ours)))
    # each later prompt holds the whole conversation before it
    assert all(len(b) > len(a) for a, b in zip(prompts, prompts[1:]))
    assert prompts[1] != s.prompter(s.queries[1])


def test_a_conversations_records_and_answer_files_say_what_it_is(tmp_path):
    """Issue 45 case 8: each record names its conversation and its turn in it, and the Spec-Bench answer file keeps
    the conversation as one multi-turn answer (its turns in order) instead of stand-alone one-turn answers."""
    from specbench.pipelines.spec_bench import answers

    cfg = config("conversation_length=3", "~dataset.sources.code", "~dataset.sources.chat")
    evaluate.run(cfg, tmp_path / "run")
    examples = [json.loads(x) for x in (tmp_path / "run" / "examples.jsonl").read_text().splitlines()]
    rounds = [json.loads(x) for x in (tmp_path / "run" / "rounds.jsonl").read_text().splitlines()]
    ar = [e for e in examples if e["method"] == "autoregressive"]
    assert len(ar) == 3 and len({e["conversation"] for e in ar}) == 1
    assert sorted(e["conversation_turn"] for e in ar) == [1, 2, 3]
    lines = answers(examples, rounds, "tiny")["autoregressive"]
    assert len(lines) == 1
    by_turn = sorted(ar, key=lambda e: e["conversation_turn"])
    assert lines[0]["choices"][0]["turns"] == [e["text"] for e in by_turn]
