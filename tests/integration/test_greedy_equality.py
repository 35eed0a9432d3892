"""The core guarantee: under greedy decoding every drafter, draft length and selector yields exactly
the target's autoregressive output, which itself equals Hugging Face ``generate``."""

from __future__ import annotations

import pytest
import torch

from specbench.selection.base import Selector

PROMPTS = [
    "The quick brown fox jumps over the lazy dog. The quick brown",
    "abc abc abc abc",
]
MAX_NEW = 40
ARMS = ["quantized_dynamic", "quantized_weight", "prompt_lookup", "early_exit", "hf"]


def prompt_ids(setup, text: str) -> list[int]:
    return setup.tokenizer(text)["input_ids"]


def hf_greedy(setup, ids: list[int], max_new_tokens: int) -> list[int]:
    x = torch.tensor([ids])
    with torch.inference_mode():
        out = setup.model.generate(
            x,
            attention_mask=torch.ones_like(x),
            do_sample=False,
            max_new_tokens=max_new_tokens,
            eos_token_id=setup.eos_id,
            pad_token_id=setup.tokenizer.pad_token_id,
        )
    out = out[0].tolist()
    if setup.target.is_encoder_decoder:
        assert out[0] == setup.model.config.decoder_start_token_id
        return out[1:]
    assert out[: len(ids)] == ids
    return out[len(ids) :]


@pytest.fixture(scope="module")
def reference(tiny_setup, tiny_decode):
    """Autoregressive outputs per prompt for the current family."""
    return {
        text: tiny_decode(
            tiny_setup.target,
            tiny_setup.pool,
            "autoregressive",
            prompt_ids(tiny_setup, text),
            max_new_tokens=MAX_NEW,
            draft_length=1,
        )
        for text in PROMPTS
    }


@pytest.mark.parametrize("text", PROMPTS)
def test_autoregressive_equals_hf_generate(tiny_setup, reference, text):
    gen = reference[text]
    expected = hf_greedy(tiny_setup, prompt_ids(tiny_setup, text), MAX_NEW)
    assert gen.tokens == expected
    # bookkeeping: one target call and one token per round; the limit is met exactly (no EOS here)
    assert gen.stop == "length" and len(gen.tokens) == MAX_NEW
    assert tiny_setup.eos_id not in gen.tokens
    assert gen.target_calls == len(gen.tokens) == len(gen.rounds)
    assert gen.drafted == 0 and gen.accepted == 0 and gen.switches == 0
    assert all(
        r.arm == "autoregressive" and r.n_max == 0 and r.be == 0.0 and r.emitted == 1 for r in gen.rounds
    )


@pytest.mark.parametrize("draft_length", [1, 3, 5])
@pytest.mark.parametrize("arm", ARMS)
def test_speculative_greedy_equals_autoregressive(tiny_setup, tiny_decode, reference, arm, draft_length):
    for text in PROMPTS:
        gen = tiny_decode(
            tiny_setup.target,
            tiny_setup.pool,
            arm,
            prompt_ids(tiny_setup, text),
            max_new_tokens=MAX_NEW,
            draft_length=draft_length,
        )
        assert gen.tokens == reference[text].tokens, (arm, draft_length, text)
        assert len(gen.tokens) == MAX_NEW and gen.stop == "length"
        assert gen.target_calls == len(gen.rounds)
        assert sum(r.emitted for r in gen.rounds) == MAX_NEW
        for r in gen.rounds:
            assert r.arm == arm
            assert 0 <= r.accepted <= r.drafted <= r.n_max <= draft_length
            assert r.emitted == r.accepted + 1  # no EOS: accepted prefix plus one target token
            assert r.be == pytest.approx(r.accepted / r.n_max if r.n_max else 0.0)
            assert 0.0 <= r.bd <= 1.0 + 1e-6
            assert not r.switched and (r.t_switch == 0.0 or (r.first_use and r.index == 0))
        # the last round never overshoots: its draft length was capped to leave room for the bonus token
        assert gen.target_calls <= MAX_NEW


def test_model_drafters_draft_every_round(tiny_setup, tiny_decode):
    """Model drafters always fill the draft (no EOS here): n_max == drafted == min(L, room)."""
    ids = prompt_ids(tiny_setup, PROMPTS[0])
    for arm in ("quantized_weight", "hf", "early_exit"):
        gen = tiny_decode(
            tiny_setup.target, tiny_setup.pool, arm, ids, max_new_tokens=MAX_NEW, draft_length=3
        )
        produced = 0
        for r in gen.rounds:
            assert r.drafted == r.n_max == min(3, MAX_NEW - produced - 1)
            produced += r.emitted


def test_quantized_drafter_is_accepted_often(tiny_setup, tiny_decode):
    """A sanity check that speculation actually happens (and fewer target calls are needed)."""
    ids = prompt_ids(tiny_setup, PROMPTS[0])
    gen = tiny_decode(
        tiny_setup.target, tiny_setup.pool, "quantized_weight", ids, max_new_tokens=MAX_NEW, draft_length=5
    )
    assert gen.accepted > MAX_NEW // 4
    assert gen.target_calls < MAX_NEW


