"""Speculative cascades: deferral decisions on hand-made distributions, mixture properties, and the
sampler against pi reproducing pi's exact law (seeded distribution tests)."""

from __future__ import annotations

import math
from collections import Counter

import pytest
import torch

from specbench.decoding.cascade import (
    ALWAYS,
    MIXTURE_RULES,
    NEVER,
    RULES,
    TOKEN_RULES,
    Cascade,
    accept_set,
    cascade_target,
    defer_mask,
    keep_mask,
    lossy_accept_prob,
    mixture,
    one_hot,
    token_mixture,
    total_variation,
    verify_greedy_kept,
)
from specbench.decoding.sampling import SamplingParams
from specbench.decoding.verify import verify_sampling
from specbench.errors import SpecbenchError

T1 = SamplingParams(temperature=1.0)
GREEDY = SamplingParams()


def rows(*lists):
    return torch.tensor(lists, dtype=torch.float32)


# ------------------------------------------------------------------ deferral decisions, by hand

# Position 0: a confident drafter (max q 0.9) and a target at 0.6; position 1: an unsure drafter
# (max q 0.4) and a confident target (0.8). TV(q0, p0) = 0.6, TV(q1, p1) = 0.7.
Q = rows([0.9, 0.05, 0.05, 0.0], [0.4, 0.3, 0.2, 0.1])
P = rows([0.3, 0.6, 0.1, 0.0], [0.0, 0.1, 0.1, 0.8])


def test_total_variation_by_hand():
    assert total_variation(Q, P).tolist() == pytest.approx([0.6, 0.7])
    assert total_variation(Q[:1], Q[:1]).item() == 0.0


@pytest.mark.parametrize(
    "rule, alpha, expected",
    [
        # chow: defer when max q < 1 - alpha  (max q = 0.9, 0.4)
        ("chow", 0.0, [True, True]),
        ("chow", 0.2, [False, True]),  # 0.9 < 0.8? no; 0.4 < 0.8 yes
        ("chow", 0.7, [False, False]),  # threshold 0.3
        # diff: defer when max q < max p - alpha  (max p = 0.6, 0.8)
        ("diff", 0.0, [False, True]),
        ("diff", 0.3, [False, True]),  # 0.4 < 0.5
        ("diff", 0.5, [False, False]),  # 0.4 < 0.3? no
        ("diff", -0.35, [True, True]),  # 0.9 < 0.95
        # opt: defer when max q < max p - alpha * TV  (TV = 0.6, 0.7)
        ("opt", 0.5, [False, True]),  # 0.4 < 0.8 - 0.35 = 0.45
        ("opt", 0.7, [False, False]),  # 0.4 < 0.8 - 0.49 = 0.31? no
        ("opt", -0.6, [True, True]),  # 0.9 < 0.6 + 0.36 = 0.96
    ],
)
def test_mixture_rule_decisions(rule, alpha, expected):
    assert defer_mask(rule, Q, P, alpha).tolist() == expected


@pytest.mark.parametrize(
    "rule, alpha, expected",
    [
        # token_v1: q(v) >= max p - alpha (max p = 0.6, 0.8)
        ("token_v1", 0.0, [[True, False, False, False], [False, False, False, False]]),
        ("token_v1", 0.5, [[True, False, False, False], [True, True, False, False]]),
        # token_v2: p(v) >= max p - alpha
        ("token_v2", 0.0, [[False, True, False, False], [False, False, False, True]]),
        ("token_v2", 0.35, [[True, True, False, False], [False, False, False, True]]),
        # token_v3: p(v) >= (1 - alpha) max p
        ("token_v3", 0.5, [[True, True, False, False], [False, False, False, True]]),  # 0.3, 0.4
        ("token_v3", 0.9, [[True, True, True, False], [False, True, True, True]]),  # 0.06, 0.08
    ],
)
def test_token_rule_accept_sets(rule, alpha, expected):
    assert accept_set(rule, Q, P, alpha).tolist() == expected


