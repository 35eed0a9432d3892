"""Full-information feedback: early-exit arms read their distribution off the target's own
verification forward, exactly as if they had run, and decoding stays lossless."""

from __future__ import annotations

import pytest
import torch

from specbench.decoding.drafter import DecodeContext
from specbench.decoding.verify import block_divergence
from specbench.selection import UCB
from specbench.selection.base import Selector

PROMPT = "The quick brown fox jumps over the lazy dog. The quick brown"


def test_exit_head_on_target_states_equals_the_truncated_model(tiny_setup):
    """head(norm(h_L)) over the target's layer-L states == the early-exit drafter's own logits."""
    target, drafter = tiny_setup.target, tiny_setup.pool["early_exit"]
    prompt = tiny_setup.tokenizer(PROMPT)["input_ids"]
    draft = [5, 9, 12]
    target.prefill(prompt)
    scores = target.score(draft, hidden=True)
    logits, states = scores.logits, scores.states
    layers = (
        target.config.num_decoder_layers if target.is_encoder_decoder else target.config.num_hidden_layers
    )
    assert len(states) == layers + 1
    read_off = drafter.logits_from_hidden(states[drafter.exit_layer])
    drafter.begin(DecodeContext(encoder_ids=target.encoder_ids))
    own = drafter.lm.forward(list(target.tokens) + draft)[-(len(draft) + 1) :]
    assert read_off.shape == own.shape == logits.shape
    torch.testing.assert_close(read_off, own, atol=1e-4, rtol=1e-4)
    assert not torch.allclose(read_off, logits, atol=1e-2)  # a real early exit, not the full model


class Recorder(Selector):
    """Plays ``arm`` every round and records side observations."""

    full_information = True

    def __init__(self, arms, arm):
        super().__init__(arms)
        self.arm, self.side = arm, []

    def select(self):
        return self.arm

    def observe(self, arm, bd):
        self.side.append((arm, bd))


def test_side_observations_arrive_every_drafting_round(tiny_setup, tiny_decode):
    prompt = tiny_setup.tokenizer(PROMPT)["input_ids"]
    rec = Recorder(list(tiny_setup.pool), "quantized_dynamic")
    gen = tiny_decode(tiny_setup.target, tiny_setup.pool, rec, prompt, max_new_tokens=20, draft_length=3)
    drafting = [r for r in gen.rounds if r.drafted > 0]
    assert [a for a, _ in rec.side] == ["early_exit"] * len(drafting)
    assert all(0.0 <= bd <= 1.0 for _, bd in rec.side)
    # the played early-exit arm gets its ordinary feedback, not a side observation
    rec_ee = Recorder(list(tiny_setup.pool), "early_exit")
    tiny_decode(tiny_setup.target, tiny_setup.pool, rec_ee, prompt, max_new_tokens=20, draft_length=3)
    assert rec_ee.side == []


def test_full_information_ucb_is_lossless(tiny_setup, tiny_decode):
    prompt = tiny_setup.tokenizer(PROMPT)["input_ids"]
    ref = tiny_decode(tiny_setup.target, tiny_setup.pool, "autoregressive", prompt, max_new_tokens=30)
    sel = UCB(list(tiny_setup.pool), full_information=True, beta=0.5)
    gen = tiny_decode(tiny_setup.target, tiny_setup.pool, sel, prompt, max_new_tokens=30, draft_length=3)
    assert gen.tokens == ref.tokens
    assert sel.counts[sel.candidates.index("early_exit")] > sum(r.arm == "early_exit" for r in gen.rounds)


def test_block_divergence_of_identical_distributions_is_one():
    p = torch.softmax(torch.randn(3, 11, generator=torch.Generator().manual_seed(0)), -1)
    assert abs(block_divergence([0, 1, 2], p[:3], p, 3) - 1.0) < 1e-6


def test_exits_sharing_a_head_are_batched_exactly(tiny_setup):
    """Two early exits over one LM head: the batched read-off equals each arm's own."""
    from specbench.decoding.drafter import Verification, observations
    from specbench.decoding.sampling import SamplingParams, logits_to_probs
    from specbench.drafters import build_pool

    exit_cfg = {
        "_target_": "specbench.drafters.early_exit.build",
        "layers": tiny_setup.pool["early_exit"].exit_layer,
        "layers_key": "num_decoder_layers" if tiny_setup.target.is_encoder_decoder else "num_hidden_layers",
        "final_norm": "decoder.final_layer_norm" if tiny_setup.target.is_encoder_decoder else "model.norm",
        "head_scale": 0.125 if tiny_setup.target.is_encoder_decoder else 1.0,
    }
    target = tiny_setup.target
    pool = build_pool(target, {"a": exit_cfg, "b": exit_cfg})
    target.prefill(tiny_setup.tokenizer(PROMPT)["input_ids"])
    draft = [3, 4, 5]
    scores = target.score(draft, hidden=True)
    logits, states = scores.logits, scores.states
    p = logits_to_probs(logits[:3], SamplingParams())
    layer = pool["a"].exit_layer
    seen = Verification(
        draft=draft,
        p=p,
        accepted=0,
        played="autoregressive",
        sampling=SamplingParams(),
        states={layer: states[layer]},
    )
    side = observations({name: pool[name] for name in ("a", "b")}, seen)
    assert (
        pool["a"].group == pool["b"].group and len(seen.shared) == 1
    )  # one batched head call for both exits
    own = block_divergence(
        draft,
        logits_to_probs(pool["a"].logits_from_hidden(states[pool["a"].exit_layer][:3]), SamplingParams()),
        p,
        3,
    )
    assert side["a"] == pytest.approx(own, abs=1e-6) and side["b"] == pytest.approx(own, abs=1e-6)


def test_prefill_embedding_equals_embed_and_keeps_decoding_exact(tiny_setup, tiny_decode):
    """The embedding read off the prefill is the standalone one, and the cache it leaves behind
    decodes exactly as a plain prefill does."""
    target = tiny_setup.target
    prompt = tiny_setup.tokenizer(PROMPT)["input_ids"]
    for pooling in ("mean", "last"):
        emb = target.prefill(prompt, embedding=pooling).embedding
        torch.testing.assert_close(emb, target.embed(prompt, pooling), atol=1e-5, rtol=1e-5)
        assert len(target.lm.cached) == len(target.tokens) - 1
        after = target.score([5, 6]).logits
        target.prefill(prompt)
        torch.testing.assert_close(after, target.score([5, 6]).logits, atol=1e-5, rtol=1e-5)
