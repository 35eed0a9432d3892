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
        return compose(
            config_name="train_drafter",
            overrides=[
                "target=tiny_llama",
                "dataset=gsm8k",
                f"dataset.path={toy_file}",
                "dataset.limit=30",
                "train.responses=target",
                "train.max_new_tokens=12",
                "train.epochs=12",
                "train.lr=0.003",
                "train.val_examples=4",
                "drafter.vocab=120",
                f"out={out}",
                f"+eval_sets.toy={{format: gsm8k, task: math, path: {toy_file}, offset: 30, limit: 8}}",
                "~eval_sets.math",
                "~eval_sets.summarization",
                "~eval_sets.translation",
                "~eval_sets.chat",
                "~eval_sets.code",
                *overrides,
            ],
        )


def test_trained_head_beats_an_untrained_one(toy_file, tmp_path):
    out = tmp_path / "head"
    train_drafter.run(config(toy_file, out), tmp_path / "run")
    for name in ("model.safetensors", "config.json", "history.csv", "metrics.json", "loss.png"):
        assert (out / name).exists(), name
    meta = json.loads((out / "config.json").read_text())["specbench"]
    assert (
        meta["kind"] == "eagle" and meta["target"] == "embedded:tiny_llama" and meta["sub_vocabulary"] == 120
    )
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
    # issue 34: fewer epochs than done would export the longer training under the shorter recipe
    with pytest.raises(SpecbenchError, match="trained for 4 epochs; train.epochs=2 asks for fewer") as err:
        train_drafter.run(config(toy_file, parts, "train.epochs=2"), tmp_path / "r4")
    assert "train.epochs=4" in err.value.fix
    # a decaying schedule's horizon is part of the recipe: the refusal names the key that changed
    train_drafter.run(
        config(toy_file, tmp_path / "lin", "train.epochs=1", "train.lr_schedule=linear"), tmp_path / "r5"
    )
    with pytest.raises(SpecbenchError, match=r"train.epochs: 1 -> 2"):
        train_drafter.run(
            config(toy_file, tmp_path / "lin", "train.epochs=2", "train.lr_schedule=linear"), tmp_path / "r6"
        )


def test_no_usable_rows_is_a_clear_error(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"question": "q", "answer": ""}) + "\n")
    with pytest.raises(SpecbenchError, match="reference"):
        train_drafter.run(
            config(bad, tmp_path / "h", "train.responses=reference", "dataset.limit=null"), tmp_path / "r"
        )


# ---- drafter.kind=hf: fine-tuning an existing small model (the black-box case) --------------------------


def hf_config(toy_file, out, *overrides, target="tiny_llama", draft="embedded:tiny_llama_draft"):
    return config(
        toy_file,
        out,
        f"target={target}",
        "drafter.kind=hf",
        f"drafter.model={draft}",
        "train.lr=0.01",
        "train.epochs=10",
        "drafter.vocab=null",
        "train.batch_size=4",
        *overrides,
    )


@pytest.mark.parametrize("family,loss,epochs", [("llama", "kl", 10), ("llama", "ce", 10), ("t5", "ce", 20)])
def test_fine_tuned_drafter_beats_its_base_model(toy_file, tmp_path, family, loss, epochs):
    """Decoder-only and encoder-decoder, both losses: held-out agreement with the target rises well
    above the base model's (epochs=0: the base model's own agreement, same held-out rows)."""
    target, draft = f"tiny_{family}", f"embedded:tiny_{family}_draft"
    out, base = tmp_path / "ft", tmp_path / "base"
    train_drafter.run(
        hf_config(toy_file, out, f"train.loss={loss}", f"train.epochs={epochs}", target=target, draft=draft),
        tmp_path / "r",
    )
    train_drafter.run(
        hf_config(toy_file, base, "train.epochs=0", target=target, draft=draft), tmp_path / "r0"
    )
    for name in ("model.safetensors", "config.json", "specbench.json", "history.csv", "metrics.json"):
        assert (out / name).exists(), name
    meta = json.loads((out / "specbench.json").read_text())
    assert meta["kind"] == "hf" and meta["base_model"] == draft and meta["target"] == f"embedded:{target}"
    assert meta["loss"] == loss and meta["epochs"] == epochs and meta["vocab"]
    tuned = json.loads((out / "metrics.json").read_text())["tasks"]["toy"]
    before = json.loads((base / "metrics.json").read_text())["tasks"]["toy"]
    assert tuned["positions"] == before["positions"] > 0
    assert tuned["top1"] > before["top1"] + 0.1, (tuned, before)
    assert tuned["expected_accepted"] > before["expected_accepted"]


