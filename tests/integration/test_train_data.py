"""train-drafter's data at scale, on the tiny Llama: the shared cache of the target's answers, prompt
positions, the training precision, and per-source row selection (the generalist's mix)."""

from __future__ import annotations

import json

import pytest
import torch
from hydra import compose, initialize_config_dir

from specbench.configs import conf_dir
from specbench.errors import SpecbenchError
from specbench.pipelines import train_drafter
from specbench.pipelines.session.prompting import eos_ids_of
from specbench.records import read_jsonl
from specbench.tasks import Prompter, load_dataset_config
from specbench.training import recipe as drafter_training
from specbench.training import responses
from specbench.training.distill import Example, Teacher, pairs, shared_prefix, teach, teach_all

QUESTION = "Case {i}. A farmer has {i} cows and buys five more. How many cows are there now?"


@pytest.fixture(scope="module")
def rows(tmp_path_factory):
    path = tmp_path_factory.mktemp("rows") / "rows.jsonl"
    path.write_text(
        "".join(json.dumps({"question": QUESTION.format(i=i), "answer": "#### 5"}) + "\n" for i in range(12))
    )
    return path


def config(*overrides):
    with initialize_config_dir(config_dir=conf_dir(), version_base=None):
        return compose(config_name="train_drafter", overrides=["target=tiny_llama", *overrides])


def prompter_of(cfg, target):
    return Prompter(
        target.tokenizer,
        cfg.target.prompt.style,
        cfg.templates[cfg.target.prompt.templates],
        cfg.target.prompt.get("system"),
        [],
        cfg.target.prompt.get("chat_template"),
    )


def test_answers_are_cached_by_prompt_and_a_longer_answer_serves_a_shorter_request(
    tiny_llama_target, rows, tmp_path, monkeypatch
):
    target = tiny_llama_target
    cfg = config("dataset=gsm8k", f"dataset.path={rows}")
    prompter, eos = prompter_of(cfg, target), eos_ids_of(target.loaded)
    queries = load_dataset_config(cfg.dataset)
    cache = tmp_path / "answers.jsonl"
    calls = []
    generate = target.model.generate
    monkeypatch.setattr(
        target.model, "generate", lambda **kw: calls.append(kw["input_ids"].shape[0]) or generate(**kw)
    )
    long = responses.target_responses(target, prompter, queries[:8], cache, 12, eos, batch_size=3)
    assert sum(calls) == 8 and len(list(read_jsonl(cache))) == 8
    calls.clear()
    short = responses.target_responses(target, prompter, queries, cache, 6, eos, batch_size=4)
    assert (
        sum(calls) == 4
    )  # only the 4 new prompts are generated; the 8 cached answers serve 6-token requests
    for q in queries[:8]:
        assert short[q.id] == long[q.id][:6]
    # the served prefix is what a direct 6-token greedy generation gives (fp32: batch-independent)
    fresh = responses.target_responses(
        target, prompter, queries[:8], tmp_path / "fresh.jsonl", 6, eos, batch_size=8
    )
    assert all(fresh[q.id] == short[q.id] for q in queries[:8])


def test_a_cached_answer_that_ended_early_serves_any_length():
    finished = {"ids": [5, 6, 2], "max_new": 12}  # ended with EOS before its 12-token limit
    cut = {"ids": list(range(12)), "max_new": 12}
    assert responses.cached_answer(finished, 64) == [5, 6, 2]
    assert responses.cached_answer(cut, 64) is None and responses.cached_answer(cut, 4) == [0, 1, 2, 3]


def test_prompt_positions_learn_past_the_shared_opening_and_held_out_scores_stay_on_responses():
    assert shared_prefix([[1, 2, 3, 9], [1, 2, 4], [1, 2, 3]]) == 2 and shared_prefix([[7]]) == 1
    ex = Example(ids=[1, 2, 3, 4, 5, 6, 7, 8], start=5, learn=3)
    t = Teacher(
        features=torch.zeros(8, 4), top_ids=torch.zeros(8, 2, dtype=torch.long), top_p=torch.zeros(8, 2)
    )
    learned = pairs(ex, t)["mask"]
    scored = pairs(ex, t, response_only=True)["mask"]
    # pair i predicts token i+2: learned from token 3 on, scored from the first response token (5) on
    assert learned.nonzero().flatten().tolist() == [1, 2, 3, 4, 5, 6]
    assert scored.nonzero().flatten().tolist() == [3, 4, 5, 6]
    assert pairs(Example(ids=ex.ids, start=5), t)["mask"].tolist() == scored.tolist()


