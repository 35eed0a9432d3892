"""Training for depth (issue 20, item 2): ``train.unroll`` (EAGLE-3's training-time test) and
``train.feature_noise`` (EAGLE-1) for eagle heads, and agreement by draft depth in ``metrics.json``.

On a seeded toy task where it must (the tiny Llama target, three distinct prompts repeated, so the
held-out rows are texts the head has seen, and the target's own greedy answers): a head trained with
``train.unroll=3`` drafts far better at depth 3 than one trained with ``train.unroll=1``, everything
else equal; ``train.unroll=1`` reproduces the training from before unrolling existed, weight for
weight; the new keys are part of the resume signature; feature noise is seeded (a resumed run
draws the same noise). Runtime: ~10 s.
"""

from __future__ import annotations

import hashlib
import json

import pytest
import torch
from safetensors.torch import load_file

from specbench.errors import SpecbenchError
from specbench.pipelines import train_drafter
from specbench.training.fit import lr_factor
from tests.integration.test_train_drafter import SENTENCE, config

# sha256 over (key, float32 bytes) of model.safetensors, keys sorted, for ``depth_config(toy, out)`` with
# the defaults (unroll=1, no noise). Captured with the code BEFORE train.unroll / train.feature_noise
# were added (commit 2c37c60, a copy of the package run in /tmp), torch 2.13.0+cpu, transformers 5.24.0,
# x86_64, OMP_NUM_THREADS=1, the tiny Llama and the math prompt template of that commit; the unrolling code
# reproduced it unchanged. Another torch build or CPU may round differently: recapture it there with the code
# of that commit. Recaptured for the batched teacher pass (distill.teach_all: the top-k as exp(logit - logsumexp)
# over a batch, which rounds the teacher's probabilities differently in the last bits): with the one-sequence
# teacher of commit fc0aa30 put back, the training code of that commit still gives the first checksum,
# a2bd849df39494517fa6a84d1d5236d89a91f06e15e152fbd7a799ff68e5b0bc, so only the teacher's bits moved.
BEFORE_UNROLL_SHA256 = "834a725f828d846adeebd4150278c6a510f1dcde8a28ccc387ec2c12e272be6d"
CAPTURED_WITH = (
    "2.13.0+cpu",
    "5.24.0",
    "x86_64",
    "Intel(R) Xeon(R) Processor",
)  # the last: /proc/cpuinfo's model name


