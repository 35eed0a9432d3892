"""Outputs certified lossless up to rounding, on a bfloat16 tiny Llama (decoding/certify.py).

- the tie tolerance is calibrated on the target itself (``certify.calibrate``: one-token steps against
  5-token forwards over the same tokens), as the product's tolerance is for SmolLM2;
- every fork of a lossless drafter's greedy output from the autoregressive output is a tie;
- a deliberately broken verifier (it accepts one draft token too many) is caught: its forks are defects;
- in float32 there is no fork at all;
- the baseline does no drafter work: with a head in the pool, autoregressive decoding asks the target
  for no hidden state (counted), while playing the head does.
"""

from __future__ import annotations

import pytest
import torch

from specbench.decoding import certify, rounds
from specbench.decoding.verify import Verdict, verify_greedy
from specbench.drafters import build_pool
from specbench.models import Target, load_model
from specbench.pipelines import forks

# Prompts of the byte-level tiny tokenizer; repetitive text gives prompt lookup and early exits drafts to verify.
PROMPTS = [
    f"Question {i}: the cat sat on the mat, the dog sat on the log, and the {w}"
    for i, w in enumerate(["bird", "fish", "frog", "cow", "hen", "pig", "fox", "owl"])
]
NEW_TOKENS = 64


@pytest.fixture(scope="module")
def bf16_llama():
    target = Target(load_model("embedded:tiny_llama", dtype="bfloat16", device="cpu"))
    pool = build_pool(
        target,
        {
            "prompt_lookup": {"_target_": "specbench.drafters.prompt_lookup.build"},
            "early_exit": {"_target_": "specbench.drafters.early_exit.build", "layers": 1},
        },
    )
    # Near-ties are rare (about 1 position in 800 forks between a 5-token forward and one-token steps on
    # this model), so the fork test needs a few thousand positions: 48 seeded random prompts of 30 ids.
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(3, 250, (30,), generator=g).tolist() for _ in range(48)]
    return target, pool, prompts


def records(target, pool, prompts, arm, tiny_decode, tolerance):
    out = []
    for i, ids in enumerate(prompts):
        gen = tiny_decode(target, pool, arm, ids, max_new_tokens=NEW_TOKENS, eos_ids=frozenset())
        out.append(
            {
                "query_id": f"q{i}",
                "task": "t",
                "method": arm,
                "output_ids": gen.tokens,
                "deciders": gen.deciders,
                "tie_tolerance": tolerance,
            }
        )
    return out


@pytest.mark.slow  # 25 s: the bf16 calibration end to end (make test-slow)
def test_calibrated_bf16_forks_are_all_ties(bf16_llama, tiny_decode):
    target, pool, prompts = bf16_llama
    cal = certify.calibrate(target, prompts[:16], new_tokens=NEW_TOKENS, chunk=5)
    assert cal["max_abs"] > 0  # bf16: chunked forwards do round differently
    tol = cal["max_abs"]
    base = records(target, pool, prompts, "autoregressive", tiny_decode, tol)
    verdicts = []
    for arm in ("prompt_lookup", "early_exit"):
        verdicts += [
            f for f in forks.forks(base + records(target, pool, prompts, arm, tiny_decode, tol)).verdict
        ]
    assert verdicts, "no fork at all: the test would not see a defect either (more prompts or tokens needed)"
    assert set(verdicts) == {certify.TIE}


def test_a_verifier_that_accepts_one_token_too_many_is_a_defect(bf16_llama, tiny_decode, monkeypatch):
    target, pool, prompts = bf16_llama
    tol = certify.calibrate(target, prompts[:4], new_tokens=16, chunk=5)["max_abs"]
    prompts = prompts[:8]
    base = records(target, pool, prompts, "autoregressive", tiny_decode, tol)

    def too_generous(draft, logits):
        right = verify_greedy(draft, logits)
        if right.accepted < len(draft):  # keep the first rejected draft token as if it had been accepted
            n = right.accepted + 1
            return Verdict(accepted=n, tokens=list(draft[:n]) + [int(torch.argmax(logits[n]))])
        return right

    monkeypatch.setattr(rounds, "verify_greedy", too_generous)
    broken = records(target, pool, prompts, "early_exit", tiny_decode, tol)
    verdicts = list(forks.forks(base + broken).verdict)
    assert verdicts and set(verdicts) == {certify.DEFECT}


def test_float32_outputs_do_not_fork(tiny_llama_target, tiny_llama_pool, tiny_decode):
    target, pool = tiny_llama_target, tiny_llama_pool
    prompts = [target.tokenizer(p)["input_ids"] for p in PROMPTS[:4]]
    tol = certify.DEFAULT_TOLERANCE["float32"]
    base = records(target, pool, prompts, "autoregressive", tiny_decode, tol)
    for arm in ("prompt_lookup", "early_exit", "quantized_weight"):
        mine = records(target, pool, prompts, arm, tiny_decode, tol)
        assert [r["output_ids"] for r in mine] == [r["output_ids"] for r in base]
        assert forks.forks(base + mine).empty
        # every output position has its decider row, whose top token is the token emitted
        for r in mine:
            assert len(r["deciders"]) == len(r["output_ids"])
            assert [int(d[0][0]) for d in r["deciders"]] == r["output_ids"]


class CountingTarget(Target):
    """A target that counts the forwards asked to return hidden states."""

    state_calls = 0

    def score(self, draft, hidden=False, layers=()):
        self.state_calls += bool(hidden or layers)
        return super().score(draft, hidden=hidden, layers=layers)

    def prefill(self, prompt_ids, embedding=None, layers=()):
        self.state_calls += bool(layers)
        return super().prefill(prompt_ids, embedding=embedding, layers=layers)


def test_autoregressive_baseline_asks_no_hidden_states_with_a_head_in_the_pool(tmp_path, tiny_decode):
    from tests.integration.test_eagle import write_head

    target = CountingTarget(load_model("embedded:tiny_llama", device="cpu"))
    head = write_head(tmp_path, target)
    pool = build_pool(
        target,
        {
            "eagle": {"_target_": "specbench.drafters.eagle.build", "checkpoint": str(head)},
            "prompt_lookup": {"_target_": "specbench.drafters.prompt_lookup.build"},
        },
    )
    ids = target.tokenizer(PROMPTS[0])["input_ids"]
    for arm in ("autoregressive", "prompt_lookup"):
        target.state_calls = 0
        tiny_decode(target, pool, arm, ids, max_new_tokens=24)
        assert target.state_calls == 0, arm
    target.state_calls = 0
    gen = tiny_decode(target, pool, "eagle", ids, max_new_tokens=24)
    assert target.state_calls == len(gen.rounds) + 1  # the prefill and every verification forward
