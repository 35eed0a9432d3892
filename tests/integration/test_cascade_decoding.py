"""Speculative cascades through the real decode loop on tiny models: the extreme lenience values
reduce to the drafter alone (never defer) and to lossless speculative decoding (always defer), a
rule applies to whichever drafter a selector picks, and the records count deferrals."""

from __future__ import annotations

import math

import pytest
import torch

from specbench.decoding.cascade import ALWAYS, NEVER, RULES, Cascade
from specbench.decoding.sampling import SamplingParams, logits_to_probs
from specbench.drafters import AUTOREGRESSIVE, AutoregressiveArm
from specbench.pipelines.session.core import alone_target
from specbench.selection.base import Selector

PROMPTS = ["The quick brown fox jumps over the lazy dog. The quick brown", "abc abc abc abc"]
MAX_NEW = 30
# quantized_weight, not quantized_dynamic: dynamic int8 scales activations per forward call, so that
# drafter's logits depend on how the prompt is chunked (its own generation prefills differently).
MODEL_ARMS = ["early_exit", "hf", "quantized_weight"]
LOSSY = [r for r in RULES if r != "none"]
SAMPLING = SamplingParams(temperature=1.0, top_k=8)


def ids(setup, text):
    return setup.tokenizer(text)["input_ids"]


def run(tiny_decode, setup, arm, text, cascade, max_new_tokens=MAX_NEW, draft_length=4):
    """Greedy decode with ``cascade``; no EOS (the tiny random models would stop at random places)."""
    return tiny_decode(
        setup.target,
        setup.pool,
        arm,
        ids(setup, text),
        max_new_tokens=max_new_tokens,
        draft_length=draft_length,
        eos_ids=frozenset(),
        cascade=cascade,
    )


@pytest.fixture(scope="module")
def alone_outputs(tiny_setup, tiny_decode):
    """Each model drafter's own greedy generation (its module as the target, autoregressive arm)."""
    out = {}
    for arm in MODEL_ARMS:
        target = alone_target(tiny_setup.pool[arm], tiny_setup.target)
        pool = {AUTOREGRESSIVE: AutoregressiveArm()}
        for text in PROMPTS:
            out[arm, text] = tiny_decode(
                target,
                pool,
                AUTOREGRESSIVE,
                ids(tiny_setup, text),
                max_new_tokens=MAX_NEW,
                eos_ids=frozenset(),
            ).tokens
    return out


@pytest.fixture(scope="module")
def ar_outputs(tiny_setup, tiny_decode):
    return {
        text: tiny_decode(
            tiny_setup.target,
            tiny_setup.pool,
            AUTOREGRESSIVE,
            ids(tiny_setup, text),
            max_new_tokens=MAX_NEW,
            eos_ids=frozenset(),
        ).tokens
        for text in PROMPTS
    }


@pytest.mark.parametrize("rule", LOSSY)
@pytest.mark.parametrize("arm", MODEL_ARMS)
def test_never_defer_is_the_drafter_alone(tiny_setup, tiny_decode, alone_outputs, ar_outputs, rule, arm):
    """Greedy, alpha = NEVER[rule]: every draft token is kept and the output is the drafter's own."""
    differs = 0
    for text in PROMPTS:
        gen = run(tiny_decode, tiny_setup, arm, text, Cascade(rule, NEVER[rule]))
        assert gen.tokens == alone_outputs[arm, text], (rule, arm, text)
        differs += gen.tokens != ar_outputs[text]
        for r in gen.rounds:
            assert r.accepted == r.drafted == r.n_max and r.emitted == r.drafted and r.deferred == 0
        # one target call per round, each covering draft_length + 1 tokens (MAX_NEW = 6 rounds of 5)
        assert gen.target_calls == len(gen.rounds) == MAX_NEW // 5
    assert differs or arm.startswith("quantized")  # the random drafters disagree with the target


@pytest.mark.parametrize("rule", RULES)
@pytest.mark.parametrize("arm", [*MODEL_ARMS, "prompt_lookup"])
def test_always_defer_is_lossless(tiny_setup, tiny_decode, ar_outputs, rule, arm):
    """Greedy, alpha = ALWAYS[rule]: output equals autoregressive decoding token for token."""
    for text in PROMPTS:
        gen = run(tiny_decode, tiny_setup, arm, text, Cascade(rule, ALWAYS[rule]))
        assert gen.tokens == ar_outputs[text], (rule, arm, text)
        if rule == "sequential":  # it defers before drafting: the target gives every token
            assert all(r.drafted == 0 and r.deferred == 1 for r in gen.rounds)
        elif rule != "lossy_sd":
            assert all(r.deferred == r.drafted for r in gen.rounds)