class Cycle(Selector):
    """Plays the arms in order, one per round, and records what it was told."""

    def __init__(self, arms):
        super().__init__(arms)
        self.i = 0
        self.feedback = []
        self.resets = 0

    def reset(self, query=None):
        self.i = 0
        self.resets += 1

    def select(self):
        arm = self.arms[self.i % len(self.arms)]
        self.i += 1
        return arm

    def update(self, arm, feedback):
        self.feedback.append((arm, feedback))


@pytest.mark.parametrize("draft_length", [2, 4])
def test_switching_every_round_equals_autoregressive(tiny_setup, tiny_decode, reference, draft_length):
    arms = ["autoregressive", *ARMS, "hf", "hf"]  # includes a repeat: not a switch
    for text in PROMPTS:
        selector = Cycle(arms)
        gen = tiny_decode(
            tiny_setup.target,
            tiny_setup.pool,
            selector,
            prompt_ids(tiny_setup, text),
            max_new_tokens=MAX_NEW,
            draft_length=draft_length,
        )
        assert gen.tokens == reference[text].tokens
        assert selector.resets == 1
        assert [r.arm for r in gen.rounds] == [arms[i % len(arms)] for i in range(len(gen.rounds))]
        assert [a for a, _ in selector.feedback] == [r.arm for r in gen.rounds]
        assert gen.switches > 0
        assert gen.target_calls == len(gen.rounds)
        for i, r in enumerate(gen.rounds):
            assert r.switched == (i > 0 and gen.rounds[i - 1].arm != r.arm)
            if r.switched or r.first_use:  # switching cost, or the drafter's per-query setup
                assert r.t_switch > 0.0  # the catch-up (or setup) was timed
            else:
                assert r.t_switch == 0.0
            assert min(r.t_draft, r.t_verify, r.t_select) > 0.0  # each phase was read off the clock
            if r.arm == "autoregressive":
                assert r.drafted == 0 and r.n_max == 0
        assert gen.switches == sum(
            1 for i in range(1, len(gen.rounds)) if gen.rounds[i].arm != gen.rounds[i - 1].arm
        )
        # the phases are disjoint readings inside the generation's timed region: no phase counted twice
        assert sum(r.t_select + r.t_draft + r.t_verify + r.t_switch for r in gen.rounds) <= gen.seconds


def eos_candidates(tokens: list[int], first_pos: int = 3, how_many: int = 4) -> list[tuple[int, int]]:
    """(position, token) pairs where the token first appears at that position (>= first_pos)."""
    out = []
    for pos in range(first_pos, len(tokens)):
        if tokens[pos] not in tokens[:pos]:
            out.append((pos, tokens[pos]))
        if len(out) == how_many:
            break
    return out


def test_eos_inside_a_draft(tiny_setup, tiny_decode, reference):
    text = PROMPTS[0]
    ids = prompt_ids(tiny_setup, text)
    ar = reference[text].tokens
    candidates = eos_candidates(ar)
    assert candidates, "the reference output has no fresh token after position 3"
    inside_draft = 0
    for pos, eos in candidates:
        expected = ar[: pos + 1]
        ar_eos = tiny_decode(
            tiny_setup.target, tiny_setup.pool, "autoregressive", ids, max_new_tokens=MAX_NEW, eos_ids={eos}
        )
        assert ar_eos.tokens == expected and ar_eos.stop == "eos"
        assert ar_eos.target_calls == len(expected)
        for arm in ("quantized_weight", "quantized_dynamic", "prompt_lookup"):
            for draft_length in (3, 5):
                gen = tiny_decode(
                    tiny_setup.target,
                    tiny_setup.pool,
                    arm,
                    ids,
                    max_new_tokens=MAX_NEW,
                    draft_length=draft_length,
                    eos_ids={eos},
                )
                assert gen.tokens == expected, (arm, draft_length, pos)
                assert gen.stop == "eos"
                assert gen.target_calls == len(gen.rounds)
                last = gen.rounds[-1]
                assert sum(r.emitted for r in gen.rounds) == len(expected)
                assert last.accepted <= last.emitted
                if last.accepted >= 1 and last.emitted <= last.accepted:
                    inside_draft += 1  # EOS was an accepted draft token: the bonus token was dropped
    assert inside_draft > 0, "no run had its EOS inside an accepted draft"


def test_max_new_tokens_is_exact(tiny_setup, tiny_decode, reference):
    ids = prompt_ids(tiny_setup, PROMPTS[0])
    full = reference[PROMPTS[0]].tokens
    for n in (1, 2, 7):
        for arm in ("autoregressive", "quantized_weight", "prompt_lookup"):
            gen = tiny_decode(tiny_setup.target, tiny_setup.pool, arm, ids, max_new_tokens=n, draft_length=5)
            assert gen.tokens == full[:n]
            assert gen.stop == "length"
            assert gen.target_calls == len(gen.rounds)
            if n == 1:
                assert gen.rounds[0].drafted == 0  # no room for a draft next to the bonus token
