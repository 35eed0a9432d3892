"""``specbench train-drafter`` on the tiny Llama target (in process, no download).

- on a seeded toy task where it must (held-out rows share their text with the training rows, and
  the head learns the target's own answers), the trained head agrees with the target far more
  often than an untrained head on held-out rows;
- an interrupted run resumes to exactly the weights of an uninterrupted one;
- the checkpoint directory holds what the docs promise, and loads as an ``eagle`` drafter;
- bad data (no usable rows) is a clear error.
"""

from __future__ import annotations

import json

import pytest
import torch
from hydra import compose, initialize_config_dir
from safetensors.torch import load_file

from specbench.configs import conf_dir
from specbench.errors import SpecbenchError
from specbench.pipelines import train_drafter

SENTENCE = "A farmer has twelve cows and buys five more cows at the market. How many cows are there now?"


@pytest.fixture(scope="module")
def toy_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("toy") / "toy.jsonl"
    rows = [{"question": f"Case {i}. {SENTENCE}", "answer": "#### 17"} for i in range(40)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def config(toy_file, out, *overrides):
    with initialize_config_dir(config_dir=conf_dir(), version_base=None):
        return compose(config_name="train_drafter", overrides=[
            "target=tiny_llama", "dataset=gsm8k", f"dataset.path={toy_file}", "dataset.limit=30",
            "train.responses=target", "train.max_new_tokens=12", "train.epochs=12", "train.lr=0.003",
            "train.val_examples=4", "drafter.vocab=120", f"out={out}",
            f"+eval_sets.toy={{format: gsm8k, task: math, path: {toy_file}, offset: 30, limit: 8}}",
            "~eval_sets.math", "~eval_sets.summarization", "~eval_sets.translation", "~eval_sets.chat",
            *overrides])


def test_trained_head_beats_an_untrained_one(toy_file, tmp_path):
    out = tmp_path / "head"
    train_drafter.run(config(toy_file, out), tmp_path / "run")
    for name in ("model.safetensors", "config.json", "history.csv", "metrics.json", "loss.png"):
        assert (out / name).exists(), name
    meta = json.loads((out / "config.json").read_text())["specbench"]
    assert meta["kind"] == "eagle" and meta["target"] == "embedded:tiny_llama" and meta["sub_vocabulary"] == 120
    assert meta["vocab"] and meta["epochs"] == 12 and meta["train_sequences"] > 0
    trained = json.loads((out / "metrics.json").read_text())["tasks"]["toy"]

    untrained_out = tmp_path / "untrained"
    train_drafter.run(config(toy_file, untrained_out, "train.epochs=0"), tmp_path / "run0")
    untrained = json.loads((untrained_out / "metrics.json").read_text())["tasks"]["toy"]
    assert trained["positions"] == untrained["positions"] > 0
    assert trained["top1"] > untrained["top1"] + 0.1, (trained, untrained)
    assert trained["expected_accepted"] > untrained["expected_accepted"]


def test_interrupted_run_resumes_to_the_same_weights(toy_file, tmp_path):
    whole, parts = tmp_path / "whole", tmp_path / "parts"
    train_drafter.run(config(toy_file, whole, "train.epochs=4"), tmp_path / "r1")
    train_drafter.run(config(toy_file, parts, "train.epochs=2"), tmp_path / "r2")  # "interrupted" after 2
    train_drafter.run(config(toy_file, parts, "train.epochs=4"), tmp_path / "r3")  # resumes at epoch 3
    a, b = load_file(str(whole / "model.safetensors")), load_file(str(parts / "model.safetensors"))
    assert a.keys() == b.keys()
    for k in a:
        torch.testing.assert_close(a[k], b[k], atol=0, rtol=0)


def test_no_usable_rows_is_a_clear_error(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"question": "q", "answer": ""}) + "\n")
    with pytest.raises(SpecbenchError, match="reference"):
        train_drafter.run(config(bad, tmp_path / "h", "train.responses=reference", "dataset.limit=null"), tmp_path / "r")