@pytest.mark.parametrize("rule", ["chow", "diff", "opt", "token_v1", "token_v2", "token_v3"])
def test_intermediate_alpha_defers_some(tiny_setup, tiny_decode, rule):
    """Between the extremes some alpha defers some drafted positions but not all (found by bisection)."""
    lo, hi = ALWAYS[rule], NEVER[rule]
    a, b = lo, hi  # bisection: everything is deferred at a, nothing at b
    for _ in range(40):
        alpha = (a + b) / 2
        gens = [run(tiny_decode, tiny_setup, "early_exit", text, Cascade(rule, alpha)) for text in PROMPTS]
        deferred, drafted = sum(g.deferred for g in gens), sum(g.drafted for g in gens)
        if 0 < deferred < drafted:
            break
        a, b = (alpha, b) if deferred == drafted else (a, alpha)
    assert 0 < deferred < drafted, f"no alpha between {lo} and {hi} deferred only some positions"


def two_token_law(target, prompt, sampling):
    """The target's exact law of its first two sampled tokens, p(x1) p(x2 | x1)."""
    with torch.inference_mode():
        p1 = logits_to_probs(target.model(torch.tensor([prompt])).logits[0, -1], sampling)
        first = p1.nonzero().flatten().tolist()
        p2 = logits_to_probs(
            target.model(torch.tensor([prompt + [x] for x in first])).logits[:, -1], sampling
        )
    return {
        (x1, x2): float(p1[x1] * p2[i, x2])
        for i, x1 in enumerate(first)
        for x2 in p2[i].nonzero().flatten().tolist()
    }


@pytest.fixture(scope="module")
def overlapping_pool(tiny_llama_target):
    """An early exit after 3 of the tiny Llama's 4 layers: its top-3 distributions overlap the
    target's partly (a 1-layer exit's do not), so acceptance and rejection both happen."""
    from specbench.drafters import build_pool

    return build_pool(
        tiny_llama_target, {"early_exit": {"_target_": "specbench.drafters.early_exit.build", "layers": 3}}
    )


@pytest.mark.parametrize(
    "rule",
    [
        "token_v3",
        *(
            pytest.param(r, marks=pytest.mark.slow)  # 12 s each: one in make test
            for r in ("opt", "chow", "diff", "lossy_sd")
        ),
    ],
)
def test_sampling_always_defer_is_lossless(tiny_llama_target, overlapping_pool, tiny_decode, rule):
    """Sampling, alpha = ALWAYS: the first two tokens follow the target's exact law. With
    max_new_tokens = 2 a lossy rule drafts two tokens (the second in the bonus position) and verifies
    both against pi = p, so acceptance, rejection and the bonus-position path all occur."""
    target, pool = tiny_llama_target, overlapping_pool
    sampling = SamplingParams(temperature=1.0, top_k=3)
    prompt = target.tokenizer("abc abc abc")["input_ids"]  # first-position overlap sum min(p, q) ~ 0.5
    law = two_token_law(target, prompt, sampling)
    rng = torch.Generator().manual_seed(99)
    counts: dict = {}
    runs, accepted = 2000, 0
    for _ in range(runs):
        gen = tiny_decode(
            target,
            pool,
            "early_exit",
            prompt,
            max_new_tokens=2,
            draft_length=4,
            sampling=sampling,
            eos_ids=frozenset(),
            rng=rng,
            cascade=Cascade(rule, ALWAYS[rule]),
        )
        assert gen.rounds[0].drafted == 2 and len(gen.tokens) == 2
        counts[tuple(gen.tokens)] = counts.get(tuple(gen.tokens), 0) + 1
        accepted += gen.accepted
    assert 0.05 * runs < accepted < 1.9 * runs
    assert not set(counts) - set(law)
    tv = 0.5 * sum(abs(counts.get(k, 0) / runs - p) for k, p in law.items())
    assert tv < 0.05, tv
    big = {k: p for k, p in law.items() if p * runs >= 5}
    stat = sum((counts.get(k, 0) - p * runs) ** 2 / (p * runs) for k, p in big.items())
    df = len(big) - 1
    h = 2.0 / (9.0 * df)
    assert stat < df * (1.0 - h + 3.719 * math.sqrt(h)) ** 3, stat  # chi-square, p = 1e-4 (Wilson-Hilferty)


