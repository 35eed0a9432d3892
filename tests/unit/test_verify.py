"""Verification and sampling math on hand-made tensors (no models)."""

from __future__ import annotations

import pytest
import torch

import specbench.decoding.verify as verify_mod
from specbench.decoding.sampling import SamplingParams, logits_to_probs, pick
from specbench.decoding.verify import (
    Verdict,
    block_divergence,
    block_efficiency,
    draft_token_probs,
    residual,
    verify_greedy,
    verify_sampling,
)
from specbench.errors import SpecbenchError


def onehot_logits(best: list[int], vocab: int = 6) -> torch.Tensor:
    """Logits whose row-wise argmax is ``best`` (other entries descending, no ties)."""
    rows = torch.arange(vocab, 0, -1, dtype=torch.float32).repeat(len(best), 1) * 0.1
    for i, b in enumerate(best):
        rows[i, b] = 10.0
    return rows


# --------------------------------------------------------------------------------------- greedy


def test_verify_greedy_all_accepted_gets_bonus_token():
    logits = onehot_logits([3, 1, 4, 5])
    v = verify_greedy([3, 1, 4], logits)
    assert v == Verdict(accepted=3, tokens=[3, 1, 4, 5])


def test_verify_greedy_stops_at_first_mismatch():
    logits = onehot_logits([3, 1, 4, 5])
    v = verify_greedy([3, 2, 4], logits)  # position 1 mismatches; position 2 would match again
    assert v.accepted == 1
    assert v.tokens == [3, 1]
    v = verify_greedy([0, 1, 4], logits)
    assert v == Verdict(accepted=0, tokens=[3])


def test_verify_greedy_empty_draft_is_one_target_step():
    v = verify_greedy([], onehot_logits([2]))
    assert v == Verdict(accepted=0, tokens=[2])


# --------------------------------------------------------------------------- BE / BD / residual

P = torch.tensor([[0.5, 0.3, 0.2], [0.1, 0.6, 0.3], [0.2, 0.2, 0.6]])  # k + 1 = 3 rows
Q = torch.tensor([[0.2, 0.5, 0.3], [0.1, 0.1, 0.8]])  # k = 2 rows


def test_block_efficiency():
    assert block_efficiency(2, 4) == pytest.approx(0.5)
    assert block_efficiency(0, 3) == 0.0
    assert block_efficiency(3, 3) == 1.0
    assert block_efficiency(0, 0) == 0.0  # a round that could not draft


def test_block_divergence_by_hand():
    # sum_v min(p, q): row 0 -> 0.2 + 0.3 + 0.2 = 0.7; row 1 -> 0.1 + 0.1 + 0.3 = 0.5
    assert block_divergence([1, 2], Q, P, n_max=2) == pytest.approx((0.7 + 0.5) / 2)
    # the bonus row of p is ignored; a larger n_max dilutes
    assert block_divergence([1, 2], Q, P, n_max=4) == pytest.approx((0.7 + 0.5) / 4)


def test_block_divergence_one_hot_draft():
    # q = None: 1 - TV(p, onehot(x)) = p(x)
    assert block_divergence([0, 1], None, P, n_max=2) == pytest.approx((0.5 + 0.6) / 2)
    assert block_divergence([2, 0], None, P, n_max=2) == pytest.approx((0.2 + 0.1) / 2)


def test_block_divergence_short_draft_counts_missing_positions_as_zero():
    assert block_divergence([1], Q[:1], P, n_max=3) == pytest.approx(0.7 / 3)
    assert block_divergence([0], None, P, n_max=5) == pytest.approx(0.5 / 5)
    assert block_divergence([], None, P, n_max=3) == 0.0
    assert block_divergence([1], Q[:1], P, n_max=0) == 0.0


def test_block_divergence_equals_one_minus_tv_for_identical_distributions():
    assert block_divergence([0, 1], P[:2].clone(), P, n_max=2) == pytest.approx(1.0)


def test_draft_token_probs():
    assert torch.allclose(draft_token_probs([1, 2], Q), torch.tensor([0.5, 0.8]))
    assert torch.equal(draft_token_probs([1, 2], None), torch.ones(2))


def test_residual_is_normalized_positive_part():
    p = torch.tensor([0.4, 0.4, 0.2])
    q = torch.tensor([0.2, 0.2, 0.6])
    assert torch.allclose(residual(p, q, token=2), torch.tensor([0.5, 0.5, 0.0]))
    assert torch.allclose(residual(P[0], Q[0], token=1), torch.tensor([1.0, 0.0, 0.0]))


def test_residual_one_hot_removes_the_draft_token():
    p = torch.tensor([0.5, 0.3, 0.2])
    assert torch.allclose(residual(p, None, token=0), torch.tensor([0.0, 0.6, 0.4]))
    assert p[0] == 0.5  # the input is not modified


