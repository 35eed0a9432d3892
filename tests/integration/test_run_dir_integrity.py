"""Issue 22, "Trust": a run directory is locked (one process, one command), files replaced whole are
written atomically, records carry fingerprints of their inputs and the id of the process that timed
them, resumes drop orphan rounds, train-policy refuses an incomplete collection, and a cascades run
stopped early still writes its curves. The issue's repro commands, on the tiny models: through the CLI
where the message and the exit code matter, in-process (the pipelines' ``run``) to keep the rest quick."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import torch
from hydra import compose, initialize_config_dir

from specbench.configs import conf_dir
from specbench.errors import SpecbenchError
from specbench.files import atomic_path, files_fingerprint
from specbench.pipelines import (
    cascade_curves,
    cascades,
    collect,
    collected,
    evaluate,
    spec_bench,
    tables,
    train_policy,
)
from specbench.pipelines.session.run_dir import CLAIM_FILE, RunDirTaken, lock_run_dir, run_command
from specbench.pipelines.session.run_records import Records
from specbench.records import read_jsonl

QUICK = [
    "target=tiny_llama",
    "pool=none",
    "dataset.limit=1",
    "decoding.max_new_tokens=4",
    "warmup.max_new_tokens=0",
    "methods=[autoregressive]",
]
TWO = [
    "target=tiny_llama",
    "pool=tiny",
    "dataset.limit=1",
    "decoding.max_new_tokens=8",
    "warmup.max_new_tokens=0",
    "methods=[autoregressive,fixed:quantized]",
]
COLLECT = [
    "target=tiny_llama",
    "pool=tiny",
    "dataset.limit=1",
    "decoding.max_new_tokens=4",
    "warmup.max_new_tokens=0",
    "collect.max_new_tokens=4",
]
CASCADES = [
    "target=tiny_llama",
    "pool=tiny",
    "dataset.limit=1",
    "decoding.max_new_tokens=8",
    "warmup.max_new_tokens=0",
    "rules=[chow,lossy_sd]",
]


def specbench(*args):
    return subprocess.run(
        [sys.executable, "-m", "specbench.cli", *args], capture_output=True, text=True, timeout=600
    )


def cfg_of(name: str, overrides: list[str]):
    with initialize_config_dir(config_dir=conf_dir(), version_base=None):
        return compose(config_name=name, overrides=overrides)


def jsonl(path: Path) -> list[dict]:
    return list(read_jsonl(path))


def write_jsonl(path: Path, rows) -> None:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


# ------------------------------------------------------------------------ 1. two processes in one directory


def test_a_second_writer_is_refused_naming_the_holder(tmp_path):
    """Repro: `eval ... hydra.run.dir=probe/cc & eval ... hydra.run.dir=probe/cc` (both appended every pair)."""
    d = tmp_path / "cc"
    lock_run_dir(d, "eval")  # this test process holds the directory, as a running eval would
    (d / "examples.jsonl").write_text("{}\n")  # its first record
    res = specbench("eval", *QUICK, f"hydra.run.dir={d}")
    assert res.returncode == 2, res.stderr[-3000:]
    assert "error:" in res.stderr and "is being written by another specbench run" in res.stderr
    assert f"pid {os.getpid()}" in res.stderr and "started" in res.stderr and "(specbench eval)" in res.stderr
    assert "fix:" in res.stderr and "hydra.run.dir=<another directory>" in res.stderr
    assert (d / "examples.jsonl").read_text() == "{}\n"  # nothing appended


def test_a_refused_run_leaves_the_holders_hydra_record_and_a_run_writes_its_own(tmp_path):
    """Issue 45 case 1: Hydra used to write .hydra/ before the lock, so a refused run rewrote the holder's record; it
    is now written by the run once it holds the directory."""
    d = tmp_path / "held"
    ok = specbench("eval", *QUICK, f"hydra.run.dir={d}")
    assert ok.returncode == 0, ok.stderr[-3000:]
    overrides = (d / ".hydra" / "overrides.yaml").read_text()
    assert "dataset.limit=1" in overrides and (d / ".hydra" / "config.yaml").is_file()
    assert (d / ".hydra" / "hydra.yaml").is_file()
    lock_run_dir(d, "eval")  # now held, as by a running eval
    res = specbench("eval", *QUICK, "seed=7", f"hydra.run.dir={d}")
    assert res.returncode == 2 and "is being written by another specbench run" in res.stderr
    assert (d / ".hydra" / "overrides.yaml").read_text() == overrides  # the refused run changed nothing


def test_default_run_directories_are_unique_to_the_microsecond():
    from omegaconf import OmegaConf

    run_dirs = OmegaConf.to_container(
        OmegaConf.load(Path(conf_dir()) / "hydra" / "run_dirs.yaml"), resolve=False
    )
    assert run_dirs["run"]["dir"].endswith("%f}") and run_dirs["sweep"]["dir"].endswith("%f}")
    assert run_dirs["output_subdir"] is None


def test_a_refused_run_leaves_the_holders_fresh_directory(tmp_path):
    d = tmp_path / "fresh"
    lock_run_dir(d, "eval")  # held, nothing written yet (the holder is still loading its models)
    res = specbench("eval", *QUICK, f"hydra.run.dir={d}")
    assert res.returncode == 2
    assert (d / CLAIM_FILE).exists()


def test_a_dead_holders_lock_does_not_block(tmp_path):
    d = tmp_path / "dead"
    code = f"from specbench.pipelines.session.run_dir import lock_run_dir; lock_run_dir({str(d)!r}, 'eval'); import os; os._exit(0)"
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)
    assert "pid" in (d / CLAIM_FILE).read_text()  # its holder record is left behind, its lock is not
    out = evaluate.run(cfg_of("eval", QUICK), d)
    assert len(jsonl(out / "examples.jsonl")) == 5


def test_a_resume_refuses_duplicated_records(tmp_path):
    d = tmp_path / "dup"
    evaluate.run(cfg_of("eval", QUICK), d)
    recs = jsonl(d / "examples.jsonl")
    write_jsonl(d / "examples.jsonl", recs + recs[:2])  # what two concurrent writers left
    with pytest.raises(SpecbenchError, match="more than once") as err:
        Records(d)
    assert str(d / "examples.jsonl") in err.value.problem
    assert f"{recs[0]['query_id']} / autoregressive" in err.value.problem


# ------------------------------------------------------------------------ 4. files replaced whole: atomic


def test_an_interrupted_checkpoint_write_keeps_the_old_file(tmp_path, monkeypatch):
    from specbench.policy import checkpoint

    path = tmp_path / "f.pt"
    torch.save({"epoch": 1}, path)

    def torn(obj, f):  # a serializer killed half way: some bytes, then the interruption
        Path(f).write_bytes(b"PK\x03\x04 torn")
        raise KeyboardInterrupt

    monkeypatch.setattr(torch, "save", torn)
    with pytest.raises(KeyboardInterrupt), atomic_path(path) as tmp:
        torch.save({"epoch": 2}, tmp)
    monkeypatch.undo()
    assert torch.load(path)["epoch"] == 1
    assert [p.name for p in tmp_path.iterdir()] == ["f.pt"]  # no temporary left behind
    # the policy checkpoint goes through it
    assert "atomic_path" in Path(checkpoint.__file__).read_text()


def test_train_drafter_interrupted_inside_the_state_write_resumes_from_the_last_epoch(tmp_path, monkeypatch):
    """Repro: Ctrl-C during train-drafter tore state.pt (668 bytes), and the rerun died in torch.load."""
    from safetensors.torch import load_file

    from specbench.pipelines import train_drafter

    toy = tmp_path / "toy.jsonl"
    write_jsonl(
        toy, [{"question": f"Case {i}. How many cows are there now?", "answer": "#### 17"} for i in range(12)]
    )

    def config(out, epochs):
        return cfg_of(
            "train_drafter",
            [
                "target=tiny_llama",
                "dataset=gsm8k",
                f"dataset.path={toy}",
                "dataset.limit=12",
                "train.epochs=" + str(epochs),
                "train.val_examples=2",
                "drafter.vocab=120",
                f"out={out}",
                "~eval_sets.math",
                "~eval_sets.summarization",
                "~eval_sets.translation",
                "~eval_sets.chat",
                "~eval_sets.code",
            ],
        )

    whole, parts = tmp_path / "whole", tmp_path / "parts"
    train_drafter.run(config(whole, 3), tmp_path / "r1")
    real_save, calls = torch.save, []

    def save(obj, f, *a, **k):
        calls.append(f)
        if len(calls) == 2:  # inside epoch 2's state write
            Path(f).write_bytes(b"PK\x03\x04" + b"\0" * 664)
            raise KeyboardInterrupt
        return real_save(obj, f, *a, **k)

    monkeypatch.setattr(torch, "save", save)
    with pytest.raises(KeyboardInterrupt):
        train_drafter.run(config(parts, 3), tmp_path / "r2")
    monkeypatch.undo()
    assert (
        torch.load(parts / "state.pt", weights_only=False)["epoch"] == 1
    )  # the last finished epoch survived
    train_drafter.run(config(parts, 3), tmp_path / "r3")  # resumes at epoch 2
    a, b = load_file(str(whole / "model.safetensors")), load_file(str(parts / "model.safetensors"))
    for k in a:
        torch.testing.assert_close(a[k], b[k], atol=0, rtol=0)


# ------------------------------------------------------------------------ 5. fingerprints of the inputs


def test_an_eval_resume_refuses_records_of_a_changed_data_file(tmp_path):
    """Repro: eval on probe/q.jsonl, replace its three questions, rerun: "resuming: 3 finished generations"."""
    data = tmp_path / "q.jsonl"
    write_jsonl(data, [{"question": f"What is {i} plus {i}?", "answer": f"#### {2 * i}"} for i in range(3)])
    args = [
        "target=tiny_llama",
        "pool=tiny",
        "decoding.max_new_tokens=8",
        "dataset=gsm8k",
        f"dataset.path={data}",
        "methods=[autoregressive]",
        "warmup.max_new_tokens=0",
    ]
    d = tmp_path / "st"
    evaluate.run(cfg_of("eval", args), d)
    write_jsonl(
        data, [{"question": f"How many legs do {i} cats have?", "answer": f"#### {4 * i}"} for i in range(3)]
    )
    with pytest.raises(SpecbenchError, match="other inputs than this run's") as err:
        evaluate.run(cfg_of("eval", args), d)
    assert "content changed" in err.value.problem and "overwrite=true" in err.value.fix
    ids = [r["query_id"] for r in jsonl(d / "examples.jsonl")]
    assert all(i in err.value.problem for i in ids)
    evaluate.run(cfg_of("eval", [*args, "overwrite=true"]), d)  # redone
    refs = [r["reference"] for r in jsonl(d / "examples.jsonl")]
    assert len(refs) == 3 and all("legs" not in r and r.startswith("#### ") for r in refs)
    assert sorted(refs) == sorted(f"#### {4 * i}" for i in range(3))


def test_a_retrained_drafter_checkpoint_is_not_resumed(tmp_path):
    """A retrained `cache:` head behind an unchanged config: the records carry its fingerprint."""
    from types import SimpleNamespace

    from specbench.decoding.loop import Generation

    ckpt = tmp_path / "head"
    ckpt.mkdir()
    (ckpt / "model.safetensors").write_bytes(b"weights v1")
    (ckpt / "state.pt").write_bytes(b"training state")
    before = files_fingerprint(ckpt)
    (ckpt / "state.pt").write_bytes(b"another training state")  # not what the drafter computes with
    assert files_fingerprint(ckpt) == before
    (ckpt / "model.safetensors").write_bytes(b"weights v2")
    after = files_fingerprint(ckpt)
    assert after != before

    q = SimpleNamespace(
        id="q0", task="math", fields={"question": "x"}, turns=[], reference="1", category=None, kind="gsm8k"
    )
    gen = Generation(tokens=[1, 2], rounds=[])
    d = tmp_path / "run"
    with Records(d, queries=[q], drafters={"eagle": before}) as records:
        records.write(q, "q0", "fixed:eagle", gen, "", "1")
    Records(d, queries=[q], drafters={"eagle": before})  # unchanged: resumes
    with pytest.raises(SpecbenchError, match="drafter checkpoint") as err:
        Records(d, queries=[q], drafters={"eagle": after})
    assert "q0" in err.value.problem
    assert not Records(d, queries=[q], drafters={"eagle": after}, overwrite=True).done  # redone


def test_hf_and_eagle_drafters_from_a_directory_have_a_fingerprint(tmp_path):
    from specbench.drafters import hf
    from specbench.models import Target, load_model

    target = Target(load_model("embedded:tiny_llama", device="cpu"))
    draft = load_model("embedded:tiny_llama_draft", device="cpu")
    local = tmp_path / "draft"
    draft.model.save_pretrained(local)
    draft.tokenizer.save_pretrained(local)
    built = hf.build(target, "hf", str(local))
    assert built.fingerprint == files_fingerprint(local) is not None
    assert hf.build(target, "hf", "embedded:tiny_llama_draft").fingerprint is None  # fixed by its name
    assert (
        "drafter.fingerprint = files_fingerprint"
        in (Path(hf.__file__).parent / "eagle" / "eagle1.py").read_text()
    )


# ------------------------------------------------------------------------ 6. orphan rounds


@pytest.fixture(scope="module")
def cascade_run(tmp_path_factory):
    d = tmp_path_factory.mktemp("c1") / "c1"
    cascades.run(cfg_of("cascades", CASCADES), d)
    return d


def rounds_per_pair(d: Path) -> dict:
    out: dict = {}
    for r in jsonl(d / "rounds.jsonl"):
        out[(r["query_id"], r["method"])] = out.get((r["query_id"], r["method"]), 0) + 1
    return out


def test_a_cascades_resume_drops_orphan_rounds(cascade_run, tmp_path):
    """Repro: cascades, delete the math/sd line of examples.jsonl, rerun: the sd rejection rate rose."""
    import shutil

    d = tmp_path / "c1"
    shutil.copytree(cascade_run, d)
    (d / CLAIM_FILE).unlink()
    clean = pd.read_csv(d / "curves.csv")
    recs = jsonl(d / "examples.jsonl")
    write_jsonl(d / "examples.jsonl", [r for r in recs if not (r["task"] == "math" and r["method"] == "sd")])
    cascades.run(cfg_of("cascades", CASCADES), d)
    counts = rounds_per_pair(d)
    assert {(r["query_id"], r["method"]): r["rounds"] for r in jsonl(d / "examples.jsonl")} == counts
    again = pd.read_csv(d / "curves.csv")
    pick = lambda t: t[(t.task == "math") & (t.method == "sd")].rejection_rate.iloc[0]  # noqa: E731
    assert pick(again) == pytest.approx(pick(clean), nan_ok=True)


def test_spec_bench_accept_lengths_sum_to_the_new_tokens_after_a_resume(tmp_path):
    """Repro: eval spec_bench_answers=true; sed -i 3d examples.jsonl; rerun: 8 tokens, accept_lengths summing to 16."""
    d = tmp_path / "sb"
    args = [*TWO, "spec_bench_answers=true"]
    evaluate.run(cfg_of("eval", args), d)
    lines = (d / "examples.jsonl").read_text().splitlines(keepends=True)
    (d / "examples.jsonl").write_text("".join(lines[:2] + lines[3:]))
    evaluate.run(cfg_of("eval", args), d)
    files = sorted((d / "spec_bench").glob("*.jsonl"))
    assert files
    for f in files:
        for line in jsonl(f):
            choice = line["choices"][0]
            assert sum(choice["accept_lengths"]) == sum(choice["new_tokens"]), (f.name, line["question_id"])
    # a directory damaged before the fix: the answer file keeps each generation's own last rounds
    examples = [
        {
            "query_id": "q1",
            "method": "m",
            "task": "t",
            "text": "",
            "target_calls": 2,
            "new_tokens": 3,
            "seconds": 1.0,
            "rounds": 2,
        }
    ]
    rounds = [{"query_id": "q1", "method": "m", "emitted": n} for n in (2, 1, 2, 1)]
    assert spec_bench.answers(examples, rounds, "x")["m"][0]["choices"][0]["accept_lengths"] == [2, 1]


# ------------------------------------------------------------------------ 7. incomplete collections


def test_train_policy_refuses_an_incomplete_collection(tmp_path):
    """Repro: collect shard 0 of 3, then train-policy on it (trained silently)."""
    sh = tmp_path / "sh"
    collect.run(
        cfg_of("collect", [*COLLECT, "dataset.limit=2", "collect.shard=0", "collect.num_shards=3"]), sh
    )
    args = [f"data={sh}", "train.val_fraction=0.67", "train.epochs=2"]
    with pytest.raises(SpecbenchError, match="incomplete") as err:
        train_policy.run(cfg_of("train_policy", args), tmp_path / "tp")
    assert (
        "rows-00001-of-00003.jsonl" in err.value.problem and "rows-00002-of-00003.jsonl" in err.value.problem
    )
    assert "train.allow_incomplete=true" in err.value.fix and "specbench collect" in err.value.fix
    assert not (tmp_path / "tp" / "policy.pt").exists()
    train_policy.run(cfg_of("train_policy", [*args, "train.allow_incomplete=true"]), tmp_path / "tp2")
    assert (tmp_path / "tp2" / "policy.pt").exists()


def test_train_policy_refuses_a_collect_that_stopped_early(tmp_path):
    cl = tmp_path / "cl"
    collect.run(cfg_of("collect", COLLECT), cl)
    rows = (cl / "rows.jsonl").read_text().splitlines(keepends=True)
    (cl / "rows.jsonl").write_text("".join(rows[:-1]))  # a collect interrupted before its last row
    with pytest.raises(SpecbenchError, match=f"has {len(rows) - 1} of its {len(rows)} rows"):
        train_policy.run(cfg_of("train_policy", [f"data={cl}", "train.val_fraction=0.5"]), tmp_path / "tp")
    merged = tmp_path / "m"
    with pytest.raises(SpecbenchError, match="is incomplete") as err:  # issue 45: merge looks too
        collected.merge([str(cl)], merged)
    assert "--allow-incomplete" in err.value.fix
    collected.merge(
        [str(cl)], merged, allow_incomplete=True
    )  # kept the size: refused the same way downstream
    with pytest.raises(SpecbenchError, match="incomplete"):
        train_policy.run(
            cfg_of("train_policy", [f"data={merged}", "train.val_fraction=0.5"]), tmp_path / "tp3"
        )


# ------------------------------------------------------------------------ 8. one command per directory


def test_another_commands_run_into_a_directory_is_refused(tmp_path):
    """Repro: eval into probe/ev; collect into probe/cl; train-policy into probe/ev (replaced summary.*)."""
    ev, cl = tmp_path / "ev", tmp_path / "cl"
    evaluate.run(cfg_of("eval", QUICK), ev)
    collect.run(cfg_of("collect", COLLECT), cl)
    assert run_command(ev) == "eval" and run_command(cl) == "collect"
    summary, config = (ev / "summary.md").read_text(), (ev / "config.yaml").read_text()
    res = specbench(
        "train-policy", f"data={cl}", "train.epochs=3", "train.val_fraction=0.5", f"hydra.run.dir={ev}"
    )
    assert res.returncode == 2, res.stderr[-3000:]
    assert (
        "belongs to `specbench eval`" in res.stderr
        and "`specbench train-policy` cannot run into it" in res.stderr
    )
    assert "fix:" in res.stderr and "hydra.run.dir=<another directory>" in res.stderr
    with pytest.raises(RunDirTaken, match="belongs to `specbench eval`"):
        collect.run(cfg_of("collect", COLLECT), ev)
    assert (ev / "summary.md").read_text() == summary and (ev / "config.yaml").read_text() == config
    evaluate.run(cfg_of("eval", QUICK), ev)  # the eval still resumes its own records
    # issue 34: train-drafter was told to "wait for that run to finish" although nothing ran; its own fix is out=
    from specbench.pipelines.session.run_dir import lock_run_dir

    with pytest.raises(RunDirTaken, match="belongs to `specbench eval`") as err:
        lock_run_dir(
            ev, "train-drafter", fix="wait for that run to finish", elsewhere="out=<another directory>"
        )
    assert "out=<another directory>" in err.value.fix and "wait" not in err.value.fix


# ------------------------------------------------------------------------ 9. speedups of one process only


def example(q, method, seconds, process, tokens=4):
    return {
        "query_id": q,
        "task": "t",
        "method": method,
        "output_ids": [1] * tokens,
        "text": "",
        "new_tokens": tokens,
        "seconds": seconds,
        "target_calls": tokens,
        "rounds": tokens,
        "drafted": 0,
        "accepted": 0,
        "switches": 0,
        "t_switch": 0.0,
        "stop": "length",
        "quality": {},
        "process": process,
    }


def test_speedups_pair_only_timings_of_one_process():
    """Repro: a resumed run's summarization sd showed 0.006x (against 1.134x clean), with no note."""
    recs = [
        example("q1", "autoregressive", 1.0, "a"),
        example("q1", "fixed:x", 0.5, "a"),
        example("q2", "autoregressive", 1.0, "a"),
        example("q2", "fixed:x", 0.001, "b"),
    ]  # q2's method: resumed
    table = tables.summarize(recs)
    row = table[(table.task == "all") & (table.method == "fixed:x")].iloc[0]
    assert row.speedup == pytest.approx(2.0) and row.paired == 1 and row.n_examples == 2
    note = tables.pairing_note(table)
    assert "fixed:x 1 of 2" in note and "same process" in note
    assert tables.pairing_note(tables.summarize(recs[:2])) == ""
    old = [{k: v for k, v in r.items() if k != "process"} for r in recs]  # records written before `process`
    assert tables.summarize(old).query("task == 'all' and method == 'fixed:x'").paired.iloc[0] == 2