def test_fine_tuned_drafter_decodes_losslessly_and_refuses_another_target(
    toy_file, tmp_path, tiny_llama_target, tiny_decode
):
    from specbench.decoding.drafter import AUTOREGRESSIVE, AutoregressiveArm
    from specbench.drafters.hf import build

    out = tmp_path / "ft"
    train_drafter.run(hf_config(toy_file, out, "train.loss=ce", "train.epochs=10"), tmp_path / "r")
    drafter = build(tiny_llama_target, "ft", model=str(out))
    pool = {AUTOREGRESSIVE: AutoregressiveArm(), "ft": drafter}
    prompt = tiny_llama_target.tokenizer(f"Case 99. {SENTENCE}")["input_ids"]
    ar = tiny_decode(tiny_llama_target, pool, AUTOREGRESSIVE, prompt, max_new_tokens=24)
    sd = tiny_decode(tiny_llama_target, pool, "ft", prompt, max_new_tokens=24)
    assert sd.tokens == ar.tokens and sd.accepted > 0

    meta = json.loads((out / "specbench.json").read_text())
    (out / "specbench.json").write_text(
        json.dumps({**meta, "target": "lmsys/vicuna-7b-v1.3", "vocab": "0123456789abcdef"})
    )
    with pytest.raises(SpecbenchError, match="vicuna-7b-v1.3") as err:
        build(tiny_llama_target, "ft", model=str(out))
    assert "tiny_llama" in err.value.problem


def test_fine_tuning_resumes_to_the_same_weights(toy_file, tmp_path):
    whole, parts = tmp_path / "whole", tmp_path / "parts"
    train_drafter.run(hf_config(toy_file, whole, "train.epochs=4"), tmp_path / "r1")
    train_drafter.run(hf_config(toy_file, parts, "train.epochs=2"), tmp_path / "r2")
    train_drafter.run(hf_config(toy_file, parts, "train.epochs=4"), tmp_path / "r3")
    a, b = load_file(str(whole / "model.safetensors")), load_file(str(parts / "model.safetensors"))
    assert a.keys() == b.keys()
    for k in a:
        torch.testing.assert_close(a[k], b[k], atol=0, rtol=0)


def test_hf_kind_needs_a_compatible_model(toy_file, tmp_path):
    with pytest.raises(SpecbenchError, match="drafter.model"):
        train_drafter.run(config(toy_file, tmp_path / "a", "drafter.kind=hf"), tmp_path / "r")
    with pytest.raises(SpecbenchError, match="not decoder-only"):
        train_drafter.run(
            hf_config(toy_file, tmp_path / "b", draft="embedded:tiny_t5_draft"), tmp_path / "r2"
        )


def test_missing_cached_drafter_names_what_builds_it(tiny_llama_target, tmp_path, monkeypatch):
    from specbench.drafters.hf import build

    monkeypatch.setenv("SPECBENCH_CACHE", str(tmp_path))
    with pytest.raises(SpecbenchError) as err:
        build(tiny_llama_target, "x", model="cache:drafters/nope", make_target="make specialists-hf")
    assert "make specialists-hf" in err.value.fix


# ---- drafter.kind=small: a standalone small drafter made from the target -------------------------------


def small_config(toy_file, out, *overrides):
    return config(
        toy_file,
        out,
        "drafter.kind=small",
        "drafter.layers=2",
        "drafter.vocab=120",
        "train.lr=0.003",
        "train.batch_size=4",
        *overrides,
    )


