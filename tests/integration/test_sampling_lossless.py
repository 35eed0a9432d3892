"""Speculative sampling through the real decode loop reproduces the target's distribution.

For a fixed prompt the exact law of the first two sampled tokens is p(x1) * p(x2 | x1), computed
from the target itself under the same processing (temperature 1, top-k 4: at most 16 outcomes).
``decode`` with ``max_new_tokens=2`` drafts one token in its first round (room is left for the bonus
token), so every path of verification is used: acceptance plus bonus token, rejection plus a
residual draw, then (after a rejection) one plain target step. The same law holds for every row of a batch
(the one loop over rows at batch 2 and 4), a row verifying a token tree included.
"""

from __future__ import annotations

import dataclasses
import math
from collections import Counter

import pytest
import torch

from specbench.decoding.sampling import SamplingParams, logits_to_probs
from specbench.drafters import build_pool
from specbench.drafters.prompt_lookup import lookup

SAMPLING = SamplingParams(temperature=1.0, top_k=4)
RUNS = 3000
# With 16 outcomes and 3000 runs the expected TV of the empirical law is at most
# 0.5 * sum_i sqrt(2 p_i (1 - p_i) / (pi * N)) <= 0.5 * 4 * sqrt(2 / (pi * 3000)) ~ 0.029, and in
# practice ~0.015 for these skewed laws; 0.05 is a generous bound that a wrong acceptance rule
# (e.g. drafts always accepted) exceeds by far with these drafters.
TV_MAX = 0.05


def chi2_critical(df: int, alpha: float = 1e-3) -> float:
    """Upper ``alpha`` quantile of chi-square(df) (Wilson-Hilferty; accurate to ~1% for df >= 3)."""
    z = {1e-3: 3.090, 1e-4: 3.719}[alpha]
    h = 2.0 / (9.0 * df)
    return df * (1.0 - h + z * math.sqrt(h)) ** 3


def test_chi2_critical_matches_tables():
    assert chi2_critical(15) == pytest.approx(37.70, rel=0.02)
    assert chi2_critical(3) == pytest.approx(16.27, rel=0.03)


@pytest.fixture(scope="module")
def sampling_setup(tiny_llama_target):
    """Target, a pool of (early-exit, prompt-lookup) drafters and a prompt where both matter.

    The prompt is ``pre + [a, X] + mid + [a]``: prompt lookup proposes ``X``; ``X`` is picked so the
    target gives it probability near 1/2, so it is accepted and rejected often. Early exit with 3
    of 4 layers is a model drafter whose top-4 distribution overlaps the target's only partly
    (hf tiny_llama_draft has no overlap at all under top-4, and the int8 drafters are almost
    identical to the target; neither would exercise both outcomes of the acceptance test).
    """
    target = tiny_llama_target
    pool = build_pool(
        target,
        {
            "early_exit": {"_target_": "specbench.drafters.early_exit.build", "layers": 3},
            "prompt_lookup": {"_target_": "specbench.drafters.prompt_lookup.build"},
        },
    )
    tok = target.tokenizer
    pre, mid = tok("Sum: ")["input_ids"], tok(" is big; so")["input_ids"]
    a = tok("=")["input_ids"][0]
    candidates = []
    for x in range(len(tok)):
        ids = pre + [a, x] + mid + [a]
        if x not in tok.all_special_ids and lookup(ids, 1, 3, 1) == [x]:
            candidates.append(ids)
    with torch.inference_mode():
        probs = logits_to_probs(target.model(torch.tensor(candidates)).logits[:, -1], SAMPLING)
    drafted = [ids[len(pre) + 1] for ids in candidates]
    best = min(range(len(candidates)), key=lambda i: abs(float(probs[i, drafted[i]]) - 0.5))
    prompt = candidates[best]
    assert 0.2 < float(probs[best, drafted[best]]) < 0.8
    return target, pool, prompt, drafted[best]


def exact_two_token_law(target, prompt: list[int]) -> dict[tuple[int, int], float]:
    with torch.inference_mode():
        p1 = logits_to_probs(target.model(torch.tensor([prompt])).logits[0, -1], SAMPLING)
        support = p1.nonzero().flatten().tolist()
        batch = torch.tensor([prompt + [x1] for x1 in support])
        p2 = logits_to_probs(target.model(batch).logits[:, -1], SAMPLING)
    law = {}
    for row, x1 in enumerate(support):
        for x2 in p2[row].nonzero().flatten().tolist():
            law[(x1, x2)] = float(p1[x1]) * float(p2[row, x2])
    assert sum(law.values()) == pytest.approx(1.0, abs=1e-5)
    return law