def test_eval_records_carry_their_process_and_fingerprints(tmp_path):
    d = tmp_path / "p"
    evaluate.run(cfg_of("eval", QUICK), d)
    recs = jsonl(d / "examples.jsonl")
    assert len({r["process"] for r in recs}) == 1 and all(r["query_sha"] for r in recs)
    assert "paired" in pd.read_csv(d / "summary.csv").columns


# ------------------------------------------------------------------------ 11. cascades stopped before a baseline


def test_cascades_curves_of_a_run_stopped_before_a_tasks_baseline(cascade_run, tmp_path):
    """Repro: Ctrl-C at 12 of 27 generations: `ValueError: Encountered all NA values` in best_at_loss, no curves."""
    examples = [
        r
        for r in jsonl(cascade_run / "examples.jsonl")
        if not (r["task"] == "math" and r["method"] == "autoregressive")
    ]
    rounds = jsonl(cascade_run / "rounds.jsonl")
    table = cascade_curves.curves(examples, rounds)
    assert table[table.task == "math"].speedup.isna().all()
    best = cascade_curves.best_at_loss(table)
    assert "math" not in set(best.task)
    note = cascade_curves.closing_note(best, table)
    assert "not judged" in note and "math" in note.split("not judged")[1]

    class Stub:
        def examples(self):
            return examples

        def rounds(self):
            return rounds

    cascades.write_curves(Stub(), tmp_path, "tiny", "quantized", stopped=True)
    assert (tmp_path / "curves.csv").exists() and (tmp_path / "best.csv").exists()
    assert "not judged" in (tmp_path / "curves.md").read_text()


def test_a_typo_in_a_method_is_refused_before_any_model_loads(tmp_path, monkeypatch):
    """Issue 45 case 10: a typo in a tree member or a router's fallback was refused only after the target loaded."""
    from specbench.pipelines.session import core

    def never(*args, **kwargs):
        raise AssertionError("the session (target, pool) was opened before the methods were checked")

    monkeypatch.setattr(core.Session, "open", classmethod(never))
    for methods, problem in (
        ("methods=[tree:prompt_lookup+quantised]", "no arm named quantised"),
        ("methods=[selector]", "no drafter named 'suffx'"),
    ):
        extra = ["selector=budget", "selector.retrieval=suffx"] if methods == "methods=[selector]" else []
        with pytest.raises(SpecbenchError, match=problem):
            evaluate.run(cfg_of("eval", [*TWO[:-1], methods, *extra]), tmp_path / "e")
