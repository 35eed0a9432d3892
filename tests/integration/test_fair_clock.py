"""Fair clocks: a generation times only the work of the arms it plays.

- an autoregressive generation does no drafter work (no reset, sync or propose of any drafter);
- a drafter is touched only in the rounds that play it, and starts a query lazily, once;
- on an encoder-decoder target, autoregressive decoding runs one encoder pass however many model
  drafters the pool holds, and an early exit reuses the target's encoder output;
- the verification hook asks the target for hidden states only when some drafter wants them;
- a generation synchronises the device once at each end unless per-phase timing is asked for.
"""

from __future__ import annotations

import torch

from specbench.decoding.drafter import AUTOREGRESSIVE, Draft, Drafter
from specbench.drafters import build_pool
from specbench.selection import UCB
from specbench.selection.base import Selector

PROMPT = "The quick brown fox jumps over the lazy dog. The quick brown"


class Counting(Drafter):
    """Drafts a fixed token and counts every call the loop makes to it."""

    def __init__(self, name="counting"):
        self.name = name
        self.calls = {"begin": 0, "catch_up": 0, "propose": 0, "observe": 0}

    def begin(self, query):
        self.calls["begin"] += 1

    def catch_up(self, tokens):
        self.calls["catch_up"] += 1

    def propose(self, tokens, k, sampling, rng, eos_ids=frozenset()):
        self.calls["propose"] += 1
        return Draft(tokens=[5] * k, probs=None)

    def observe(self, verification):
        self.calls["observe"] += 1


class Alternate(Selector):
    """Plays the arms in turn, one per round."""

    def __init__(self, arms, order):
        super().__init__(arms)
        self.order, self.i = list(order), 0

    def reset(self, query=None):
        self.i = 0

    def select(self):
        arm = self.order[self.i % len(self.order)]
        self.i += 1
        return arm


def prompt_of(setup):
    return setup.tokenizer(PROMPT)["input_ids"]


def test_autoregressive_generation_does_no_drafter_work(tiny_setup, tiny_decode):
    counting = Counting()
    pool = {**tiny_setup.pool, "counting": counting}
    gen = tiny_decode(tiny_setup.target, pool, AUTOREGRESSIVE, prompt_of(tiny_setup), max_new_tokens=12)
    assert len(gen.tokens) > 0
    assert counting.calls == {"begin": 0, "catch_up": 0, "propose": 0, "observe": 0}


def test_drafter_is_called_only_in_rounds_that_play_it(tiny_setup, tiny_decode):
    counting = Counting()
    pool = {AUTOREGRESSIVE: tiny_setup.pool[AUTOREGRESSIVE], "counting": counting}
    gen = tiny_decode(
        tiny_setup.target,
        pool,
        Alternate(list(pool), [AUTOREGRESSIVE, "counting"]),
        prompt_of(tiny_setup),
        max_new_tokens=16,
    )
    played = [r for r in gen.rounds if r.arm == "counting"]
    assert played and len(played) < len(gen.rounds)
    assert counting.calls["catch_up"] == len(played)
    assert counting.calls["propose"] == len([r for r in played if r.drafted])  # a last round may have no room
    assert counting.calls["begin"] == 1  # the per-query setup happens once, at first use
    assert counting.calls["observe"] == 0  # it asked for no target states
    first = [r for r in gen.rounds if r.first_use]
    assert [r.index for r in first] == [played[0].index]  # recorded as first-use cost
    # a second query starts it again, once
    tiny_decode(tiny_setup.target, pool, "counting", prompt_of(tiny_setup), max_new_tokens=8)
    assert counting.calls["begin"] == 2


def count_encoder_calls(model):
    calls = [0]
    handle = model.get_encoder().register_forward_hook(lambda *a: calls.__setitem__(0, calls[0] + 1))
    return calls, handle