def test_residual_zero_mass_falls_back_to_p():
    p = torch.tensor([0.5, 0.3, 0.2])
    assert torch.equal(residual(p, p.clone(), token=0), p)
    assert torch.equal(residual(p, torch.tensor([0.6, 0.3, 0.2]), token=0), p)  # p <= q everywhere
    onehot = torch.tensor([0.0, 1.0, 0.0])
    assert torch.equal(residual(onehot, None, token=1), onehot)


# --------------------------------------------------------------------------- logits_to_probs


def logits_of(probs: list[float]) -> torch.Tensor:
    return torch.tensor(probs).log()


def test_greedy_returns_plain_softmax():
    logits = torch.tensor([[1.0, 2.0, -1.0, 0.5], [0.0, 0.0, 3.0, -2.0]])
    assert SamplingParams().greedy
    out = logits_to_probs(logits, SamplingParams(temperature=0.0, top_k=1, top_p=0.1))  # k/p ignored
    assert torch.allclose(out, torch.softmax(logits, dim=-1))


def test_temperature_scales_logits():
    logits = torch.tensor([1.0, 2.0, -1.0, 0.5])
    for t in (0.5, 1.0, 2.0):
        assert torch.allclose(
            logits_to_probs(logits, SamplingParams(temperature=t)), torch.softmax(logits / t, -1)
        )


def test_logits_to_probs_upcasts_half_precision():
    logits = torch.tensor([1.0, 2.0, -1.0, 0.5], dtype=torch.bfloat16)
    assert logits_to_probs(logits, SamplingParams(temperature=1.0)).dtype == torch.float32


def test_top_k_keeps_exactly_k_tokens():
    logits = torch.tensor([[0.3, 2.0, -1.0, 1.5, 0.9, -0.2], [5.0, 4.0, 3.0, 2.0, 1.0, 0.0]])
    for k in (1, 2, 3, 5):
        probs = logits_to_probs(logits, SamplingParams(temperature=1.0, top_k=k))
        assert ((probs > 0).sum(-1) == k).all()
        top = torch.topk(logits, k, dim=-1).indices
        for row in range(2):
            kept = torch.zeros(6, dtype=torch.bool)
            kept[top[row]] = True
            expected = torch.softmax(logits[row].masked_fill(~kept, float("-inf")), -1)
            assert torch.allclose(probs[row], expected)
        assert torch.allclose(probs.sum(-1), torch.ones(2))


def test_top_k_larger_than_vocabulary_is_a_no_op():
    logits = torch.tensor([0.3, 2.0, -1.0])
    assert torch.allclose(
        logits_to_probs(logits, SamplingParams(temperature=1.0, top_k=10)), torch.softmax(logits, -1)
    )


@pytest.mark.parametrize(
    "top_p, kept",
    [
        (0.3, [1]),  # 0.40 alone reaches 0.3
        (0.6, [1, 2]),  # 0.40 + 0.25 = 0.65 >= 0.6
        (0.7, [1, 2, 3]),  # 0.65 < 0.7 -> add 0.20
        (0.9, [1, 2, 3, 4]),  # 0.85 < 0.9 -> add 0.10
        (1.0, [0, 1, 2, 3, 4]),
    ],
)
def test_top_p_keeps_smallest_prefix_reaching_mass(top_p, kept):
    probs = [0.05, 0.40, 0.25, 0.20, 0.10]
    out = logits_to_probs(logits_of(probs), SamplingParams(temperature=1.0, top_p=top_p))
    expected = torch.zeros(5)
    mass = sum(probs[i] for i in kept)
    for i in kept:
        expected[i] = probs[i] / mass
    assert torch.allclose(out, expected, atol=1e-6), (top_p, out)


def test_top_p_always_keeps_the_top_token():
    out = logits_to_probs(logits_of([0.1, 0.7, 0.2]), SamplingParams(temperature=1.0, top_p=0.01))
    assert torch.allclose(out, torch.tensor([0.0, 1.0, 0.0]))


def test_top_k_then_top_p():
    probs = [0.05, 0.40, 0.25, 0.20, 0.10]
    # top-k 3 -> {0.40, 0.25, 0.20} renormalized to {0.47, 0.29, 0.24}; top-p 0.7 -> first two (0.76)
    out = logits_to_probs(logits_of(probs), SamplingParams(temperature=1.0, top_k=3, top_p=0.7))
    assert torch.allclose(out, torch.tensor([0.0, 0.40 / 0.65, 0.25 / 0.65, 0.0, 0.0]), atol=1e-6)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"temperature": -0.1},
        {"top_k": -1},
        {"top_p": 0.0},
        {"top_p": -0.5},
        {"top_p": 1.01},
    ],
)
def test_sampling_params_reject_bad_values(kwargs):
    name = next(iter(kwargs))
    with pytest.raises((ValueError, SpecbenchError), match=name):
        SamplingParams(**kwargs)