def test_sampling_never_defer_keeps_every_draft(tiny_llama_target, tiny_llama_pool, tiny_decode):
    target, pool = tiny_llama_target, tiny_llama_pool
    prompt = target.tokenizer("Sum: 2 = 2")["input_ids"]
    for rule in ("chow", "token_v2", "lossy_sd"):
        gen = tiny_decode(
            target,
            pool,
            "early_exit",
            prompt,
            max_new_tokens=20,
            draft_length=3,
            sampling=SAMPLING,
            eos_ids=frozenset(),
            rng=torch.Generator().manual_seed(1),
            cascade=Cascade(rule, NEVER[rule]),
        )
        assert all(r.accepted == r.drafted == r.emitted for r in gen.rounds)
        assert gen.target_calls == 5  # 20 tokens in rounds of 4 drafted tokens


class Alternate(Selector):
    """Cycles through the given arms round by round."""

    def __init__(self, arms):
        self.arms = list(arms)
        self.t = 0

    def reset(self, query=None):
        self.t = 0

    def select(self):
        arm = self.arms[self.t % len(self.arms)]
        self.t += 1
        return arm

    def update(self, arm, feedback):
        pass


def test_rule_applies_to_whichever_drafter_the_selector_picks(tiny_setup, tiny_decode, ar_outputs):
    arms = ["early_exit", "hf", "prompt_lookup", AUTOREGRESSIVE]
    text = PROMPTS[0]
    gen = run(
        tiny_decode, tiny_setup, Alternate(arms), text, Cascade("chow", NEVER["chow"]), max_new_tokens=40
    )
    used = {r.arm for r in gen.rounds}
    assert used == set(arms)
    for r in gen.rounds:
        assert r.accepted == r.drafted and r.deferred == 0  # every drafter's tokens are kept
        if r.arm in ("early_exit", "hf"):
            assert r.drafted == r.n_max and (r.n_max == 5 or r.index == len(gen.rounds) - 1)
    always = run(
        tiny_decode,
        tiny_setup,
        Alternate(arms),
        text,
        Cascade("chow", ALWAYS["chow"]),
        max_new_tokens=MAX_NEW,
    )
    assert always.tokens == ar_outputs[text]
    assert {r.arm for r in always.rounds} == set(arms)


def test_no_cascade_and_rule_none_are_the_same_path(tiny_setup, tiny_decode):
    text = PROMPTS[1]
    plain = run(tiny_decode, tiny_setup, "early_exit", text, None)
    none = run(tiny_decode, tiny_setup, "early_exit", text, Cascade("none", 0.0))
    assert plain.tokens == none.tokens
    assert [(r.drafted, r.accepted, r.n_max) for r in plain.rounds] == [
        (r.drafted, r.accepted, r.n_max) for r in none.rounds
    ]
    assert plain.deferred == 0 and none.deferred == none.drafted  # lossless: every position is the target's


@pytest.mark.parametrize("arm", MODEL_ARMS)
def test_sequential_cascade_is_chows_output_with_the_target_called_only_on_deferral(
    tiny_setup, tiny_decode, arm
):
    """Greedy, at a lenience where some positions defer: the sequential cascade emits Chow's output token for
    token (the same deferral test on q), yet its drafts stop at each deferred position (never past it), every
    drafted token is kept, and a round that defers ends with the target's token."""
    seen_deferral = False
    for text in PROMPTS:
        for alpha in (0.5, 0.8, 0.95):
            seq = run(tiny_decode, tiny_setup, arm, text, Cascade("sequential", alpha), draft_length=6)
            chow = run(tiny_decode, tiny_setup, arm, text, Cascade("chow", alpha), draft_length=6)
            assert seq.tokens == chow.tokens, (arm, text, alpha)
            for r in seq.rounds:
                assert r.accepted == r.drafted
                assert r.emitted == r.drafted + r.deferred and r.deferred in (0, 1)
                seen_deferral |= r.deferred == 1 and r.drafted < r.n_max
    assert seen_deferral