def test_token_mixture_by_hand():
    # A = {v0} at position 0 (token_v1, alpha 0): pi = 0.9 * onehot(0) + 0.1 * p
    pi = token_mixture(Q[:1], P[:1], accept_set("token_v1", Q[:1], P[:1], 0.0))
    assert pi[0].tolist() == pytest.approx([0.9 + 0.03, 0.06, 0.01, 0.0])


def test_keep_mask_and_lossy_by_hand():
    draft = [0, 1]
    assert keep_mask("chow", 0.2, draft, Q, P).tolist() == [True, False]
    assert keep_mask("token_v2", 0.35, draft, Q, P).tolist() == [True, False]  # v0 in A0, v1 not in A1
    assert keep_mask("none", 0.0, draft, Q, P).tolist() == [False, False]
    # lossy: min(1, p(x) / ((1 - alpha) q(x))): x0 = 0: 0.3 / (0.5 * 0.9) = 2/3; x1 = 1: 0.1 / (0.5 * 0.3) = 2/3
    probs = lossy_accept_prob(torch.tensor([0.9, 0.3]), torch.tensor([0.3, 0.1]), 0.5)
    assert probs.tolist() == pytest.approx([2 / 3, 2 / 3])
    assert lossy_accept_prob(torch.tensor([0.9]), torch.tensor([0.0]), 1.0).tolist() == [1.0]
    assert keep_mask("lossy_sd", 0.8, draft, Q, P).tolist() == [True, True]  # 0.3 >= 0.18, 0.1 >= 0.06


def test_verify_greedy_kept_by_hand():
    logits = torch.log(rows([0.1, 0.8, 0.1, 1e-9], [0.7, 0.1, 0.1, 0.1], [0.1, 0.1, 0.7, 0.1]))
    # position 0: draft 0 is kept by the rule although the target's argmax is 1
    v = verify_greedy_kept([0, 0], torch.tensor([True, False]), logits)
    assert (v.accepted, v.tokens) == (2, [0, 0, 2])  # position 1 matches the target's argmax; bonus = 2
    v = verify_greedy_kept([0, 3], torch.tensor([True, False]), logits)
    assert (v.accepted, v.tokens) == (1, [0, 0])  # rejected at 1: the target's argmax is emitted
    v = verify_greedy_kept([0, 3], torch.tensor([False, True]), logits)
    assert (v.accepted, v.tokens) == (0, [1])
    # k rows for k draft tokens (the last draft token in the bonus position): a kept draft ends the round
    v = verify_greedy_kept([0, 0, 3], torch.tensor([True, False, True]), logits)
    assert (v.accepted, v.tokens) == (3, [0, 0, 3])
    v = verify_greedy_kept([0, 0, 3], torch.tensor([True, False, False]), logits)
    assert (v.accepted, v.tokens) == (2, [0, 0, 2])


# ------------------------------------------------------------------ validation


@pytest.mark.parametrize(
    "rule, alpha",
    [("chow", 1.5), ("diff", -1.2), ("opt", -2.5), ("token_v3", 2.0), ("lossy_sd", -0.1), ("lossy_sd", 1.01)],
)
def test_alpha_out_of_range_is_an_error(rule, alpha):
    with pytest.raises(SpecbenchError, match="out of range"):
        Cascade(rule, alpha)


def test_unknown_rule_is_an_error():
    with pytest.raises(SpecbenchError, match="unknown cascade rule") as exc:
        Cascade("chow2", 0.1)
    assert "token_v3" in exc.value.fix


# ------------------------------------------------------------------ properties on random inputs


def random_dists(gen, k, vocab, peaked=False):
    logits = torch.randn(k, vocab, generator=gen) * (4.0 if peaked else 1.5)
    probs = torch.softmax(logits, dim=-1)
    # a few exact zeros, as top-k / top-p produce
    zero = torch.rand(k, vocab, generator=gen) < 0.2
    zero[torch.arange(k), probs.argmax(-1)] = False
    probs = probs.masked_fill(zero, 0.0)
    return probs / probs.sum(-1, keepdim=True)