def test_pick_greedy_and_sampling():
    rng = torch.Generator().manual_seed(0)
    assert pick(torch.tensor([0.1, 3.0, 0.2]), SamplingParams(), rng) == 1
    probs = torch.tensor([0.0, 0.0, 1.0])
    assert all(pick(probs, SamplingParams(temperature=1.0), rng) == 2 for _ in range(20))


# ------------------------------------------------------------------- speculative sampling

V = 4
P_ROWS = torch.tensor(
    [
        [0.10, 0.20, 0.30, 0.40],
        [0.25, 0.05, 0.40, 0.30],
        [0.50, 0.10, 0.10, 0.30],
    ]
)  # k + 1 = 3
Q_ROWS = torch.tensor(
    [
        [0.40, 0.30, 0.20, 0.10],
        [0.10, 0.60, 0.10, 0.20],
    ]
)  # k = 2
N_DRAWS = 20_000  # expected TV of the empirical first-token law: ~0.005, so 0.02 is > 3 sigma


def tv(counts: torch.Tensor, p: torch.Tensor) -> float:
    return 0.5 * float((counts / counts.sum() - p).abs().sum())


def sample_verdicts(q: torch.Tensor | None, fixed_draft: list[int] | None, n: int = N_DRAWS, seed: int = 0):
    rng = torch.Generator().manual_seed(seed)
    first = torch.zeros(V)
    second_given_accept = torch.zeros(V)
    accepted_total = 0
    for _ in range(n):
        if q is None:
            draft = fixed_draft
        else:
            draft = [int(torch.multinomial(q[i], 1, generator=rng)) for i in range(q.shape[0])]
        v = verify_sampling(draft, q, P_ROWS, rng)
        assert 0 <= v.accepted <= len(draft)
        assert v.tokens[: v.accepted] == draft[: v.accepted]
        assert len(v.tokens) == v.accepted + 1
        first[v.tokens[0]] += 1
        if v.accepted >= 1:
            second_given_accept[v.tokens[1]] += 1
        accepted_total += v.accepted
    return first, second_given_accept, accepted_total


def test_verify_sampling_first_token_follows_target_with_model_draft():
    first, second, accepted = sample_verdicts(Q_ROWS, None)
    assert tv(first, P_ROWS[0]) < 0.02
    # once the first draft token is accepted, the next output token follows p[1] (here p[1] does
    # not depend on the first token, so this is an unconditional check)
    assert second.sum() > 2000
    assert tv(second, P_ROWS[1]) < 0.03
    # acceptance rate of the first token is sum_v min(p, q) = 0.1 + 0.2 + 0.2 + 0.1 = 0.6
    assert first.sum() == N_DRAWS
    assert second.sum() / N_DRAWS == pytest.approx(0.6, abs=0.02)
    assert accepted > 0


def test_verify_sampling_first_token_follows_target_with_deterministic_draft():
    first, second, _ = sample_verdicts(None, [2, 0])
    assert tv(first, P_ROWS[0]) < 0.02
    assert second.sum() / N_DRAWS == pytest.approx(float(P_ROWS[0, 2]), abs=0.02)  # accept w.p. p(x)
    assert tv(second, P_ROWS[1]) < 0.03


def test_verify_sampling_empty_draft_draws_from_p():
    rng = torch.Generator().manual_seed(1)
    counts = torch.zeros(V)
    for _ in range(5000):
        v = verify_sampling([], None, P_ROWS[:1], rng)
        assert v.accepted == 0 and len(v.tokens) == 1
        counts[v.tokens[0]] += 1
    assert tv(counts, P_ROWS[0]) < 0.03


def test_verify_sampling_never_emits_a_token_the_target_excludes():
    # p puts zero mass on token 3 (as top-k/top-p do); a drafter proposing it must always be rejected
    p = torch.tensor([[0.5, 0.3, 0.2, 0.0], [0.25, 0.25, 0.25, 0.25]])
    rng = torch.Generator().manual_seed(2)
    for _ in range(2000):
        v = verify_sampling([3], None, p, rng)
        assert v.accepted == 0 and v.tokens[0] != 3
        v = verify_sampling([3], torch.tensor([[0.0, 0.0, 0.0, 1.0]]), p, rng)
        assert v.accepted == 0 and v.tokens[0] != 3


def test_verify_sampling_rejects_zero_probability_token_even_when_uniform_draw_is_zero(monkeypatch):
    """Acceptance must be ``u < p(x) / q(x)``; with ``p(x) = 0`` a draw of exactly ``u = 0`` (which
    torch.rand can return, probability 2**-24 per float32 draw) must still reject ``x``."""
    real_rand = torch.rand

    def zero_rand(*args, **kwargs):
        return torch.zeros_like(real_rand(*args, **kwargs))

    monkeypatch.setattr(verify_mod.torch, "rand", zero_rand)
    p = torch.tensor([[0.5, 0.3, 0.2, 0.0], [0.25, 0.25, 0.25, 0.25]])
    v = verify_sampling([3], None, p, torch.Generator().manual_seed(0))
    assert v.tokens[0] != 3, "a token with target probability 0 was accepted"
