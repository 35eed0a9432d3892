"""Edge inputs through the command line (issue 22, defects 13 and 14): each gives one ``error:`` and one
``fix:`` line and exit code 2, no traceback, and (where it is bad input of the config or the data) stops
before any model loads. The CLI runs in process, as in ``test_errors_cli.py``, on the tiny models."""

from __future__ import annotations

import errno
import json
import os

import pytest

from specbench.models import store
from specbench.pipelines import collected
from tests.integration.test_errors_cli import TINY, assert_clear_error, no_model_loads, run  # noqa: F401

TINY_T5 = [
    "target=tiny_t5",
    "pool=tiny_t5_hf",
    "dataset.limit=1",
    "decoding.max_new_tokens=4",
    "warmup.max_new_tokens=0",
]


def test_a_temperature_too_small_for_float32(tmp_path, no_model_loads):
    code, err, _ = run("eval", *TINY, "decoding.temperature=1e-40", f"hydra.run.dir={tmp_path / 'run'}")
    assert_clear_error(
        code,
        err,
        "error: decoding.temperature=1e-40: expected a finite number >= 0: 0 (greedy) or at least 1e-06",
        "fix:   set decoding.temperature=<",
    )
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("tiny", [TINY, TINY_T5], ids=["llama", "t5"])
@pytest.mark.parametrize("question", ["", "   "])
def test_an_empty_question(tmp_path, no_model_loads, tiny, question):
    data = tmp_path / "q.jsonl"
    data.write_text(
        json.dumps({"question": "2+2?", "answer": "#### 4"})
        + "\n"
        + json.dumps({"question": question, "answer": "#### 1"})
        + "\n"
    )
    code, err, _ = run(
        "eval",
        *tiny,
        "dataset=gsm8k",
        f"dataset.path={data}",
        "dataset.limit=2",
        f"hydra.run.dir={tmp_path / 'run'}",
    )
    assert_clear_error(
        code,
        err,
        f"error: {data}:2: dataset source 'gsm8k': query gsm8k-1 has an empty question",
        "remove the record",
    )


def test_an_empty_chat_turn(tmp_path, no_model_loads):
    data = tmp_path / "m.jsonl"
    data.write_text(json.dumps({"question_id": 3, "category": "writing", "turns": [" "]}) + "\n")
    code, err, _ = run(
        "eval", *TINY, "dataset=mt_bench", f"dataset.path={data}", f"hydra.run.dir={tmp_path / 'run'}"
    )
    assert_clear_error(code, err, f"{data}:1: dataset source 'mt_bench': query q3 has an empty turn")


def test_merge_out_is_a_file_or_under_one(tmp_path):
    src = tmp_path / "shard"
    src.mkdir()
    file = tmp_path / "rows.jsonl"
    file.write_text("mine\n")
    code, err, _ = run("merge", str(src), "--out", str(file))
    assert_clear_error(
        code, err, f"error: --out {file} is a file, not a directory", "fix:   pass a directory"
    )
    code, err, _ = run("merge", str(src), "--out", str(file / "merged"))
    assert_clear_error(
        code,
        err,
        f"error: --out {file / 'merged'}: {file} is a file, so no directory can be made",
        "--out <a new or writable directory>",
    )
    assert file.read_text() == "mine\n"


def test_merge_out_unwritable(tmp_path, monkeypatch):
    src, out = tmp_path / "shard", tmp_path / "ro" / "merged"
    src.mkdir()
    out.parent.mkdir()
    real_access = os.access
    monkeypatch.setattr(
        os, "access", lambda p, mode, **kw: False if str(p) == str(out.parent) else real_access(p, mode, **kw)
    )
    code, err, _ = run("merge", str(src), "--out", str(out))
    assert_clear_error(code, err, f"error: --out {out} cannot be made: {out.parent} is not writable")
    monkeypatch.setattr(os, "access", real_access)

    def merge(
        sources, out, overwrite=False, allow_incomplete=False
    ):  # the write itself fails (a read-only mount, as root sees one)
        raise OSError(errno.EROFS, os.strerror(errno.EROFS), str(out))

    monkeypatch.setattr(collected, "merge", merge)
    code, err, _ = run("merge", str(src), "--out", str(out))
    assert_clear_error(
        code,
        err,
        f"error: cannot write the merged rows into {out}: Read-only file system",
        "--out <a new or writable directory>",
    )