@pytest.mark.parametrize("rule", [*MIXTURE_RULES, *TOKEN_RULES])
def test_pi_is_a_distribution_on_random_inputs(rule):
    gen = torch.Generator().manual_seed(7)
    for trial in range(200):
        vocab = int(torch.randint(2, 40, (1,), generator=gen))
        q, p = random_dists(gen, 3, vocab, trial % 2 == 0), random_dists(gen, 3, vocab, trial % 3 == 0)
        q_raw, p_raw = random_dists(gen, 3, vocab), random_dists(gen, 3, vocab)
        alpha = float(torch.empty(1).uniform_(ALWAYS[rule], NEVER[rule], generator=gen))
        pi, _ = cascade_target(rule, alpha, q, p, q_raw, p_raw)
        assert (pi >= 0).all()
        assert pi.sum(-1).tolist() == pytest.approx([1.0] * 3, abs=1e-5)


@pytest.mark.parametrize("rule", [*MIXTURE_RULES, *TOKEN_RULES])
def test_extreme_alphas_give_q_and_p(rule):
    """At NEVER[rule] pi = q (every draft kept); at ALWAYS[rule] pi = p (lossless)."""
    gen = torch.Generator().manual_seed(3)
    for _ in range(100):
        q, p = random_dists(gen, 4, 10), random_dists(gen, 4, 10)
        pi_never, _ = cascade_target(rule, NEVER[rule], q, p, q, p)
        pi_always, _ = cascade_target(rule, ALWAYS[rule], q, p, q, p)
        assert torch.allclose(pi_never, q, atol=1e-6)
        assert torch.allclose(pi_always, p, atol=1e-6)
        draft = q.argmax(-1).tolist()
        assert keep_mask(rule, NEVER[rule], draft, q, p).all()
        assert not keep_mask(rule, ALWAYS[rule], draft, q, p).any()


def test_opt_needs_minus_two_to_always_defer():
    """|max q - max p| <= TV, with equality for a one-hot q on the target's argmax: opt at -1 keeps it."""
    q, p = rows([1.0, 0.0, 0.0]), rows([0.5, 0.3, 0.2])
    assert not defer_mask("opt", q, p, -1.0).item()
    assert defer_mask("opt", q, p, -2.0).item()


def test_mixture_is_linear_in_delta():
    q, p = rows([0.5, 0.5]), rows([0.0, 1.0])
    assert mixture(q, p, torch.tensor([0.25])).tolist() == [[0.375, 0.625]]


# ------------------------------------------------------------------ the sampler against pi


def chi2_critical(df: int) -> float:
    """Upper 1e-3 quantile of chi-square(df) (Wilson-Hilferty)."""
    h = 2.0 / (9.0 * df)
    return df * (1.0 - h + 3.090 * math.sqrt(h)) ** 3


def check_law(counts: Counter, law: torch.Tensor, runs: int):
    outside = [v for v in counts if law[v] <= 0]
    assert not outside, f"tokens with probability 0 were emitted: {outside}"
    tv = 0.5 * sum(abs(counts.get(v, 0) / runs - float(law[v])) for v in range(len(law)))
    assert tv < 0.03, f"total variation {tv:.4f}"
    cells = [v for v in range(len(law)) if law[v] * runs >= 5]
    stat = sum((counts.get(v, 0) - float(law[v]) * runs) ** 2 / (float(law[v]) * runs) for v in cells)
    if len(cells) > 1:
        assert stat < chi2_critical(len(cells) - 1), stat