def check_law(counts: Counter, law: dict, runs: int) -> None:
    outside = {k: v for k, v in counts.items() if k not in law}
    assert not outside, f"sequences the target gives probability 0: {outside}"
    tv = 0.5 * sum(abs(counts.get(k, 0) / runs - p) for k, p in law.items())
    assert tv < TV_MAX, f"total variation {tv:.4f}"
    # chi-square on the outcomes with expected count >= 5, the rest pooled into one cell
    big = {k: p for k, p in law.items() if p * runs >= 5}
    rest_p = 1.0 - sum(big.values())
    rest_n = runs - sum(counts.get(k, 0) for k in big)
    stat = sum((counts.get(k, 0) - p * runs) ** 2 / (p * runs) for k, p in big.items())
    cells = len(big)
    if rest_p * runs >= 5:
        stat += (rest_n - rest_p * runs) ** 2 / (rest_p * runs)
        cells += 1
    assert cells >= 4
    assert stat < chi2_critical(cells - 1), f"chi-square {stat:.1f} with {cells - 1} degrees of freedom"


@pytest.mark.parametrize(
    "arm", [pytest.param("early_exit", marks=pytest.mark.slow), "prompt_lookup"]
)  # 31 s, 23 s
def test_two_token_law_matches_target(sampling_setup, tiny_decode, arm):
    target, pool, prompt, lookup_token = sampling_setup
    law = exact_two_token_law(target, prompt)
    rng = torch.Generator().manual_seed(1234)
    counts: Counter = Counter()
    drafted = accepted = rounds = 0
    for _ in range(RUNS):
        gen = tiny_decode(
            target,
            pool,
            arm,
            prompt,
            max_new_tokens=2,
            draft_length=4,
            sampling=SAMPLING,
            eos_ids=frozenset(),
            rng=rng,
        )
        assert len(gen.tokens) == 2 and gen.stop == "length"
        assert gen.target_calls == len(gen.rounds)
        first = gen.rounds[0]
        assert first.drafted == 1 and first.n_max == 1  # draft capped to leave room for the bonus token
        if arm == "prompt_lookup":
            assert gen.tokens[0] == lookup_token or first.accepted == 0
        counts[tuple(gen.tokens)] += 1
        drafted += gen.drafted
        accepted += gen.accepted
        rounds += len(gen.rounds)
    assert drafted == RUNS
    # both branches of verification happened often
    assert 0.1 * RUNS < accepted < 0.9 * RUNS
    assert rounds == 2 * RUNS - accepted  # an accepted draft ends the query in one round
    check_law(counts, law, RUNS)
    if arm == "prompt_lookup":
        # acceptance probability of a deterministic draft is p(x): check it too
        p_x = sum(p for (x1, _), p in law.items() if x1 == lookup_token)
        assert accepted / RUNS == pytest.approx(p_x, abs=0.04)


@pytest.mark.slow  # 33 s (the tree laws of test_tree_sampling.py run in make test)
def test_two_token_law_with_both_drafts_in_one_tree(sampling_setup, tiny_decode):
    """The early exit's sampled draft and prompt lookup's one-hot draft as siblings of one token tree (room
    for one draft token each): multi-draft verification through the real loop keeps the target's law."""
    from specbench.selection import FixedTree

    target, pool, prompt, lookup_token = sampling_setup
    law = exact_two_token_law(target, prompt)
    rng = torch.Generator().manual_seed(4321)
    counts: Counter = Counter()
    siblings = 0
    for _ in range(RUNS):
        tree = FixedTree(list(pool), ["early_exit", "prompt_lookup"])
        gen = tiny_decode(
            target,
            pool,
            tree,
            prompt,
            max_new_tokens=2,
            draft_length=4,
            sampling=SAMPLING,
            eos_ids=frozenset(),
            rng=rng,
        )
        assert len(gen.tokens) == 2 and gen.target_calls == len(gen.rounds)
        first = gen.rounds[0]
        assert first.members == ["early_exit", "prompt_lookup"] and first.tree_size in (1, 2)
        siblings += first.tree_size == 2
        counts[tuple(gen.tokens)] += 1
    assert siblings > 0.2 * RUNS  # the two drafts often differ (~29%): the sibling rule is exercised
    check_law(counts, law, RUNS)