def test_examples_learn_from_the_prompts_first_differing_token(tiny_llama_target, rows):
    target = tiny_llama_target
    cfg = config("dataset=gsm8k", f"dataset.path={rows}")
    prompter = prompter_of(cfg, target)
    queries = load_dataset_config(cfg.dataset)[:4]
    answers = {q.id: [5, 6, 7] for q in queries}
    plain = drafter_training.examples_of(queries, prompter, target.tokenizer, answers, 512)
    wide = drafter_training.examples_of(
        queries, prompter, target.tokenizer, answers, 512, prompt_positions=True
    )
    prompts = [prompter(q) for q in queries]
    fixed = shared_prefix(prompts)
    assert 0 < fixed < min(len(p) for p in prompts)
    assert all(e.learn is None for e in plain) and all(e.learn == fixed + 1 for e in wide)
    assert drafter_training.learned_tokens(wide) == drafter_training.learned_tokens(plain) + sum(
        len(p) - fixed - 1 for p in prompts
    )


def test_the_batched_teacher_pass_gives_each_sequence_what_its_own_forward_gives(tiny_llama_target):
    model = tiny_llama_target.model  # fp32: batch-independent up to float noise
    gen = torch.Generator().manual_seed(3)
    lengths = [9, 3, 17, 5, 5, 12, 1, 30]
    exs = [Example(ids=torch.randint(4, 200, (n,), generator=gen).tolist(), start=1) for n in lengths]
    together = teach_all(model, exs, top_k=5, max_tokens=40)  # several batches, right padding in each
    assert [t.features.shape[0] for t in together] == lengths
    for ex, t in zip(exs, together):
        alone = teach(model, ex, top_k=5)
        assert torch.allclose(t.features, alone.features, atol=1e-5)
        assert torch.equal(t.top_ids, alone.top_ids) and torch.allclose(t.top_p, alone.top_p, atol=1e-6)


def test_training_precision_follows_the_teacher_and_refuses_unknown_values():
    assert train_drafter.training_precision(config("target.dtype=float32")) == "float32"
    assert train_drafter.training_precision(config("target.dtype=bfloat16")) == "bfloat16"
    assert (
        train_drafter.training_precision(config("target.dtype=bfloat16", "train.precision=float32"))
        == "float32"
    )
    sig = train_drafter.signature(config("target.dtype=bfloat16"))
    assert (
        sig["train"]["precision"] == "bfloat16"
    )  # resolved: a resume on another machine compares what it trains in
    with pytest.raises(SpecbenchError) as info:
        train_drafter.training_precision(config("train.precision=fp8"))
    assert "train.precision" in info.value.problem and "auto" in info.value.fix


def test_sources_select_their_own_rows(rows):
    cfg = config("dataset=specialist_mix")
    mix = dict(cfg.dataset)
    mix["sources"] = {
        "a": {"format": "gsm8k", "task": "math", "path": str(rows), "limit": 3},
        "b": {"format": "gsm8k", "task": "math", "path": str(rows), "offset": 10},
        "c": {"format": "gsm8k", "task": "math", "path": str(rows), "shuffle": True, "limit": 2, "offset": 1},
    }
    mix["limit"], mix["interleave"] = 5, False
    got = [q.id.split("/")[-1] for q in load_dataset_config(mix)]
    whole = [
        q.id for q in load_dataset_config({**mix, "sources": {"a": {**mix["sources"]["a"], "limit": None}}})
    ]
    shuffled = [
        q.id
        for q in load_dataset_config(
            {
                **mix,
                "shuffle": True,
                "limit": 3,
                "sources": {"a": {k: v for k, v in mix["sources"]["a"].items() if k != "limit"}},
            }
        )
    ]
    assert got[:3] == whole[:3]  # a: its own limit
    assert got[3:5] == whole[10:12]  # b: its own offset, the dataset's limit (5) past the end
    assert got[5:] == shuffled[1:3]  # c: the seeded shuffle, then its own offset and limit