def lossy_law(q: torch.Tensor, p: torch.Tensor, alpha: float) -> torch.Tensor:
    accept = q * torch.clamp(p / ((1 - alpha) * q).clamp_min(1e-30), max=1.0)
    res = torch.clamp(p - (1 - alpha) * q, min=0)
    return accept + (1 - accept.sum()) * res / res.sum()


# (rule, alpha) pairs that make every branch happen on Q_S / P_S below
# (mixture rules: delta = 0 for chow 0.55, diff 0, opt 0.5; delta = 1 for chow 0.3, diff -0.2, opt -0.5)
SAMPLED = [
    ("chow", 0.55),
    ("chow", 0.3),
    ("diff", 0.0),
    ("diff", -0.2),
    ("opt", 0.5),
    ("opt", -0.5),
    ("token_v1", 0.2),
    ("token_v2", 0.3),
    ("token_v3", 0.5),
    ("lossy_sd", 0.4),
    ("none", 0.0),
]
Q_S = torch.tensor([0.5, 0.25, 0.15, 0.1, 0.0, 0.0])
P_S = torch.tensor([0.2, 0.1, 0.05, 0.05, 0.35, 0.25])


@pytest.mark.parametrize("deterministic", [False, True])
@pytest.mark.parametrize("rule, alpha", SAMPLED)
def test_sampler_against_pi_matches_pi(rule, alpha, deterministic):
    """One drafted position: the emitted token's law is exactly pi (mixture and token rules), p
    (none), or the lossy-SD law; the draft is drawn from q (or fixed, q one-hot)."""
    cascade = Cascade(rule, alpha)
    runs = 8000
    gen = torch.Generator().manual_seed(11)
    # one row: the drafted token sits in the bonus position (as the loop drafts under a lossy rule)
    logits = torch.log(P_S).unsqueeze(0)
    q = Q_S.unsqueeze(0)
    q_used = one_hot([1], len(Q_S)) if deterministic else q
    if rule == "lossy_sd":
        law = lossy_law(q_used[0], P_S, alpha)
    elif rule == "none":
        law = P_S
    else:
        law = cascade_target(rule, alpha, q_used, P_S.unsqueeze(0), q_used, P_S.unsqueeze(0))[0][0]
    counts: Counter = Counter()
    accepted = 0
    for _ in range(runs):
        x = 1 if deterministic else int(torch.multinomial(Q_S, 1, generator=gen))
        verdict, deferred = cascade.verify(
            [x], None if deterministic else q, None if deterministic else q, logits, T1, gen
        )
        counts[verdict.tokens[0]] += 1
        accepted += verdict.accepted
        assert len(verdict.tokens) == 1
    check_law(counts, law, runs)
    # the draft is always kept exactly when pi = q; otherwise both branches of verification ran
    assert (accepted == runs) == torch.allclose(law, q_used[0])
    assert accepted > 0 or law[1 if deterministic else 0] == 0


@pytest.mark.parametrize("rule", [*MIXTURE_RULES, *TOKEN_RULES, "lossy_sd"])
def test_sampling_extremes(rule):
    gen = torch.Generator().manual_seed(5)
    for _ in range(50):
        q, p = random_dists(gen, 3, 12), random_dists(gen, 4, 12)
        draft = [int(torch.multinomial(row, 1, generator=gen)) for row in q]
        logits = torch.log(p.clamp_min(1e-30))
        verdict, deferred = Cascade(rule, NEVER[rule]).verify(draft, q, q, logits, T1, gen)
        assert (
            verdict.accepted == 3
            and verdict.tokens[:3] == draft
            and len(verdict.tokens) == 4
            and deferred == 0
        )
        verdict, _ = Cascade(rule, NEVER[rule]).verify(draft, q, q, logits[:3], T1, gen)  # no bonus row
        assert verdict.accepted == 3 and verdict.tokens == draft
        # always defer: the same draws as lossless speculative sampling
        seed = int(torch.randint(0, 2**31, (1,), generator=gen))
        lossy, deferred = Cascade(rule, ALWAYS[rule]).verify(
            draft, q, q, logits, T1, torch.Generator().manual_seed(seed)
        )
        lossless = verify_sampling(draft, q, torch.softmax(logits, -1), torch.Generator().manual_seed(seed))
        assert lossy == lossless
        assert deferred == 3 or rule == "lossy_sd"