@pytest.fixture(scope="module")
def toy(tmp_path_factory):
    path = tmp_path_factory.mktemp("depth") / "toy.jsonl"
    rows = [{"question": f"Case {i % 3}. {SENTENCE}", "answer": "#### 17"} for i in range(40)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def depth_config(toy, out, *overrides):
    return config(toy, out, "train.epochs=12", "train.max_new_tokens=24", *overrides)


def digest(path) -> str:
    sd = load_file(str(path / "model.safetensors"))
    h = hashlib.sha256()
    for k in sorted(sd):
        h.update(k.encode())
        h.update(sd[k].contiguous().numpy().tobytes())
    return h.hexdigest()


@pytest.fixture(scope="module")
def heads(toy, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("heads")
    out = {}
    for unroll in (1, 3):
        out[unroll] = tmp / f"u{unroll}"
        train_drafter.run(depth_config(toy, out[unroll], f"train.unroll={unroll}"), tmp / f"run{unroll}")
    return out


def test_unroll_1_is_the_training_from_before(heads):
    import platform

    import transformers

    from specbench.pipelines.profile import cpu_name

    here = (torch.__version__, transformers.__version__, platform.machine(), cpu_name())
    if (
        here != CAPTURED_WITH
    ):  # bitwise training results are only comparable on the build they were captured on
        pytest.skip(
            f"the checksum was captured with torch/transformers/machine/CPU {CAPTURED_WITH}, this is {here} "
            "(an AMD EPYC of the same ISA rounds the training differently in the last bits)"
        )
    assert digest(heads[1]) == BEFORE_UNROLL_SHA256


def test_unrolled_head_drafts_better_at_depth(heads):
    m1, m3 = (json.loads((heads[u] / "metrics.json").read_text()) for u in (1, 3))
    for m in (m1, m3):
        assert {"top1_by_depth", "accept_by_depth"} <= set(m["definitions"])
        for rows in (m["validation"], m["tasks"]["toy"]):
            assert len(rows["top1_by_depth"]) == len(rows["accept_by_depth"]) == 5
            assert rows["accept_by_depth"][0] == rows["top1_by_depth"][0] == pytest.approx(rows["top1"])
            assert all(a >= b for a, b in zip(rows["accept_by_depth"], rows["accept_by_depth"][1:]))
    print("unroll=1", m1["validation"]["accept_by_depth"], m1["tasks"]["toy"]["accept_by_depth"])
    print("unroll=3", m3["validation"]["accept_by_depth"], m3["tasks"]["toy"]["accept_by_depth"])
    for part in ("validation", "toy"):
        a = m1["validation"] if part == "validation" else m1["tasks"]["toy"]
        b = m3["validation"] if part == "validation" else m3["tasks"]["toy"]
        assert b["accept_by_depth"][2] > a["accept_by_depth"][2] + 0.2, (part, a, b)
        assert b["top1_by_depth"][2] > a["top1_by_depth"][2], (part, a, b)
    meta = json.loads((heads[3] / "config.json").read_text())["specbench"]
    assert meta["unroll"] == 3 and meta["feature_noise"] == 0.0


def test_unroll_and_noise_are_in_the_resume_signature(toy, heads, tmp_path):
    for other in (
        ("train.unroll=2",),
        ("train.feature_noise=0.1",),
        ("train.unroll=3", "train.unroll_weights=[1,0.5,0.25]"),
    ):
        with pytest.raises(SpecbenchError, match="another config"):
            train_drafter.run(depth_config(toy, heads[1], *other), tmp_path / "r")
    # a checkpoint whose signature predates the new keys resumes when they are at their old behaviour
    sig = json.loads((heads[1] / "signature.json").read_text())
    old = {**sig, "train": {k: v for k, v in sig["train"].items() if k not in train_drafter.LATER_TRAIN_KEYS}}
    assert train_drafter.same_signature(old, sig)
    cfg = depth_config(toy, heads[1], "train.unroll=2")
    assert not train_drafter.same_signature(old, train_drafter.signature(cfg))


def test_feature_noise_is_seeded_and_resumes(toy, heads, tmp_path):
    noisy = ("train.feature_noise=0.2", "train.unroll=2", "train.unroll_weights=[1.0,0.5]")
    whole, parts = tmp_path / "whole", tmp_path / "parts"
    train_drafter.run(depth_config(toy, whole, *noisy, "train.epochs=3"), tmp_path / "r1")
    train_drafter.run(depth_config(toy, parts, *noisy, "train.epochs=1"), tmp_path / "r2")
    train_drafter.run(depth_config(toy, parts, *noisy, "train.epochs=3"), tmp_path / "r3")
    a, b = load_file(str(whole / "model.safetensors")), load_file(str(parts / "model.safetensors"))
    for k in a:
        torch.testing.assert_close(a[k], b[k], atol=0, rtol=0)
    clean = tmp_path / "clean"
    train_drafter.run(depth_config(toy, clean, *noisy[1:], "train.epochs=3"), tmp_path / "r4")
    assert digest(clean) != digest(whole)  # the noise does change the training


def test_bad_depth_settings_are_refused(toy, tmp_path):
    from specbench.pipelines.keys import check as validate

    for bad in ("train.unroll=0", "train.feature_noise=-0.1", "train.unroll_weights=[1,-1]"):
        with pytest.raises(SpecbenchError, match=bad.split("=")[0]):
            validate(depth_config(toy, tmp_path / "x", bad), "train_drafter")
    with pytest.raises(SpecbenchError, match="unroll_weights"):
        train_drafter.run(
            depth_config(toy, tmp_path / "y", "train.unroll=3", "train.unroll_weights=[1,1]"), tmp_path / "r"
        )


def test_lr_factor_is_a_pure_schedule():
    assert [lr_factor("constant", s, 4) for s in range(4)] == [1.0] * 4
    assert [lr_factor("linear", s, 4) for s in range(4)] == [1.0, 0.75, 0.5, 0.25]


def test_linear_schedule_resumes_to_the_whole_run_and_signs_its_epochs(toy, heads, tmp_path):
    """A decaying rate changes the weights; a run interrupted after an epoch (here by a time budget) resumes on
    the same schedule to the same weights; the epoch count sets the schedule, so another count is refused."""
    linear = ("train.lr_schedule=linear", "train.epochs=3")
    whole, parts = tmp_path / "whole", tmp_path / "parts"
    train_drafter.run(depth_config(toy, whole, *linear), tmp_path / "r1")
    train_drafter.run(depth_config(toy, parts, *linear, "train.time_budget_s=1e-9"), tmp_path / "r2")
    assert json.loads((parts / "config.json").read_text())["specbench"]["epochs"] == 1
    train_drafter.run(depth_config(toy, parts, *linear), tmp_path / "r3")
    a, b = load_file(str(whole / "model.safetensors")), load_file(str(parts / "model.safetensors"))
    for k in a:
        torch.testing.assert_close(a[k], b[k], atol=0, rtol=0)
    constant = tmp_path / "constant"
    train_drafter.run(depth_config(toy, constant, "train.epochs=3"), tmp_path / "r4")
    assert digest(constant) != digest(whole)
    assert json.loads((whole / "config.json").read_text())["specbench"]["lr_schedule"] == "linear"
    with pytest.raises(SpecbenchError, match="another config"):
        train_drafter.run(
            depth_config(toy, whole, "train.lr_schedule=linear", "train.epochs=4"), tmp_path / "r5"
        )
    with pytest.raises(SpecbenchError, match="lr_schedule"):
        train_drafter.run(depth_config(toy, tmp_path / "bad", "train.lr_schedule=cosine"), tmp_path / "r6")