def test_t5_autoregressive_cost_does_not_grow_with_the_pool(tiny_t5_target, tiny_decode):
    """Pools of 1 and of 4 model drafters: autoregressive decoding runs the same single encoder pass and
    no drafter forward; an early exit played afterwards reuses the target's encoder output."""
    target = tiny_t5_target
    hf = {"_target_": "specbench.drafters.hf.build", "model": "embedded:tiny_t5_draft"}
    exit_cfg = {
        "_target_": "specbench.drafters.early_exit.build",
        "layers": 1,
        "layers_key": "num_decoder_layers",
        "final_norm": "decoder.final_layer_norm",
        "head_scale": 0.125,
    }
    small = build_pool(target, {"d0": hf})
    big = build_pool(target, {"d0": hf, "d1": hf, "d2": {**hf}, "exit": exit_cfg})
    prompt = target.tokenizer(PROMPT)["input_ids"]
    counts = {}
    for label, pool in (("one", small), ("four", big)):
        target_enc, h0 = count_encoder_calls(target.model)
        drafter_calls = []
        hooks = [h0]
        for name, d in pool.items():
            if hasattr(d, "lm") and d.lm.model is not target.model:
                c, h = count_encoder_calls(d.lm.model) if name != "exit" else ([0], None)
                fwd = [0]
                hooks.append(
                    d.lm.model.register_forward_hook(lambda *a, fwd=fwd: fwd.__setitem__(0, fwd[0] + 1))
                )
                if h is not None:
                    hooks.append(h)
                drafter_calls.append((name, c, fwd))
        gen = tiny_decode(target, pool, AUTOREGRESSIVE, prompt, max_new_tokens=10)
        counts[label] = (
            target_enc[0],
            gen.target_calls,
            {name: (c[0], f[0]) for name, c, f in drafter_calls},
        )
        for h in hooks:
            h.remove()
    assert counts["one"][0] == counts["four"][0] == 1
    assert counts["one"][1] == counts["four"][1]
    assert all(v == (0, 0) for v in counts["four"][2].values())
    assert all(v == (0, 0) for v in counts["one"][2].values())

    # the early exit shares the target's encoder: playing it runs no second encoder pass
    autoregressive_tokens = gen.tokens  # the last autoregressive generation of the loop above
    target_enc, h = count_encoder_calls(target.model)
    gen = tiny_decode(target, big, "exit", prompt, max_new_tokens=10)
    h.remove()
    assert gen.drafted > 0 and all(r.arm == "exit" for r in gen.rounds)  # the early exit really drafted
    assert gen.tokens == autoregressive_tokens and target_enc[0] == 1
    assert big["exit"].lm.encoder_outputs is target.encoder_outputs


def record_hidden_requests(target):
    """Wrap the target's forward to record whether each call asked for hidden states."""
    asked = []
    original = target.lm.forward

    def forward(ids, last_only=False, hidden=False):
        asked.append(hidden)
        return original(ids, last_only=last_only, hidden=hidden)

    target.lm.forward = forward
    return asked, lambda: setattr(target.lm, "forward", original)


def test_hidden_states_only_when_a_drafter_asks(tiny_setup, tiny_decode):
    target = tiny_setup.target
    pool = tiny_setup.pool
    asked, restore = record_hidden_requests(target)
    try:
        tiny_decode(target, pool, UCB(list(pool), reward="bd"), prompt_of(tiny_setup), max_new_tokens=12)
        assert asked and not any(asked)  # no drafter asked: plain forwards
        asked.clear()
        gen = tiny_decode(
            target,
            pool,
            UCB(list(pool), reward="bd", full_information=True),
            prompt_of(tiny_setup),
            max_new_tokens=12,
        )
        # the early exit asks once the selector wants side observations: the prefill and every
        # verification forward return states (one prefill forward; none for a one-token prompt)
        prefill = 0 if target.is_encoder_decoder else 1  # a T5 decoder starts from one token: no forward
        assert asked == [True] * (prefill + len(gen.rounds))
    finally:
        restore()


def test_generation_syncs_the_device_once_at_each_end(tiny_llama_target, tiny_llama_pool, monkeypatch):
    """A CUDA clock (its synchronize counted here on CPU) syncs twice per generation, and at every
    phase reading only with ``timing.phases``."""
    from specbench.decoding.loop import DecodeSpec, Limits, decode
    from specbench.decoding.sampling import SamplingParams
    from specbench.selection import Fixed
    from specbench.timing import Clock

    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: None)
    prompt = tiny_llama_target.tokenizer(PROMPT)["input_ids"]
    syncs = {}
    for phases in (False, True):
        clock = Clock("cuda", phases=phases)
        for arm in (AUTOREGRESSIVE, "quantized_weight"):
            before = clock.syncs
            gen = decode(
                tiny_llama_target,
                tiny_llama_pool,
                Fixed(list(tiny_llama_pool), arm),
                prompt,
                DecodeSpec(SamplingParams(), Limits(max_new_tokens=12), frozenset(), clock),
                torch.Generator().manual_seed(0),
            )
            syncs[(phases, arm)] = (clock.syncs - before, len(gen.rounds))
    assert syncs[(False, AUTOREGRESSIVE)][0] == syncs[(False, "quantized_weight")][0] == 2
    for arm in (AUTOREGRESSIVE, "quantized_weight"):
        n, rounds = syncs[(True, arm)]
        assert n > 2 + rounds  # several phase readings per round