@pytest.mark.parametrize("rule", [*MIXTURE_RULES, *TOKEN_RULES])
def test_greedy_is_the_one_hot_limit_of_the_sampler(rule):
    """Greedy cascade verification = the sampler with one-hot tempered q and p (deferral on raw)."""
    gen = torch.Generator().manual_seed(9)
    for _ in range(100):
        q_raw, p_raw = random_dists(gen, 4, 8, peaked=True), random_dists(gen, 5, 8, peaked=True)
        draft = q_raw.argmax(-1).tolist()
        alpha = float(torch.empty(1).uniform_(ALWAYS[rule], NEVER[rule], generator=gen))
        logits = torch.log(p_raw.clamp_min(1e-30))
        p_raw = torch.softmax(logits, -1)
        greedy, deferred = Cascade(rule, alpha).verify(draft, q_raw, q_raw, logits, GREEDY, gen)
        p_hot = one_hot(p_raw.argmax(-1).tolist(), 8)
        pi, _ = cascade_target(rule, alpha, one_hot(draft, 8), p_hot[:4], q_raw, p_raw[:4])
        sampled = verify_sampling(draft, None, torch.cat([pi, p_hot[4:]]), gen)
        assert greedy == sampled
        assert deferred == int((~keep_mask(rule, alpha, draft, q_raw, p_raw[:4])).sum())


def test_every_rule_has_extremes():
    assert set(ALWAYS) == set(NEVER) == set(RULES)
    for rule in RULES:
        Cascade(rule, ALWAYS[rule])
        Cascade(rule, NEVER[rule])


# ------------------------------------------------------------------ the curves table (pure functions of records)


def _ex(qid, task, method, seconds, out, ref_ids, quality, calls, drafted=0, accepted=0, deferred=0):
    from specbench.pipelines.cascade_curves import agreement

    return {
        "query_id": qid,
        "task": task,
        "method": method,
        "output_ids": out,
        "text": "x",
        "new_tokens": len(out),
        "seconds": seconds,
        "target_calls": calls,
        "drafted": drafted,
        "accepted": accepted,
        "deferred": deferred,
        "reference": None,
        "quality": quality,
        "agreement": agreement(out, ref_ids),
    }


def test_rejections_by_hand():
    from specbench.pipelines.speed import rejections

    rounds = [
        {"drafted": 4, "accepted": 4, "emitted": 5},  # all accepted + bonus
        {"drafted": 4, "accepted": 1, "emitted": 2},  # rejected at position 2
        {"drafted": 5, "accepted": 2, "emitted": 2},  # EOS inside the accepted prefix: no rejection
        {"drafted": 5, "accepted": 5, "emitted": 5},  # lossy rule, fully kept, no bonus
        {"drafted": 0, "accepted": 0, "emitted": 1},
    ]  # autoregressive step
    assert rejections(rounds) == 1


def test_agreement_by_hand():
    from specbench.pipelines.cascade_curves import agreement

    assert agreement([1, 2, 3], [1, 2, 3]) == {"exact": True, "tokens": 1.0}
    assert agreement([1, 9, 3, 4], [1, 2, 3]) == {"exact": False, "tokens": 0.5}


