"""Bad input below the command line (issue 14): typed validation of composed configs, unreadable
files, damaged model directories, a drafter too small for the target's vocabulary, and
``dataset.categories`` over sources with and without categories. No model is downloaded."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest
from hydra import compose, initialize_config_dir

from specbench.configs import conf_dir, group_options
from specbench.drafters import hf
from specbench.errors import SpecbenchError
from specbench.models import load_model
from specbench.pipelines.keys import check as validate
from specbench.pipelines.session.run_records import Records
from specbench.records import read_jsonl
from specbench.tasks.datasets import load_dataset_config
from specbench.tasks.files import read_records

ROOTS = ["eval", "bench", "cascades", "collect", "profile", "train_policy", "train_drafter", "trace"]
EXPERIMENTS = sorted(p.stem for p in (Path(conf_dir()) / "experiment").glob("*.yaml"))


def composed(name: str, *overrides: str):
    with initialize_config_dir(config_dir=conf_dir(), version_base=None):
        return compose(config_name=name, overrides=list(overrides))


# -- typed validation -------------------------------------------------------------------------


@pytest.mark.parametrize("root", ROOTS)
def test_every_root_config_passes_validation_as_shipped(root):
    validate(composed(root), root)


@pytest.mark.parametrize("group", ["target", "pool", "dataset", "decoding", "selector", "cascade"])
def test_every_group_option_passes_validation(group):
    """No false alarms: each option of each group, composed into eval, validates (except the values a
    user must supply, ``???``, which are named)."""
    for option in group_options(group):
        cfg = composed("eval", f"{group}={option}")
        try:
            validate(cfg)
        except SpecbenchError as exc:
            assert "is not set (the config leaves it as ???)" in exc.problem, (option, exc.problem)
            assert "expected" not in exc.problem, (option, exc.problem)


@pytest.mark.parametrize("name", EXPERIMENTS)
def test_every_experiment_passes_validation(name):
    command = "cascades" if name.startswith("cascades") else "eval"
    try:
        validate(composed(command, f"experiment={name}"), command)
    except SpecbenchError as exc:  # paper-scale experiments leave a model to the user
        assert "expected" not in exc.problem and "???" in exc.problem, (name, exc.problem)


@pytest.mark.parametrize(
    "root, override, line",
    [
        ("eval", "decoding.draft_length=abc", "decoding.draft_length=abc: expected an integer >= 1"),
        ("eval", "decoding.draft_length=2.9", "decoding.draft_length=2.9: expected an integer >= 1"),
        ("eval", "decoding.temperature=abc", "decoding.temperature=abc: expected a finite number >= 0"),
        ("eval", "decoding.temperature=nan", "decoding.temperature=nan: expected a finite number >= 0"),
        ("eval", "decoding.temperature=-1", "decoding.temperature=-1: expected a finite number >= 0"),
        ("eval", "dataset.limit=abc", "dataset.limit=abc: expected an integer >= 1 or null"),
        ("eval", "threads=-1", "threads=-1: expected an integer >= 1 or null"),
        ("eval", "seed=abc", "seed=abc: expected an integer >= 0"),
        (
            "eval",
            "decoding.extra_eos_ids=[a]",
            "decoding.extra_eos_ids=['a']: expected a list, each an integer >= 0",
        ),
        ("eval", "timing.phases=maybe", "timing.phases=maybe: expected true or false"),
        (
            "eval",
            "methods=autoregressive",
            "methods=autoregressive: expected a list, each a non-empty string",
        ),
        ("eval", "dataset=spec_bench", "dataset.path is not set (the config leaves it as ???)"),
        ("cascades", "alphas.chow=[0.1,x]", "alphas.chow=[0.1, 'x']: expected a list, each a finite number"),
        ("collect", "collect.num_shards=0", "collect.num_shards=0: expected an integer >= 1"),
        ("bench", "warmup.max_new_tokens=-2", "warmup.max_new_tokens=-2: expected an integer >= 0"),
        ("train_policy", "train.epochs=abc", "train.epochs=abc: expected an integer >= 1"),
        (
            "train_drafter",
            "train.epochs=-1",
            "train.epochs=-1: expected an integer >= 0",
        ),  # 0: measure as it starts
        ("train_policy", "reward.alpha=2", "reward.alpha=2: expected a finite number in [0, 1]"),
        ("train_drafter", "drafter.layers=0", "drafter.layers=0: expected an integer >= 1"),
        ("trace", "trace.draft_length=0", "trace.draft_length=0: expected an integer >= 1 or null"),
        (
            "trace",
            "trace.costs.contexts=[]",
            "trace.costs.contexts=[]: expected a non-empty list, each an integer >= 1",
        ),
        ("replay", "seeds=0", "seeds=0: expected an integer >= 1"),
        ("replay", "replay.draft_length=x", "replay.draft_length=x: expected an integer >= 1 or null"),
        # issue 34: a tolerance that is not a number was a traceback; a negative one made every bf16 tie a "defect", a huge
        # one would call real defects ties
        (
            "eval",
            "target.tie_tolerance=abc",
            "target.tie_tolerance=abc: expected a mapping of dtype to tolerance or null",
        ),
        (
            "eval",
            "target.tie_tolerance.bfloat16=abc",
            "target.tie_tolerance.bfloat16=abc: expected a finite number in (0, 8.0]",
        ),
        (
            "eval",
            "target.tie_tolerance.bfloat16=-1",
            "target.tie_tolerance.bfloat16=-1: expected a finite number in (0, 8.0]",
        ),
        (
            "eval",
            "target.tie_tolerance.float32=1e6",
            "target.tie_tolerance.float32=1000000.0: expected a finite number in (0, 8.0]",
        ),
    ],
)
def test_bad_values_name_key_value_and_expectation(root, override, line):
    with pytest.raises(SpecbenchError) as info:
        validate(composed(root, override), root)
    assert line in info.value.problem
    key = line.split("=")[0].split(" ")[0]
    assert info.value.fix.startswith("set ") and f"{key}=<" in info.value.fix


def test_every_bad_value_is_listed_at_once():
    with pytest.raises(SpecbenchError) as info:
        validate(composed("eval", "seed=abc", "threads=0", "decoding.top_p=2"))
    problem = info.value.problem
    assert (
        "seed=abc" in problem
        and "threads=0" in problem
        and "decoding.top_p=2: expected a finite number in (0, 1]" in problem
    )


# -- unreadable files -------------------------------------------------------------------------


def test_non_utf8_data_file_names_file_line_and_byte(tmp_path):
    path = tmp_path / "latin1.jsonl"
    path.write_bytes(b'{"question": "a", "answer": "#### 1"}\n{"question": "caf\xe9", "answer": "#### 2"}\n')
    with pytest.raises(SpecbenchError, match=r"latin1.jsonl:2: not UTF-8 text \(byte 0xe9") as info:
        list(read_records(path))
    assert "UTF-8" in info.value.fix


@pytest.mark.parametrize("damage", ["garbage", "truncated"])
def test_damaged_parquet_is_named(tmp_path, damage):
    path = tmp_path / "data.parquet"
    if damage == "garbage":
        path.write_bytes(b"PAR1 this is not parquet at all PAR1")
    else:
        pd.DataFrame({"question": ["q"] * 50, "answer": ["#### 1"] * 50}).to_parquet(path)
        path.write_bytes(path.read_bytes()[:-40])
    with pytest.raises(SpecbenchError, match="not a readable Parquet file") as info:
        list(read_records(path))
    assert str(path) in info.value.problem and info.value.fix


def test_non_utf8_line_of_examples_is_named_but_a_torn_last_line_is_skipped(tmp_path):
    path = tmp_path / "examples.jsonl"
    good = json.dumps({"query_id": "a", "method": "m", "text": "é"}, ensure_ascii=False).encode()
    path.write_bytes(good + b"\n" + good[:-4])  # killed inside the 2-byte character: torn, skipped
    assert [r["query_id"] for r in read_jsonl(path)] == ["a"]
    path.write_bytes(good + b"\n" + b'{"query_id": "b\xff"}\n' + good + b"\n")
    with pytest.raises(SpecbenchError, match=r"examples.jsonl:2: not UTF-8 text"):
        list(read_jsonl(path))


def test_examples_line_without_method_is_named(tmp_path):
    rec = {
        "query_id": "a",
        "task": "math",
        "method": "autoregressive",
        "output_ids": [1],
        "text": "x",
        "new_tokens": 1,
        "seconds": 0.1,
        "target_calls": 1,
        "rounds": 1,
        "drafted": 0,
        "accepted": 0,
        "switches": 0,
        "t_switch": 0.0,
        "stop": "eos",
    }
    broken = {k: v for k, v in rec.items() if k != "method"}
    (tmp_path / "examples.jsonl").write_text(json.dumps(rec) + "\n" + json.dumps(broken) + "\n")
    with pytest.raises(SpecbenchError, match=r"examples.jsonl: record 2 has no method") as info:
        Records(tmp_path)
    assert "repair or delete line" in info.value.fix


# -- models -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "content, words", [({}, "it is empty"), ({"notes.txt": "hi"}, "it holds: notes.txt")]
)
def test_directory_without_a_model_is_named(tmp_path, content, words):
    for name, text in content.items():
        (tmp_path / name).write_text(text)
    with pytest.raises(SpecbenchError, match="is not a model directory: it has no config.json") as info:
        load_model(str(tmp_path), device="cpu")
    assert words in info.value.problem and "save_pretrained" in info.value.fix


def test_directory_with_a_broken_config_is_named(tmp_path):
    (tmp_path / "config.json").write_text('{"hidden_size": 4}')  # no model_type
    with pytest.raises(SpecbenchError, match="could not load the model"):
        load_model(str(tmp_path), device="cpu")


@pytest.mark.parametrize("damage", ["truncated weights", "empty weights", "broken config"])
def test_truncated_embedded_model_cache_says_which_directory_to_delete(tmp_path, monkeypatch, damage):
    cached = tmp_path / "smollm2-135m-instruct"  # the conversion cache of embedded:smollm2_135m
    tiny = load_model("embedded:tiny_llama", device="cpu")
    tiny.model.save_pretrained(cached)
    tiny.tokenizer.save_pretrained(cached)
    weights = cached / "model.safetensors"
    if damage == "truncated weights":
        weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    elif damage == "empty weights":
        weights.write_bytes(b"")
    else:
        (cached / "config.json").write_text('{"model_type": "llama", "hidden')
    monkeypatch.setenv("SPECBENCH_CACHE", str(tmp_path))
    with pytest.raises(SpecbenchError, match="damaged or incomplete") as info:
        load_model("embedded:smollm2_135m", device="cpu")
    assert str(cached) in info.value.problem
    assert f"rm -r {cached}" in info.value.fix


def test_drafter_with_fewer_embedding_rows_than_the_vocabulary_is_refused(tiny_llama_target, tmp_path):
    draft = load_model("embedded:tiny_llama_draft", device="cpu")
    draft.model.resize_token_embeddings(200)
    draft.model.save_pretrained(tmp_path)
    tiny_llama_target.tokenizer.save_pretrained(tmp_path)  # the same tokenizer: the vocabulary check passes
    with pytest.raises(
        SpecbenchError, match="drafter 'small' has 200 embedding rows, fewer than the 259 tokens"
    ) as info:
        hf.build(tiny_llama_target, "small", model=str(tmp_path))
    assert "token ids 200..258" in info.value.problem and info.value.fix


# -- dataset.categories -----------------------------------------------------------------------


def test_categories_filter_the_sources_that_have_them(tmp_path):
    cfg = composed("eval", "dataset.limit=null", "dataset.categories=[writing]").dataset
    queries = load_dataset_config(cfg)
    by_task = {}
    for q in queries:
        by_task.setdefault(q.task, []).append(q)
    assert set(by_task) == {"translation", "summarization", "math", "chat", "code"}
    assert by_task["chat"] and {q.category for q in by_task["chat"]} == {"writing"}
    assert len(by_task["math"]) == 8  # a source without categories is kept whole
    with pytest.raises(SpecbenchError, match=r"dataset.categories: unknown categories \['poetry'\]") as info:
        load_dataset_config(composed("eval", "dataset.categories=[poetry]").dataset)
    assert "writing" in info.value.fix


def test_categories_on_a_source_without_any_are_still_refused(tmp_path):
    g = tmp_path / "g.jsonl"
    g.write_text(json.dumps({"question": "1+1?", "answer": "#### 2"}) + "\n")
    with pytest.raises(SpecbenchError, match="no source has categories"):
        load_dataset_config(
            composed("eval", "dataset=gsm8k", f"dataset.path={g}", "dataset.categories=[math]").dataset
        )
