"""Issue 14, "silent wrong results and data loss": the pure checks behind the refusals."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf
from transformers import LlamaConfig, T5Config

from specbench.decoding.loop import Limits
from specbench.errors import SpecbenchError
from specbench.pipelines.bench import hf_unsupported
from specbench.pipelines.collected import missing_shards
from specbench.pipelines.session.prompting import CONTEXT_KEYS, Context
from specbench.pipelines.session.run_dir import RunFiles, claim_run_dir, compared_settings, differences
from specbench.pipelines.train_policy import check_held_out
from specbench.records import read_jsonl
from specbench.tasks.datasets import load_source
from specbench.training.reinforce import held_out

# ------------------------------------------------------------------ 1. which settings a rerun must match


def test_settings_leave_out_what_changes_no_result():
    cfg = OmegaConf.create(
        {
            "threads": 4,
            "warmup": {"max_new_tokens": 8},
            "run_name": "eval",
            "overwrite": False,
            "collect": {"shard": 1, "num_shards": 2, "overwrite": True, "alignment": "rougeL"},
            "decoding": {"max_new_tokens": 16},
            "seed": 0,
        }
    )
    assert compared_settings(cfg) == {
        "collect": {"alignment": "rougeL"},
        "decoding": {"max_new_tokens": 16},
        "seed": 0,
    }


def test_differences_name_each_setting_with_both_values():
    old = {"target": {"model": "a", "dtype": "float32"}, "methods": ["x"], "pool": {"drafters": {}}}
    new = {
        "target": {"model": "b", "dtype": "float32"},
        "methods": ["x", "y"],
        "pool": {"drafters": {"q": {"_target_": "t"}}},
    }
    assert differences(old, new) == [
        'target.model: "a" -> "b"',
        'methods: ["x"] -> ["x", "y"]',
        'pool.drafters.q: (unset) -> {"_target_": "t"}',
    ]
    many = differences({f"k{i}": 0 for i in range(12)}, {f"k{i}": 1 for i in range(12)}, limit=10)
    assert len(many) == 11 and many[-1] == "and 2 more: k10, k11"


def test_claim_run_dir(tmp_path):
    files = RunFiles(results=("examples.jsonl",))
    old = OmegaConf.create({"decoding": {"max_new_tokens": 4}, "threads": 1, "overwrite": False})
    OmegaConf.save(old, tmp_path / "config.yaml")
    claim_run_dir(
        tmp_path, OmegaConf.create({**old, "decoding": {"max_new_tokens": 8}}), files
    )  # no records yet
    (tmp_path / "examples.jsonl").write_text("{}\n")
    claim_run_dir(tmp_path, OmegaConf.create({**old, "threads": 2}), files)  # threads: not compared
    new = OmegaConf.create({**old, "decoding": {"max_new_tokens": 8}})
    with pytest.raises(SpecbenchError, match="decoding.max_new_tokens: 4 -> 8") as info:
        claim_run_dir(tmp_path, new, files)
    assert "overwrite=true" in info.value.fix and (tmp_path / "examples.jsonl").exists()
    new.overwrite = True
    claim_run_dir(tmp_path, new, files)
    assert not (tmp_path / "examples.jsonl").exists()


# ------------------------------------------------------------------ 3. shards left out of a merge


def test_missing_shards(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "rows-00000-of-00003.jsonl").write_text("")
    (tmp_path / "b").mkdir()
    (tmp_path / "b" / "rows-00002-of-00003.jsonl").write_text("")
    assert missing_shards([tmp_path / "a", tmp_path / "b"]) == ["rows-00001-of-00003.jsonl"]
    assert missing_shards([tmp_path / "a"]) == ["rows-00001-of-00003.jsonl", "rows-00002-of-00003.jsonl"]


# ------------------------------------------------------------------ 4. the context a prompt must fit in


def test_context_comes_from_the_configured_model_config_fields():
    llama = LlamaConfig(max_position_embeddings=2048)
    assert (
        Context.of(llama, CONTEXT_KEYS).limit == 2048
        and Context.of(llama, CONTEXT_KEYS).key == "max_position_embeddings"
    )
    t5 = T5Config()  # carries a legacy n_positions, but relative positions have no hard limit
    assert Context.of(t5, []).limit is None  # conf/target/tiny_t5.yaml: context_keys: []
    Context.of(t5, []).check("q", 10**6, 100, encoder_decoder=True)


def test_context_check():
    ctx = Context(2048, "max_position_embeddings", "m")
    ctx.check("q1", 2032, 16)  # exactly fits
    with pytest.raises(
        SpecbenchError, match=r"query q1: its prompt has 2,033 tokens.* 2,049 positions.*2,048 of m"
    ) as info:
        ctx.check("q1", 2033, 16)
    assert "dataset.max_input_tokens" in info.value.fix and "2,032" in info.value.fix
    ctx.check(
        "q2", 2048, 16, encoder_decoder=True
    )  # the encoder reads the prompt, the decoder the new tokens
    with pytest.raises(SpecbenchError, match="query q2"):
        ctx.check("q2", 2049, 16, encoder_decoder=True)


# ------------------------------------------------------------------ 5. duplicate ids in a data file


def test_duplicate_ids_are_refused_with_their_lines(tmp_path):
    path = tmp_path / "dup.jsonl"
    path.write_text(
        '{"id": "42", "document": "a", "summary": "b"}\n{"id": "7", "document": "c", "summary": "d"}\n'
        '\n{"id": "42", "document": "e", "summary": "f"}\n'
    )
    with pytest.raises(SpecbenchError, match=rf"id '42' at {path}:1, {path}:4"):
        load_source("xsum", {"format": "xsum", "path": str(path)})
    path.write_text(
        '{"id": "42", "document": "a", "summary": "b"}\n{"id": "7", "document": "c", "summary": "d"}\n'
    )
    assert [q.id for q in load_source("xsum", {"format": "xsum", "path": str(path)})] == ["42", "7"]


# ------------------------------------------------------------------ 6. draft length


@pytest.mark.parametrize("value, shown", [(2.9, "2.9"), (2.0, "2.0"), ("3", "3"), (True, "true")])
def test_draft_length_must_be_a_whole_number(value, shown):
    """Limits checks itself with the rule its field declares (the config's decoding.draft_length reads the same)."""
    with pytest.raises(
        SpecbenchError, match=rf"decoding.draft_length={shown}: expected an integer >= 1"
    ) as info:
        Limits(draft_length=value)
    assert "decoding.draft_length=<an integer >= 1>" in info.value.fix
    with pytest.raises(SpecbenchError, match=r"decoding.max_new_tokens=16.5: expected an integer >= 1"):
        Limits(max_new_tokens=16.5)


# ------------------------------------------------------------------ 7. extra EOS ids


def test_extra_eos_ids_must_be_in_the_vocabulary(tiny_llama_target):
    from specbench.pipelines.session.prompting import eos_ids_of

    loaded, vocab = tiny_llama_target.loaded, tiny_llama_target.vocab_size
    assert 5 in eos_ids_of(loaded, [5], vocab)
    for bad in (vocab, 99999, -1, 2.5):
        with pytest.raises(SpecbenchError, match=rf"{bad!r} is not a token id") as info:
            eos_ids_of(loaded, [bad], vocab)
        assert "extra_eos_ids" in info.value.fix
    with pytest.raises(SpecbenchError, match=f"vocabulary has {vocab} tokens"):
        eos_ids_of(loaded, [vocab], vocab)


# ------------------------------------------------------------------ 8. a held-out set for policy training


def test_held_out_rows():
    assert [held_out(n, 0.2) for n in (1, 2, 7, 8)] == [0, 1, 1, 2]
    check_held_out(8, 0.2)
    with pytest.raises(SpecbenchError, match="1 collected row.* leave 0 for validation") as info:
        check_held_out(1, 0.2)
    assert "collect at least 8 queries" in info.value.fix
    with pytest.raises(SpecbenchError) as info:
        check_held_out(100, 0.0)
    assert "train.val_fraction > 0" in info.value.fix


# ------------------------------------------------------------------ 9. HF failures in bench


def test_only_hf_argument_refusals_count_as_unsupported():
    assert hf_unsupported(ValueError("assisted generation is not supported with stateful models"))
    assert hf_unsupported(NotImplementedError("no"))
    assert not hf_unsupported(torch.OutOfMemoryError("CUDA out of memory"))
    assert not hf_unsupported(RuntimeError("shape mismatch"))
    assert not hf_unsupported(IndexError("index out of range"))


# ------------------------------------------------------------------ 10. JSONL records


def write(path: Path, data: bytes) -> Path:
    path.write_bytes(data)
    return path


def test_a_torn_last_line_is_skipped_with_a_warning(tmp_path, caplog):
    path = write(tmp_path / "r.jsonl", b'{"a": 1}\n{"a": 2}\n{"a": 3, "b": "x')
    with caplog.at_level(logging.WARNING):
        assert list(read_jsonl(path)) == [{"a": 1}, {"a": 2}]
    assert "r.jsonl:3: skipping a torn last line" in caplog.text
    # torn inside a multi-byte character (the writer keeps non-ASCII text as is)
    torn = '{"a": 1}\n{"t": "\u00e9t\u00e9"}'.encode()[:-3]
    assert list(read_jsonl(write(tmp_path / "u.jsonl", torn))) == [{"a": 1}]


@pytest.mark.parametrize(
    "data, lineno",
    [
        (b'{"a": 1}\n{"a": \n{"a": 3}\n', 2),  # a malformed line in the middle
        (b'{"a": 1}\n{"a": 2}\n{"a": \n', 3),  # a malformed last line that has its newline: not torn
        (b'{"a": 1}\n\xff\xfe\n{"a": 3}\n', 2),  # not UTF-8
        (b'{"a": 1}\n[1, 2]\n', 2),  # not an object
    ],
)
def test_a_malformed_line_that_is_not_a_torn_tail_is_corruption(tmp_path, data, lineno):
    path = write(tmp_path / "r.jsonl", data)
    with pytest.raises(
        SpecbenchError, match=rf"r.jsonl:{lineno}: (line {lineno} is not a JSON|not UTF-8)"
    ) as info:
        list(read_jsonl(path))
    assert f"line {lineno} of {path}" in info.value.fix


def test_a_key_added_later_at_its_old_value_resumes_an_older_run():
    """decoding.batch_size came after runs were made: a run directory without it resumes under batch size 1 (what
    its absence meant) and is refused under any other, naming the key."""
    old = compared_settings({"decoding": {"max_new_tokens": 8}})
    assert not differences(old, compared_settings({"decoding": {"max_new_tokens": 8, "batch_size": 1}}))
    assert differences(old, compared_settings({"decoding": {"max_new_tokens": 8, "batch_size": 4}})) == [
        "decoding.batch_size: (unset) -> 4"
    ]