def test_curves_and_best_rule_by_hand():
    from specbench.pipelines.cascade_curves import best_at_loss, closing_note, curves

    ar = [1, 2, 3, 4]
    examples = [
        _ex("q1", "math", "autoregressive", 4.0, ar, ar, {"accuracy": 1.0}, 4),
        _ex("q2", "math", "autoregressive", 4.0, ar, ar, {"accuracy": 0.0}, 4),
        _ex("q1", "math", "drafter_alone", 1.0, [9, 9, 9, 9], ar, {"accuracy": 0.0}, 4),
        _ex("q2", "math", "drafter_alone", 1.0, [9, 9, 9, 9], ar, {"accuracy": 0.0}, 4),
        _ex("q1", "math", "sd", 2.0, ar, ar, {"accuracy": 1.0}, 2, drafted=4, accepted=2, deferred=4),
        _ex("q2", "math", "sd", 2.0, ar, ar, {"accuracy": 0.0}, 2, drafted=4, accepted=2, deferred=4),
        _ex("q1", "math", "chow@0.5", 1.0, [1, 2, 3, 9], ar, {"accuracy": 1.0}, 1, drafted=4, accepted=4),
        _ex("q2", "math", "chow@0.5", 1.0, ar, ar, {"accuracy": 0.0}, 1, drafted=4, accepted=4),
        _ex("q1", "math", "chow@0.9", 0.5, [9, 2, 3, 4], ar, {"accuracy": 0.0}, 1, drafted=4, accepted=4),
        _ex("q2", "math", "chow@0.9", 0.5, ar, ar, {"accuracy": 0.0}, 1, drafted=4, accepted=4),
    ]
    rounds = [
        {"query_id": q, "method": "sd", "drafted": 4, "accepted": 2, "emitted": 3} for q in ("q1", "q2")
    ]
    table = curves(examples, rounds).set_index("method")
    assert list(table.index) == ["autoregressive", "drafter_alone", "sd", "chow@0.5", "chow@0.9"]
    assert table.loc["sd", "speedup"] == 2.0 and table.loc["chow@0.9", "speedup"] == 8.0
    assert table.loc["sd", "rejection_rate"] == pytest.approx(2 / 6)  # 2 rejected of 4 accepted + 2 rejected
    assert table.loc["chow@0.5", "rejection_rate"] == 0.0
    assert table.loc["sd", "mat"] == 2.0 and math.isnan(table.loc["drafter_alone", "mat"])
    assert table.loc["sd", "deferral_rate"] == 1.0 and table.loc["chow@0.5", "deferral_rate"] == 0.0
    assert table.loc["chow@0.5", "agreement_exact"] == 0.5
    assert table.loc["chow@0.5", "agreement_tokens"] == pytest.approx(7 / 8)
    assert table.loc["chow@0.9", "quality"] == 0.0 and table.loc["sd", "quality"] == 0.5
    assert (table.loc["chow@0.5", "rule"], table.loc["chow@0.5", "alpha"]) == ("chow", 0.5)
    best = best_at_loss(table.reset_index())
    # chow@0.9 is faster but loses 50% accuracy; chow@0.5 keeps SD's accuracy at 4x
    assert best.to_dict("records") == [
        {
            "task": "math",
            "rule": "chow",
            "alpha": 0.5,
            "quality": 0.5,
            "sd_quality": 0.5,
            "speedup": 4.0,
            "sd_speedup": 2.0,
            "gain": 2.0,
        }
    ]
    assert "chow (alpha 0.5): speedup 4.000x" in closing_note(best)


def test_a_task_whose_baseline_ran_in_another_process_says_so():
    """issue 34: after a resumed cascades run, a task whose autoregressive runs finished in the other process was said
    to have none."""
    import math

    import pandas as pd

    from specbench.pipelines.cascade_curves import SD, closing_note

    table = pd.DataFrame(
        [
            {"task": "math", "method": "autoregressive", "speedup": 1.0},
            {"task": "math", "method": SD, "speedup": math.nan},
            {"task": "translation", "method": SD, "speedup": math.nan},
        ]
    )
    note = closing_note(pd.DataFrame(), table)
    assert "another process than its SD runs" in note and "math" in note.split("another process")[1]
    assert "no autoregressive generation of the task finished, so no speedup): translation." in note