@pytest.mark.parametrize(
    "rows, flight, acceptance",
    [
        (2, None, "full"),
        *(
            pytest.param(r, f, "full", marks=pytest.mark.slow) for r, f in ((4, None), (4, 2))
        ),  # 90-110 s each
        # the other lossless rules (decoding/acceptance.py) through the engine, at batch 2 and 4
        *(pytest.param(2, None, a, marks=pytest.mark.slow) for a in ("onehot", "strict", "block")),
        pytest.param(4, 2, "block", marks=pytest.mark.slow),
    ],
)
def test_two_token_law_matches_target_in_a_batch(sampling_setup, rows, flight, acceptance):
    """Batched speculative sampling (the one loop over rows, ``engine.decode_rows``): rows of different prompt lengths (the prompt after 0, 1, ...
    copies of its first words), the last row the autoregressive arm, the others prompt lookup, but for one row at
    batch 4 that drafts with the early exit (a model drafter, drafting in a batched forward of its own); one target
    forward a round, all rows at once or two in flight (the others joining as rows finish). Each row's two-token law
    is its own prompt's target law, and prompt lookup's draft is accepted at the target's probability of it."""
    from specbench.decoding.drafter import AutoregressiveArm
    from specbench.decoding.engine import verifier_for
    from specbench.decoding.loop import DecodeSpec, Limits
    from specbench.timing import Clock
    from tests.batching import decode_batch

    target, pool, prompt, lookup_token = sampling_setup
    pre = target.tokenizer("Sum: ")["input_ids"]
    prompts = [pre * r + prompt for r in range(rows)]
    # at batch 4 one row drafts with the early exit, a model drafter drafting its rows in one batched forward
    arms = (["prompt_lookup", "early_exit", "prompt_lookup"] if rows == 4 else ["prompt_lookup"]) + [
        "autoregressive"
    ]
    drafters = [AutoregressiveArm() if a == "autoregressive" else pool[a] for a in arms]
    laws = [exact_two_token_law(target, p) for p in prompts]
    sampling = dataclasses.replace(SAMPLING, acceptance=acceptance)
    spec = DecodeSpec(sampling, Limits(max_new_tokens=2, draft_length=4), frozenset(), Clock())
    rng = torch.Generator().manual_seed(99)
    verifier = verifier_for(target, flight or rows)  # one cache for every batch, as a run's
    counts = [Counter() for _ in prompts]
    accepted = [0] * rows
    for _ in range(RUNS):
        result = decode_batch(target, drafters, prompts, spec, rng, rows=flight, verifier=verifier)
        for r, gen in enumerate(result.generations):
            assert len(gen.tokens) == 2 and gen.deciders is None
            counts[r][tuple(gen.tokens)] += 1
            accepted[r] += gen.accepted
    for r, arm in enumerate(arms):
        check_law(counts[r], laws[r], RUNS)
        if (
            arm == "prompt_lookup"
        ):  # a one-token deterministic draft: every rule keeps it with the target's p(x)
            p_x = sum(p for (x1, _), p in laws[r].items() if x1 == lookup_token)
            assert accepted[r] / RUNS == pytest.approx(p_x, abs=0.04)
            # row 0 is the setup's prompt: its draft is accepted about half the time
            assert r > 0 or 0.2 < p_x < 0.8
        elif arm == "autoregressive":
            assert accepted[r] == 0


@pytest.mark.slow  # 3,000 batches: in the slow set, beside the widest laws
def test_two_token_law_of_a_tree_row_in_a_batch(sampling_setup):
    """A batch row whose selector builds a token tree each round (the early exit's sampled draft and prompt lookup's
    one-hot draft as siblings, a ``FixedTree`` row), beside a prompt-lookup row of a longer prompt:
    the tree row's two-token law is its prompt's target law, and so is its neighbour's."""
    from specbench.decoding.engine import Player, verifier_for
    from specbench.decoding.loop import DecodeSpec, Limits
    from specbench.selection import FixedTree
    from specbench.timing import Clock
    from tests.batching import decode_batch

    target, pool, prompt, lookup_token = sampling_setup
    prompts = [prompt, target.tokenizer("Sum: ")["input_ids"] + prompt]
    laws = [exact_two_token_law(target, p) for p in prompts]
    players = [
        Player(FixedTree(list(pool), ["early_exit", "prompt_lookup"]), pool),
        pool["prompt_lookup"],
    ]
    spec = DecodeSpec(SAMPLING, Limits(max_new_tokens=2, draft_length=4), frozenset(), Clock())
    rng, verifier = torch.Generator().manual_seed(7), verifier_for(target, 2)
    counts = [Counter(), Counter()]
    siblings = 0
    for _ in range(RUNS):
        result = decode_batch(target, players, prompts, spec, rng, verifier=verifier)
        for r, gen in enumerate(result.generations):
            assert len(gen.tokens) == 2
            counts[r][tuple(gen.tokens)] += 1
        first = result.generations[0].rounds[0]
        assert first.members == ["early_exit", "prompt_lookup"] and first.tree_size in (1, 2)
        siblings += first.tree_size == 2
    assert siblings > 0.2 * RUNS  # the sibling rule is exercised
    for r in range(2):
        check_law(counts[r], laws[r], RUNS)
