"""Issue 14, "silent wrong results and data loss": each case the probe found now stops with a clear
error (or a warning) instead of a stale or wrong result. The issue's repro commands, on tiny models:
through the CLI where the message and the exit code matter, in-process (the pipelines' ``run``) to
keep the rest quick."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import torch
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from specbench.configs import conf_dir
from specbench.errors import SpecbenchError
from specbench.pipelines import bench, cascades, collect, collected, evaluate, train_policy
from specbench.selection import PolicySelector

EMBEDDED_GSM8K = str(Path(__file__).parents[2] / "specbench" / "tasks" / "embedded" / "gsm8k.jsonl")
# one query per embedded task (4), autoregressive only: the cheapest run that writes several records
QUICK = [
    "target=tiny_llama",
    "pool=none",
    "dataset.limit=1",
    "decoding.max_new_tokens=4",
    "warmup.max_new_tokens=0",
    "methods=[autoregressive]",
]
COLLECT = [
    "target=tiny_llama",
    "pool=tiny",
    "dataset.limit=1",
    "decoding.max_new_tokens=4",
    "warmup.max_new_tokens=0",
    "collect.max_new_tokens=4",
]


def specbench(*args, cwd=None):
    return subprocess.run(
        [sys.executable, "-m", "specbench.cli", *args], capture_output=True, text=True, cwd=cwd, timeout=600
    )


def cfg_of(name: str, overrides: list[str]):
    with initialize_config_dir(config_dir=conf_dir(), version_base=None):
        return compose(config_name=name, overrides=overrides)


def lines(path: Path) -> list[str]:
    return path.read_text().splitlines()


# ----------------------------------------------------------------- 1. resuming a directory of another config


@pytest.mark.slow  # 34 s: the slow set
def test_eval_refuses_to_resume_a_directory_of_another_target(tmp_path):
    """Repro: eval tiny_llama into d1, then eval tiny_t5 into d1 (it decoded nothing and reported the
    old target's numbers under the new title, and overwrote config.yaml)."""
    d1 = tmp_path / "d1"
    first = specbench(
        "eval",
        "target=tiny_llama",
        "pool=tiny",
        "dataset.limit=1",
        "decoding.max_new_tokens=4",
        "warmup.max_new_tokens=0",
        "methods=[autoregressive,fixed:quantized]",
        f"hydra.run.dir={d1}",
    )
    assert first.returncode == 0, first.stderr[-3000:]
    config, examples = (d1 / "config.yaml").read_text(), lines(d1 / "examples.jsonl")
    t5 = [
        "eval",
        "target=tiny_t5",
        "pool=tiny_t5_hf",
        "dataset.limit=1",
        "decoding.max_new_tokens=16",
        "warmup.max_new_tokens=0",
        "methods=[autoregressive,fixed:quantized]",
        f"hydra.run.dir={d1}",
    ]
    res = specbench(*t5)
    assert res.returncode == 2
    assert "error:" in res.stderr and "different config" in res.stderr
    assert 'target.model: "embedded:tiny_llama" -> "embedded:tiny_t5"' in res.stderr
    assert "decoding.max_new_tokens" in res.stderr and "overwrite=true" in res.stderr
    assert (d1 / "config.yaml").read_text() == config  # not overwritten by the refused run
    assert lines(d1 / "examples.jsonl") == examples

    again = specbench(*t5, "overwrite=true")
    assert again.returncode == 0, again.stderr[-3000:]
    assert OmegaConf.load(d1 / "config.yaml").target.model == "embedded:tiny_t5"
    records = [json.loads(x) for x in lines(d1 / "examples.jsonl")]
    assert {r["method"] for r in records} == {"autoregressive", "fixed:quantized"}
    assert (
        all(r["new_tokens"] <= 16 for r in records) and len(records) == 10
    )  # only the new run's records (5 tasks x 2 methods)
    assert "embedded:tiny_t5" in (d1 / "summary.md").read_text()


def test_eval_any_changed_knob_is_named_and_unchanged_reruns_resume(tmp_path):
    evaluate.run(cfg_of("eval", QUICK), tmp_path)
    n = len(lines(tmp_path / "examples.jsonl"))
    for knob, shown in [
        ("decoding.max_new_tokens=6", "decoding.max_new_tokens: 4 -> 6"),
        ("decoding.draft_length=2", "decoding.draft_length: 4 -> 2"),
        ("decoding.temperature=0.5", "decoding.temperature: 0.0 -> 0.5"),
        (f"dataset.sources.math.path={EMBEDDED_GSM8K}", "dataset.sources.math.path"),
    ]:
        with pytest.raises(SpecbenchError, match="different config") as info:
            evaluate.run(cfg_of("eval", QUICK + [knob]), tmp_path)
        assert shown in info.value.problem
    # settings that change no result (threads, warm-up) resume: nothing is decoded again
    evaluate.run(cfg_of("eval", QUICK + ["threads=1", "warmup.max_new_tokens=2"]), tmp_path)
    assert len(lines(tmp_path / "examples.jsonl")) == n


@pytest.mark.parametrize(
    "pipeline, name, results, extra",
    [
        (
            cascades,
            "cascades",
            "examples.jsonl",
            ["drafter_arm=early_exit_1", "rules=[chow]", "alphas.chow=[0.5]"],
        ),
        (bench, "bench", "bench.jsonl", []),
    ],
)
def test_cascades_and_bench_refuse_records_of_another_config(tmp_path, pipeline, name, results, extra):
    """The refusal comes before anything is loaded, so a directory with a config and a record will do."""
    base = ["target=tiny_llama", "pool=tiny", "dataset.limit=1", *extra]
    OmegaConf.save(cfg_of(name, base + ["decoding.max_new_tokens=4"]), tmp_path / "config.yaml")
    (tmp_path / results).write_text('{"query_id": "x", "method": "autoregressive", "impl": "ours"}\n')
    before = (tmp_path / "config.yaml").read_text()
    with pytest.raises(SpecbenchError, match=r"different config.*decoding.max_new_tokens: 4 -> 8"):
        pipeline.run(cfg_of(name, base + ["decoding.max_new_tokens=8"]), tmp_path)
    assert (tmp_path / "config.yaml").read_text() == before


# ----------------------------------------------------------------- 2. train-policy on mixed collections


@pytest.fixture(scope="module")
def llama_rows(tmp_path_factory):
    """4 rows (one query per embedded task) from tiny_llama with the tiny pool."""
    out = tmp_path_factory.mktemp("ca")
    collect.run(cfg_of("collect", COLLECT), out)
    return out


def test_train_policy_refuses_collections_of_two_targets(llama_rows, tmp_path):
    """Repro: collect ca (tiny_llama) and ct (tiny_t5), then train-policy data=[ca,ct]."""
    ct = tmp_path / "ct"
    collect.run(
        cfg_of(
            "collect",
            [
                "target=tiny_t5",
                "pool=tiny_t5_hf",
                "dataset.limit=1",
                "dataset.offset=4",
                "decoding.max_new_tokens=4",
                "collect.max_new_tokens=4",
                "warmup.max_new_tokens=0",
            ],
        ),
        ct,
    )
    with pytest.raises(SpecbenchError, match="different settings") as info:
        train_policy.run(
            cfg_of("train_policy", [f"data=[{llama_rows},{ct}]", "train.epochs=2"]), tmp_path / "pp"
        )
    assert 'target.model: "embedded:tiny_llama" -> "embedded:tiny_t5"' in info.value.problem
    assert "dataset" not in info.value.problem  # collections of different datasets may be combined
    assert not (tmp_path / "pp" / "policy.pt").exists()


def test_train_policy_refuses_colliding_query_ids(tmp_path):
    """Two gsm8k files give the same ids (gsm8k-0): the rows were silently dropped."""
    other = tmp_path / "other.jsonl"
    other.write_text(
        json.dumps({"question": "Ann has 3 pens and buys 2. How many?", "answer": "#### 5"}) + "\n"
    )
    dirs = []
    for path in (EMBEDDED_GSM8K, other):
        dirs.append(tmp_path / Path(path).stem)
        collect.run(
            cfg_of(
                "collect",
                [
                    "target=tiny_llama",
                    "pool=none",
                    "dataset=gsm8k",
                    f"dataset.path={path}",
                    "dataset.limit=1",
                    "collect.max_new_tokens=2",
                    "warmup.max_new_tokens=0",
                ],
            ),
            dirs[-1],
        )
    with pytest.raises(SpecbenchError, match="query id 'gsm8k-0' is in both"):
        collected.read_rows(dirs)
    with pytest.raises(SpecbenchError, match="gsm8k-0"):
        train_policy.run(cfg_of("train_policy", [f"data=[{dirs[0]},{dirs[1]}]"]), tmp_path / "pp")


def test_policy_records_its_target_and_eval_refuses_another(llama_rows, tmp_path):
    """Repro: the policy trained on tiny_llama rows was applied to tiny_t5 (only the size was checked)."""
    train_policy.run(
        cfg_of("train_policy", [f"data={llama_rows}", "train.epochs=2", "train.val_fraction=0.5"]), tmp_path
    )
    ckpt = torch.load(tmp_path / "policy.pt", weights_only=True)
    assert ckpt["embedding"]["target"] == "embedded:tiny_llama" and ckpt["embedding"]["pooling"] == "mean"
    assert ckpt["embedding"]["dim"] == 64 and ckpt["embedding"]["prompt"]["style"] == "plain"
    arms = ["autoregressive", "quantized", "prompt_lookup", "early_exit_1"]
    PolicySelector(arms, str(tmp_path / "policy.pt"), target="embedded:tiny_llama")
    with pytest.raises(
        SpecbenchError, match="trained on the embeddings of target embedded:tiny_llama.*embedded:tiny_t5"
    ):
        PolicySelector(arms, str(tmp_path / "policy.pt"), target="embedded:tiny_t5")
    eval_t5 = cfg_of(
        "eval",
        [
            "target=tiny_t5",
            "pool=tiny_t5_hf",
            "dataset.limit=1",
            "decoding.max_new_tokens=4",
            "selector=policy",
            f"policy.checkpoint={tmp_path / 'policy.pt'}",
        ],
    )
    with pytest.raises(SpecbenchError, match="embedded:tiny_llama.*embedded:tiny_t5"):
        evaluate.run(eval_t5, tmp_path / "e")


# ----------------------------------------------------------------- 3. merge


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    root = tmp_path_factory.mktemp("shards")
    for i in (0, 1):
        collect.run(
            cfg_of(
                "collect",
                [
                    "target=tiny_llama",
                    "pool=none",
                    "dataset=gsm8k",
                    f"dataset.path={EMBEDDED_GSM8K}",
                    "dataset.limit=2",
                    "collect.max_new_tokens=2",
                    "warmup.max_new_tokens=0",
                    f"collect.shard={i}",
                    "collect.num_shards=2",
                ],
            ),
            root / f"s{i}",
        )
    return root


def test_merge_refuses_an_existing_collection_without_overwrite(shards, tmp_path):
    s0, s1 = str(shards / "s0"), str(shards / "s1")
    res = specbench("merge", s0, s1, "--out", s0)  # the repro: --out an existing collection
    assert res.returncode == 2 and "already holds a collection" in res.stderr and "--overwrite" in res.stderr
    assert len(collected.read_rows([s0])) == 1  # its rows are still there
    out = tmp_path / "m"
    collected.merge([s0, s1], out)
    with pytest.raises(SpecbenchError, match="already holds a collection"):
        collected.merge([s0, s1], out)
    collected.merge([s0, s1], out, overwrite=True)
    assert [r["query_id"] for r in collected.read_rows([out])] == ["gsm8k-0", "gsm8k-1"]


def test_merging_some_shards_is_refused_naming_the_missing_ones(shards, tmp_path, caplog):
    """Issue 45: merging some shards is refused (it was a warning), unless --allow-incomplete, which warns."""
    with pytest.raises(SpecbenchError, match="rows-00001-of-00002.jsonl missing"):
        collected.merge([str(shards / "s0")], tmp_path / "m")
    with caplog.at_level(logging.WARNING):
        collected.merge([str(shards / "s0")], tmp_path / "m", allow_incomplete=True)
    assert "rows-00001-of-00002.jsonl" in caplog.text and "missing" in caplog.text
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        collected.merge([str(shards / "s0"), str(shards / "s1")], tmp_path / "all")
    assert "missing" not in caplog.text
    res = specbench("merge", str(shards / "s1"), "--out", str(tmp_path / "cli"))
    assert (
        res.returncode == 2
        and "rows-00000-of-00002.jsonl" in res.stderr
        and "--allow-incomplete" in res.stderr
    )
    res = specbench("merge", str(shards / "s1"), "--out", str(tmp_path / "cli"), "--allow-incomplete")
    assert res.returncode == 0 and "rows-00000-of-00002.jsonl" in res.stderr


# ----------------------------------------------------------------- 4. prompts longer than the context


def test_a_prompt_longer_than_the_context_is_refused_before_decoding(tmp_path):
    """Repro: a 3.2M-token GSM8K question hung with no output."""
    huge = tmp_path / "huge.jsonl"
    huge.write_text(
        json.dumps({"question": "Tom has " + "many apples and " * 200000 + "how many?", "answer": "#### 1"})
        + "\n"
    )
    res = specbench(
        "eval",
        "target=tiny_llama",
        "pool=tiny",
        "dataset=gsm8k",
        f"dataset.path={huge}",
        "dataset.limit=1",
        "decoding.max_new_tokens=16",
        "methods=[autoregressive]",
        f"hydra.run.dir={tmp_path / 'run'}",
    )
    assert res.returncode == 2, res.stderr[-3000:]
    err = res.stderr
    assert "query gsm8k-0" in err and "3,200,0" in err and "2,048" in err and "max_position_embeddings" in err
    assert "dataset.max_input_tokens" in err
    assert not (tmp_path / "run" / "examples.jsonl").exists()


def test_max_input_tokens_makes_a_long_prompt_fit(tmp_path):
    long = tmp_path / "long.jsonl"
    long.write_text(
        json.dumps({"question": "Tom has " + "many apples and " * 200 + "how many?", "answer": "#### 1"})
        + "\n"
    )
    base = [
        "target=tiny_llama",
        "pool=none",
        "dataset=gsm8k",
        f"dataset.path={long}",
        "decoding.max_new_tokens=4",
        "warmup.max_new_tokens=0",
        "methods=[autoregressive]",
    ]
    with pytest.raises(SpecbenchError, match="3,2.. tokens"):
        evaluate.run(cfg_of("eval", base), tmp_path / "a")
    evaluate.run(cfg_of("eval", base + ["dataset.max_input_tokens=256"]), tmp_path / "b")
    assert len(lines(tmp_path / "b" / "examples.jsonl")) == 1


# ----------------------------------------------------------------- 5. duplicate ids in one data file


def test_duplicate_ids_in_a_data_file_are_refused_up_front(tmp_path):
    """Repro: two xsum records with id 42 crashed the summary after the whole run."""
    dup = tmp_path / "dup.jsonl"
    dup.write_text(
        '{"id":"42","document":"The cat sat on the mat.","summary":"Cat sits."}\n'
        '{"id":"42","document":"Stocks fell on Monday.","summary":"Stocks fall."}\n'
    )
    res = specbench(
        "eval",
        "target=tiny_llama",
        "pool=tiny",
        "dataset=xsum",
        f"dataset.path={dup}",
        "dataset.limit=2",
        "decoding.max_new_tokens=16",
        "methods=[autoregressive,fixed:prompt_lookup]",
        f"hydra.run.dir={tmp_path / 'run'}",
    )
    assert res.returncode == 2
    assert "error:" in res.stderr and "id '42'" in res.stderr
    assert f"{dup}:1" in res.stderr and f"{dup}:2" in res.stderr
    assert not (tmp_path / "run" / "examples.jsonl").exists()


# ----------------------------------------------------------------- 6, 7. decoding settings


def test_fractional_draft_length_is_refused(tmp_path):
    with pytest.raises(
        SpecbenchError, match=r"decoding.draft_length=2.9: expected an integer >= 1"
    ):  # the door
        evaluate.run(cfg_of("eval", QUICK + ["decoding.draft_length=2.9"]), tmp_path)
    res = specbench("eval", *QUICK, "decoding.draft_length=2.9", f"hydra.run.dir={tmp_path / 'cli'}")
    assert res.returncode == 2 and "2.9" in res.stderr and "decoding.draft_length" in res.stderr


def test_out_of_vocabulary_extra_eos_id_is_refused(tmp_path):
    with pytest.raises(
        SpecbenchError,
        match=r"extra_eos_ids: 99999 is not a token id: the target's vocabulary has "
        r"259 tokens",
    ):
        evaluate.run(cfg_of("eval", QUICK + ["decoding.extra_eos_ids=[1,99999]"]), tmp_path)
    with pytest.raises(
        SpecbenchError, match=r"decoding.extra_eos_ids=\[-1\]: expected a list, each an integer >= 0"
    ):
        evaluate.run(cfg_of("eval", QUICK + ["decoding.extra_eos_ids=[-1]"]), tmp_path)


# ----------------------------------------------------------------- 8. too few rows for a held-out set


def test_train_policy_needs_held_out_rows(llama_rows, tmp_path):
    """Repro: a single collected row trained a policy whose 'validation' came from that row."""
    one = tmp_path / "one"
    collect.run(
        cfg_of(
            "collect",
            [
                "target=tiny_llama",
                "pool=tiny",
                "dataset=gsm8k",
                f"dataset.path={EMBEDDED_GSM8K}",
                "dataset.limit=1",
                "collect.max_new_tokens=2",
                "warmup.max_new_tokens=0",
            ],
        ),
        one,
    )
    with pytest.raises(SpecbenchError, match=r"1 collected row\(s\) .* leave 0 for validation; at least 2"):
        train_policy.run(cfg_of("train_policy", [f"data={one}", "train.epochs=2"]), tmp_path / "p1")
    with pytest.raises(SpecbenchError, match="5 collected row.* leave 1 for validation") as info:
        train_policy.run(cfg_of("train_policy", [f"data={llama_rows}", "train.epochs=2"]), tmp_path / "p4")
    assert "collect at least 8 queries" in info.value.fix
    train_policy.run(
        cfg_of("train_policy", [f"data={llama_rows}", "train.epochs=2", "train.val_fraction=0.5"]),
        tmp_path / "ok",
    )
    assert json.loads((tmp_path / "ok" / "metrics.json").read_text())["n_val"] == 2


# ----------------------------------------------------------------- 9. bench: only HF's own refusals are "unsupported"


def _bench_with_failing_assistant(tmp_path, monkeypatch, error: Exception):
    from transformers import LlamaForCausalLM

    real = LlamaForCausalLM.generate

    def generate(self, *args, **kwargs):
        if getattr(kwargs.get("generation_config"), "prompt_lookup_num_tokens", None):
            raise error
        return real(self, *args, **kwargs)

    monkeypatch.setattr(LlamaForCausalLM, "generate", generate)
    cfg = cfg_of(
        "bench",
        [
            "target=tiny_llama",
            "pool=tiny",
            "drafters=[prompt_lookup]",
            "dataset=gsm8k",
            f"dataset.path={EMBEDDED_GSM8K}",
            "dataset.limit=1",
            "decoding.max_new_tokens=4",
            "warmup.max_new_tokens=0",
        ],
    )
    return bench.run(cfg, tmp_path)


def test_bench_out_of_memory_is_an_error_not_unsupported(tmp_path, monkeypatch):
    with pytest.raises(
        SpecbenchError,
        match=r"Hugging Face generate \(prompt_lookup\) failed on query gsm8k-0: "
        r"OutOfMemoryError: CUDA out of memory",
    ) as info:
        _bench_with_failing_assistant(tmp_path, monkeypatch, torch.OutOfMemoryError("CUDA out of memory."))
    assert "not marked unsupported" in info.value.fix
    assert not (tmp_path / "bench.md").exists()


def test_bench_marks_hf_refusals_unsupported_with_the_reason(tmp_path, monkeypatch):
    _bench_with_failing_assistant(
        tmp_path, monkeypatch, ValueError("assisted generation is not supported here")
    )
    table = pd.read_csv(tmp_path / "bench.csv").set_index("method")
    assert pd.isna(table.loc["prompt_lookup", "hf_s"]) and not pd.isna(table.loc["prompt_lookup", "ours_s"])
    assert (
        "prompt_lookup here (ValueError: assisted generation is not supported here)"
        in (tmp_path / "bench.md").read_text()
    )


# ----------------------------------------------------------------- 10. corrupted records


def test_a_malformed_line_in_the_middle_of_the_records_stops_a_resume(tmp_path):
    evaluate.run(cfg_of("eval", QUICK), tmp_path)
    path = tmp_path / "examples.jsonl"
    rows = lines(path)
    path.write_text("\n".join([rows[0], rows[1][:30], *rows[2:]]) + "\n")
    with pytest.raises(SpecbenchError, match=r"examples.jsonl:2: line 2 is not a JSON record.*corrupted"):
        evaluate.run(cfg_of("eval", QUICK), tmp_path)


def test_fit_context_stops_a_long_generation_at_the_end_of_the_context(tmp_path):
    """A prompt that fits but leaves less room than max_new_tokens (a Spec-Bench article under Vicuna's
    2,048 positions): refused by default, naming decoding.fit_context; with it, the generation stops at
    the context's end and its record says so."""
    long = tmp_path / "long.jsonl"
    long.write_text(
        json.dumps({"question": "Tom has " + "many apples and " * 120 + "how many?", "answer": "#### 1"})
        + "\n"
    )  # about 2,010 tokens: it fits, 64 more do not
    base = [
        "target=tiny_llama",
        "pool=tiny",
        "dataset=gsm8k",
        f"dataset.path={long}",
        "decoding.max_new_tokens=64",
        "warmup.max_new_tokens=0",
        "methods=[autoregressive,fixed:early_exit_1]",
    ]
    with pytest.raises(SpecbenchError, match="2,048") as refused:
        evaluate.run(cfg_of("eval", base), tmp_path / "a")
    assert "decoding.fit_context=true" in refused.value.fix
    evaluate.run(cfg_of("eval", base + ["decoding.fit_context=true"]), tmp_path / "b")
    examples = [json.loads(x) for x in lines(tmp_path / "b" / "examples.jsonl")]
    assert {e["method"] for e in examples} == {"autoregressive", "fixed:early_exit_1"}
    for e in examples:
        assert e["stop"] == "context" and 1 <= e["new_tokens"] < 64, e
    # both stop at the same position, and it stays lossless: the drafter's output is the target's
    assert len({tuple(e["output_ids"]) for e in examples}) == 1


def test_fit_context_cuts_each_row_of_a_batch_on_its_own(tmp_path):
    """Issue 68: at batch 2 a long prompt's row stops at the context's end while its short neighbour decodes all its
    tokens, both as at batch 1 (the batch once gave every row the shortest row's limit)."""
    data = tmp_path / "mixed.jsonl"
    rows = [
        {"question": "Tom has " + "many apples and " * 120 + "how many?", "answer": "#### 1"},
        {"question": "Tom has two apples. How many?", "answer": "#### 2"},
    ]
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    base = [
        "target=tiny_llama",
        "pool=tiny",
        "dataset=gsm8k",
        f"dataset.path={data}",
        "decoding.max_new_tokens=64",
        "decoding.fit_context=true",
        "warmup.max_new_tokens=0",
        "methods=[autoregressive,fixed:prompt_lookup]",
    ]
    evaluate.run(cfg_of("eval", base), tmp_path / "one")
    evaluate.run(cfg_of("eval", [*base, "decoding.batch_size=2"]), tmp_path / "two")
    one, two = ({(e["query_id"], e["method"]): e for e in map(json.loads, lines(tmp_path / d / "examples.jsonl"))}
                for d in ("one", "two"))  # fmt: skip
    assert set(one) == set(two) and len(one) == 4
    for key, e in two.items():
        assert (e["output_ids"], e["stop"]) == (one[key]["output_ids"], one[key]["stop"]), key
    stops = sorted({e["stop"] for e in two.values()})
    assert (
        "context" in stops and len(stops) == 2
    )  # the long row stopped at the context, the short one did not