def test_small_drafter_trains_decodes_losslessly_and_resumes(
    toy_file, tmp_path, tiny_llama_target, tiny_decode
):
    """Trained from the target's first layers, it agrees with the target far more than before training (epochs=0:
    the untrained exit on the sub-vocabulary); it generates alone from token ids (its own KV cache), decodes
    losslessly in fp32, an interrupted run resumes to the same weights, and only its own tensors are saved."""
    from specbench.decoding.drafter import AUTOREGRESSIVE, AutoregressiveArm
    from specbench.drafters.small import build

    out, base, parts = tmp_path / "small", tmp_path / "base", tmp_path / "parts"
    train_drafter.run(small_config(toy_file, out, "train.epochs=6"), tmp_path / "r")
    train_drafter.run(small_config(toy_file, base, "train.epochs=0"), tmp_path / "r0")
    tuned = json.loads((out / "metrics.json").read_text())["tasks"]["toy"]
    before = json.loads((base / "metrics.json").read_text())["tasks"]["toy"]
    assert tuned["positions"] == before["positions"] > 0
    assert tuned["top1"] > before["top1"] + 0.1, (tuned, before)
    saved = load_file(str(out / "model.safetensors"))
    assert set(saved) == {"d2t", "norm.weight"} | {k for k in saved if k.startswith("layers.")}
    assert not any(k.startswith("layers.2.") for k in saved) and len(saved["d2t"]) == 120
    assert json.loads((out / "config.json").read_text())["specbench"]["kind"] == "small"

    drafter = build(tiny_llama_target, "small", checkpoint=str(out))
    assert 0 < drafter.cost < 1
    pool = {AUTOREGRESSIVE: AutoregressiveArm(), "small": drafter}
    prompt = tiny_llama_target.tokenizer(f"Case 99. {SENTENCE}")["input_ids"]
    ar = tiny_decode(tiny_llama_target, pool, AUTOREGRESSIVE, prompt, max_new_tokens=24)
    sd = tiny_decode(tiny_llama_target, pool, "small", prompt, max_new_tokens=24)
    assert sd.tokens == ar.tokens and sd.accepted > 0

    train_drafter.run(small_config(toy_file, parts, "train.epochs=3"), tmp_path / "r2")
    train_drafter.run(small_config(toy_file, parts, "train.epochs=6"), tmp_path / "r3")
    resumed = load_file(str(parts / "model.safetensors"))
    for k in saved:
        torch.testing.assert_close(saved[k], resumed[k], atol=0, rtol=0)


def test_small_drafter_refuses_another_kind_of_checkpoint(toy_file, tmp_path, tiny_llama_target):
    from specbench.drafters.small import build

    out = tmp_path / "head"
    train_drafter.run(config(toy_file, out, "train.epochs=1"), tmp_path / "r")  # an eagle head
    with pytest.raises(SpecbenchError, match="not a small-drafter checkpoint"):
        build(tiny_llama_target, "small", checkpoint=str(out))
    with pytest.raises(SpecbenchError, match="no checkpoint"):
        build(tiny_llama_target, "small")


def test_small_drafter_generates_alone_through_the_loop(tiny_llama_target, tiny_decode):
    """Its own module as a target (the cascades' "drafter alone" row): the loop's autoregressive generation equals
    its greedy chain of drafts, token for token, and stays inside its sub-vocabulary."""
    from specbench.decoding.drafter import AUTOREGRESSIVE, AutoregressiveArm, DecodeContext
    from specbench.decoding.sampling import SamplingParams
    from specbench.drafters.base import ModelDrafter
    from specbench.drafters.small import SmallLM
    from specbench.pipelines.session.core import alone_target

    d2t = torch.arange(0, tiny_llama_target.vocab_size, 3)
    drafter = ModelDrafter(
        "small", SmallLM(tiny_llama_target, 2, d2t).eval(), tiny_llama_target.vocab_size, 0.1
    )
    own = alone_target(drafter, tiny_llama_target)
    assert own.vocab_size == tiny_llama_target.vocab_size
    prompt = tiny_llama_target.tokenizer(f"Case 7. {SENTENCE}")["input_ids"]
    alone = tiny_decode(
        own,
        {AUTOREGRESSIVE: AutoregressiveArm()},
        AUTOREGRESSIVE,
        prompt,
        max_new_tokens=12,
        eos_ids=frozenset(),
    ).tokens
    drafter.begin(DecodeContext())
    chain = drafter.propose(list(prompt), 12, SamplingParams(), torch.Generator().manual_seed(0)).tokens
    assert alone == chain and set(alone) <= set(d2t.tolist())