def test_run_dir_is_a_file(tmp_path, no_model_loads):
    file = tmp_path / "taken"
    file.write_text("mine")
    code, err, _ = run("eval", *TINY, f"hydra.run.dir={file}")
    assert_clear_error(code, err, f"error: {file} is a file, not a directory", "hydra.run.dir=<a directory>")
    assert file.read_text() == "mine"


def test_a_confidence_threshold_above_1(tmp_path, no_model_loads):
    code, err, _ = run(
        "eval", *TINY, "pool.drafters.quantized.confidence_threshold=2", f"hydra.run.dir={tmp_path / 'r'}"
    )
    assert_clear_error(
        code,
        err,
        "error: pool.drafters.quantized.confidence_threshold=2: expected a finite number in [0, 1]",
        "fix:   set pool.drafters.quantized.confidence_threshold=<",
    )


def test_a_category_filter_and_offset_that_empty_a_source(tmp_path, no_model_loads):
    code, err, _ = run(
        "eval", *TINY, "dataset.categories=[writing]", "dataset.offset=3", f"hydra.run.dir={tmp_path / 'r'}"
    )
    assert_clear_error(
        code,
        err,
        "error: dataset source 'chat' yields no queries",
        "dataset.categories=['writing']",
        "dataset.offset=3",
        "dataset.sources.chat=null",
    )


@pytest.mark.parametrize(
    "command, experiment, right",
    [
        ("eval", "cascades_cpu", "cascades"),
        ("cascades", "metasd_cpu", "eval"),
        ("collect", "cascades_cpu", "cascades"),
    ],
)
def test_an_experiment_for_another_command(tmp_path, no_model_loads, command, experiment, right):
    code, err, _ = run(command, *TINY, f"experiment={experiment}", f"hydra.run.dir={tmp_path / 'r'}")
    assert_clear_error(
        code,
        err,
        f"error: experiment '{experiment}' is written for {right}, not {command}",
        f"fix:   run `specbench {right} experiment={experiment} ...`",
    )
    assert not (tmp_path / "r").exists()


def test_an_unwritable_model_cache(tmp_path, monkeypatch):
    def convert(pkg_dir, tmp):
        raise AssertionError("the embedded model was converted")

    monkeypatch.setattr(store, "convert_smollm2", convert)
    (tmp_path / "file").write_text("not a directory")
    monkeypatch.setenv("SPECBENCH_CACHE", str(tmp_path / "file" / "cache"))
    code, err, _ = run(
        "eval",
        "target=smollm2_135m",
        "pool=tiny",
        "dataset.limit=1",
        "decoding.max_new_tokens=4",
        f"hydra.run.dir={tmp_path / 'r'}",
    )
    assert_clear_error(
        code,
        err,
        f"error: cannot write the model cache {tmp_path / 'file' / 'cache'}",
        "SPECBENCH_CACHE=<a writable directory>",
    )
    assert "hydra.run.dir" not in err


def test_a_damaged_head_checkpoint(tmp_path):
    head = tmp_path / "head"
    head.mkdir()
    (head / "config.json").write_text("{}")
    (head / "model.safetensors").write_bytes(os.urandom(600))
    drafter = f"+pool.drafters.eg={{_target_: specbench.drafters.eagle.build, checkpoint: '{head}'}}"
    code, err, _ = run(
        "eval", *TINY, drafter, "methods=[autoregressive,fixed:eg]", f"hydra.run.dir={tmp_path / 'r'}"
    )
    assert_clear_error(
        code,
        err,
        f"error: draft head file {head / 'model.safetensors'} cannot be read",
        "specbench train-drafter",
    )
