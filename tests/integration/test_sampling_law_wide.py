"""The sampling law, widened: the first three sampled tokens follow the target's exact law.

Through the real decode loop (``run_tiny_decode``) on the tiny Llama, for a fixed prompt, the exact
law of the first three tokens is ``p(x1) p(x2 | x1) p(x3 | x1 x2)``, computed from the target under
the same processing (top_k 3, so at most 27 sequences; temperature 0.7 or 1.3, or temperature 1 with
top_p 0.9). A run with draft length ``k`` generates ``k + 1`` tokens, so its first round drafts ``k``
tokens (2 or 3) and every path of verification is used: rejection at any draft position with a
residual draw, full acceptance with a bonus token, and later rounds after a rejection. Drafters:
``hf`` (the embedded tiny draft model), both quantized schemes, and a selector that switches drafter
every round (hf, dynamic int8, early exit, prompt lookup: stochastic and deterministic drafts mixed).

The test (``law_verdict``): no sequence of target probability 0 may appear, and Pearson's chi-square
over the sequences (cells of expected count < 5 pooled) must stay below its 1e-3 upper quantile, so
a lossless loop fails a given test with probability 1e-3 (the seeds are fixed: a pass is reproducible).

Power, shown by a computation and by mutations:

- Computed (``test_power_claim``): a law at total variation ``d`` from the target's, on the cells the
  test uses, has chi-square noncentrality ``lambda = N sum (p' - p)^2 / p >= 4 N d^2`` (Cauchy-Schwarz).
  With ``N = RUNS = 2000`` runs and at most 26 degrees of freedom, the noncentral chi-square
  exceeds the critical value with probability >= 0.95 for every ``d >= 0.085`` (>= 0.5 at ``d = 0.065``).
- Shown: two wrong verifications injected with ``monkeypatch`` where the loop calls them are
  REJECTED on the same data: the target's ``p`` drawn from at a rejection instead of the residual
  ``norm(max(0, p - q))`` (``specbench.decoding.acceptance.RULES['full']``), and a drafter that samples
  at the temperature but reports its untempered ``q`` (``ModelDrafter.propose``). For each, the
  exact first-token law of the mutant is computed from ``p`` and ``q`` (a lower bound on its 3-token
  TV distance) and checked to exceed the detectable ``d`` before the run, so the rejection is power,
  not luck.

Runtime: ~10 ms per generation, ~15-20 s per law test; the full drafter x setting grid and the second mutation are in
the slow set.
"""

from __future__ import annotations

import math
import random
from collections import Counter
from dataclasses import replace

import pytest
import torch

from specbench.decoding.drafter import DecodeContext, Draft, draft_ends
from specbench.decoding.sampling import SamplingParams, logits_to_probs, pick
from specbench.decoding.verify import Verdict, draft_token_probs
from specbench.drafters import build_pool
from specbench.drafters.base import ModelDrafter
from specbench.selection.base import Selector

RUNS = 2000
ALPHA = 1e-3
LAW_TOKENS = 3
DETECTABLE_TV = 0.085  # power >= 0.95 at RUNS (test_power_claim)

SETTINGS = {
    "t0.7": SamplingParams(temperature=0.7, top_k=3),
    "t1.3": SamplingParams(temperature=1.3, top_k=3),
    "top_p0.9": SamplingParams(temperature=1.0, top_k=3, top_p=0.9),
}
SEARCH = SamplingParams(temperature=1.0, top_k=3)  # the setting the prompts are chosen under


# ---------------------------------------------------------------------------------------------
# chi-square: critical values and power (regularised incomplete gamma, no scipy)
# ---------------------------------------------------------------------------------------------


def chi2_sf(x: float, df: int) -> float:
    return float(
        torch.special.gammaincc(
            torch.tensor(df / 2.0, dtype=torch.float64), torch.tensor(x / 2.0, dtype=torch.float64)
        )
    )


def chi2_critical(df: int, alpha: float = ALPHA) -> float:
    lo, hi = 0.0, 10.0 * df + 100.0
    for _ in range(200):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if chi2_sf(mid, df) > alpha else (lo, mid)
    return hi


def ncx2_sf(x: float, df: int, lam: float) -> float:
    """P(noncentral chi-square(df, lam) > x): a Poisson(lam / 2) mixture of central chi-squares."""
    total, j, weight_sum = 0.0, 0, 0.0
    while weight_sum < 1 - 1e-12 and j < 2000:
        w = math.exp(-lam / 2 + j * math.log(lam / 2) - math.lgamma(j + 1)) if lam > 0 else float(j == 0)
        total += w * chi2_sf(x, df + 2 * j)
        weight_sum += w
        j += 1
    return total


def power(runs: int, df: int, tv: float, alpha: float = ALPHA) -> float:
    """A lower bound on the chi-square test's probability of rejecting a law at TV ``tv``."""
    return ncx2_sf(chi2_critical(df, alpha), df, 4 * runs * tv * tv)


def test_power_claim():
    assert chi2_critical(15) == pytest.approx(37.70, rel=1e-3)  # table values
    assert chi2_critical(26) == pytest.approx(54.05, rel=1e-3)
    for df in range(2, 27):
        assert power(RUNS, df, DETECTABLE_TV) >= 0.95, df
    assert power(RUNS, 26, 0.065) >= 0.5
    assert power(RUNS, 26, 0.02) < 0.2  # and it is not a trivially strong claim


# ---------------------------------------------------------------------------------------------
# the exact law and the verdict
# ---------------------------------------------------------------------------------------------


def exact_law(target, prompt: list[int], sampling: SamplingParams, n: int = LAW_TOKENS) -> dict[tuple, float]:
    """``{(x1, .., xn): p(x1) p(x2 | x1) ..}`` over the processed target distributions."""
    law = {(): 1.0}
    with torch.inference_mode():
        for _ in range(n):
            prefixes = list(law)
            batch = torch.tensor([prompt + list(s) for s in prefixes])
            probs = logits_to_probs(target.model(batch).logits[:, -1], sampling)
            law = {
                s + (x,): law[s] * float(probs[row, x])
                for row, s in enumerate(prefixes)
                for x in probs[row].nonzero().flatten().tolist()
            }
    assert sum(law.values()) == pytest.approx(1.0, abs=1e-5)
    return law


def law_verdict(counts: Counter, law: dict, runs: int) -> dict:
    """Chi-square of the observed first-token sequences against ``law`` (pooling cells < 5 expected)."""
    outside = {k: v for k, v in counts.items() if k not in law}
    big = {k: p for k, p in law.items() if p * runs >= 5}
    stat = sum((counts.get(k, 0) - p * runs) ** 2 / (p * runs) for k, p in big.items())
    cells = len(big)
    rest_p = 1.0 - sum(big.values())
    if rest_p * runs >= 5:
        rest_n = runs - sum(counts.get(k, 0) for k in big)
        stat += (rest_n - rest_p * runs) ** 2 / (rest_p * runs)
        cells += 1
    crit = chi2_critical(max(cells - 1, 1))
    tv = 0.5 * sum(abs(counts.get(k, 0) / runs - law.get(k, 0.0)) for k in set(law) | set(counts))
    return {
        "ok": not outside and cells >= 3 and stat < crit,
        "outside": outside,
        "stat": stat,
        "crit": crit,
        "df": cells - 1,
        "tv": tv,
    }


# ---------------------------------------------------------------------------------------------
# setup: pool, prompts, selectors
# ---------------------------------------------------------------------------------------------


class EveryRound(Selector):
    """Switches drafter every round (round robin, continuing across queries)."""

    def __init__(self, arms, cycle):
        super().__init__(arms)
        self.cycle = list(cycle)
        self.i = 0

    def select(self) -> str:
        arm = self.cycle[self.i % len(self.cycle)]
        self.i += 1
        return arm

    def playable(self):
        return list(self.cycle)


MUTANT_ARM, MUTANT_SETTING = "quantized_dynamic", "t0.7"
SWITCHING = ("hf", "quantized_dynamic", "early_exit", "prompt_lookup")


def first_position(drafter, prompt, sampling):
    """The drafter's processed distribution for the first new token (a fresh query)."""
    drafter.begin(DecodeContext())
    with torch.inference_mode():
        return logits_to_probs(drafter.lm.sync(prompt), sampling)


@pytest.fixture(scope="module")
def law_setup(tiny_llama_target):
    """Target, pool, and per drafter a prompt whose first-position top-3 laws overlap the target's
    partly (TV nearest 0.5 among seeded candidates), so both acceptance and rejection are common;
    for the mutants' drafter (dynamic int8), the candidate where both mutants stray farthest."""
    target = tiny_llama_target
    pool = build_pool(
        target,
        {
            "hf": {"_target_": "specbench.drafters.hf.build", "model": "embedded:tiny_llama_draft"},
            "quantized_dynamic": {"_target_": "specbench.drafters.quantized.build"},
            "quantized_weight": {"_target_": "specbench.drafters.quantized.build", "scheme": "weight_int8"},
            "early_exit": {"_target_": "specbench.drafters.early_exit.build", "layers": 3},
            "prompt_lookup": {"_target_": "specbench.drafters.prompt_lookup.build"},
        },
    )
    tok = target.tokenizer
    words = [
        "the",
        "a",
        "of",
        "to",
        "and",
        "in",
        "is",
        "it",
        "you",
        "that",
        "he",
        "was",
        "for",
        "on",
        "are",
        "with",
        "as",
        "I",
        "his",
        "they",
        "be",
        "at",
        "one",
        "have",
        "this",
    ]
    rnd = random.Random(0)
    candidates = [tok(" ".join(rnd.choices(words, k=rnd.randint(2, 6))))["input_ids"] for _ in range(300)]
    with torch.inference_mode():
        p_first = [logits_to_probs(target.model(torch.tensor([c])).logits[0, -1], SEARCH) for c in candidates]
    prompts = {}
    for name in ("hf", "quantized_dynamic", "quantized_weight", "early_exit"):
        tvs = [
            0.5 * float((p - first_position(pool[name], c, SEARCH)).abs().sum())
            for c, p in zip(candidates, p_first)
        ]
        best = min(range(len(candidates)), key=lambda i: abs(tvs[i] - 0.5))
        prompts[name] = candidates[best]
    # the mutants' drafter: the prompt where both mutants' exact first-token laws are farthest from p
    mutant_sampling = SETTINGS[MUTANT_SETTING]
    with torch.inference_mode():
        p_mut = [
            logits_to_probs(target.model(torch.tensor([c])).logits[0, -1], mutant_sampling)
            for c in candidates
        ]
    drafter = pool[MUTANT_ARM]
    shifts = [
        min(
            first_token_tv_p_residual(p, first_position(drafter, c, mutant_sampling)),
            first_token_tv_untempered(
                p,
                first_position(drafter, c, mutant_sampling),
                first_position(drafter, c, replace(mutant_sampling, temperature=1.0)),
            ),
        )
        for c, p in zip(candidates, p_mut)
    ]
    prompts[MUTANT_ARM] = candidates[max(range(len(candidates)), key=shifts.__getitem__)]
    prompts["switching"] = prompts["early_exit"]  # the switching selector: where the early exit overlaps best
    return target, pool, prompts


def sample_sequences(
    target, pool, selector, prompt, sampling, draft_length, runs=RUNS, seed=1234, tiny_decode=None
):
    """``runs`` generations of ``draft_length + 1`` tokens; the first LAW_TOKENS of each, counted."""
    rng = torch.Generator().manual_seed(seed)
    counts: Counter = Counter()
    stats = Counter()
    for _ in range(runs):
        gen = tiny_decode(
            target,
            pool,
            selector,
            prompt,
            max_new_tokens=draft_length + 1,
            draft_length=draft_length,
            sampling=sampling,
            eos_ids=frozenset(),
            rng=rng,
        )
        assert len(gen.tokens) == draft_length + 1 and gen.stop == "length"
        first = gen.rounds[0]
        if first.arm != "prompt_lookup":
            assert first.drafted == draft_length  # the first round drafts k tokens (room for the bonus)
        counts[tuple(gen.tokens[:LAW_TOKENS])] += 1
        stats["rejected_first"] += first.accepted < first.drafted
        stats["all_accepted_first"] += first.drafted > 0 and first.accepted == first.drafted
        stats["rounds"] += len(gen.rounds)
        stats["switches"] += gen.switches
    return counts, stats


def check(counts, law, runs=RUNS):
    v = law_verdict(counts, law, runs)
    assert not v["outside"], f"sequences the target gives probability 0: {v['outside']}"
    assert v["ok"], f"chi-square {v['stat']:.1f} >= {v['crit']:.1f} ({v['df']} df), TV {v['tv']:.3f}"
    return v


# ---------------------------------------------------------------------------------------------
# the law: drafters x settings x draft lengths
# ---------------------------------------------------------------------------------------------

GRID = [  # (drafter, setting, draft length); only the first is in the fast set
    ("quantized_dynamic", "t0.7", 2),
    ("hf", "t1.3", 3),
    ("quantized_weight", "top_p0.9", 3),
    ("hf", "t0.7", 2),
    ("hf", "top_p0.9", 2),
    ("quantized_dynamic", "t1.3", 3),
    ("quantized_dynamic", "top_p0.9", 3),
    ("quantized_weight", "t0.7", 2),
    ("quantized_weight", "t1.3", 2),
]
FAST = 1  # dynamic int8 (21 s for hf's case: in the slow set, with the weight-int8 drafter, almost the target itself)


@pytest.mark.parametrize(
    "arm, setting, draft_length",
    [
        pytest.param(*case, marks=() if i < FAST else pytest.mark.slow, id=f"{case[0]}-{case[1]}-k{case[2]}")
        for i, case in enumerate(GRID)
    ],
)
def test_three_token_law(law_setup, tiny_decode, arm, setting, draft_length):
    target, pool, prompts = law_setup
    sampling, prompt = SETTINGS[setting], prompts[arm]
    law = exact_law(target, prompt, sampling)
    if setting == "top_p0.9":  # the nucleus cut bites: some conditional keeps fewer than top_k tokens
        assert len(law) < 27
    counts, stats = sample_sequences(
        target, pool, arm, prompt, sampling, draft_length, tiny_decode=tiny_decode
    )
    assert stats["rejected_first"] > 0  # verification was exercised, not only a draft accepted whole
    check(counts, law)


@pytest.mark.parametrize(
    "setting, draft_length",
    [
        pytest.param("t0.7", 2, id="t0.7-k2", marks=pytest.mark.slow),  # 32 s: all three in the slow set
        pytest.param("t1.3", 3, id="t1.3-k3", marks=pytest.mark.slow),
        pytest.param("top_p0.9", 3, id="top_p0.9-k3", marks=pytest.mark.slow),
    ],
)
def test_three_token_law_switching_every_round(law_setup, tiny_decode, setting, draft_length):
    target, pool, prompts = law_setup
    sampling, prompt = SETTINGS[setting], prompts["switching"]
    law = exact_law(target, prompt, sampling)
    selector = EveryRound(list(pool), SWITCHING)
    counts, stats = sample_sequences(
        target, pool, selector, prompt, sampling, draft_length, tiny_decode=tiny_decode
    )
    assert stats["switches"] > 0.2 * RUNS  # rounds after a rejection were played by another drafter
    assert selector.i == stats["rounds"]
    check(counts, law)


# ---------------------------------------------------------------------------------------------
# mutations the law test must reject
# ---------------------------------------------------------------------------------------------


def verify_sampling_p_residual(draft, q, p, rng):
    """WRONG on purpose: speculative sampling that draws from the target's ``p`` after a rejection
    instead of the residual ``norm(max(0, p - q))``."""
    k = len(draft)
    if k:
        idx = torch.tensor(draft, device=p.device).unsqueeze(-1)
        p_x = p[:k].gather(-1, idx).squeeze(-1)
        q_x = draft_token_probs(draft, q).to(p.device)
        u = torch.rand(k, generator=rng, device=p.device)
        rejected = (u * q_x >= p_x).nonzero()
        if rejected.numel():
            n = int(rejected[0, 0])
            token = int(torch.multinomial(p[n], 1, generator=rng))
            return Verdict(accepted=n, tokens=list(draft[:n]) + [token])
    if p.shape[0] == k:
        return Verdict(accepted=k, tokens=list(draft))
    token = int(torch.multinomial(p[k], 1, generator=rng))
    return Verdict(accepted=k, tokens=list(draft) + [token])


def propose_untempered_q(self, tokens, k, sampling, rng, eos_ids=frozenset()):
    """WRONG on purpose: ``ModelDrafter.propose`` sampling at the run's temperature but reporting
    the drafter's distribution at temperature 1 (top-k and top-p still applied) as ``q``."""
    if self._next_logits is None:
        self.catch_up(tokens)
    logits, self._next_logits = self._next_logits, None
    untempered = replace(sampling, temperature=1.0)
    out, rows = [], []
    for i in range(k):
        probs = logits_to_probs(logits, sampling)
        tok = pick(probs, sampling, rng)
        out.append(tok)
        rows.append(logits_to_probs(logits, untempered))
        if draft_ends(tok, float(probs[tok]), i, k, eos_ids, self.confidence_threshold):
            break
        logits = self.lm.forward([tok], last_only=True)[-1]
    return Draft(tokens=out, probs=torch.stack(rows), raw=torch.stack(rows))


def first_token_tv_p_residual(p, q):
    """Exact TV between the mutant's first-token law, min(p, q) + (1 - sum min(p, q)) p, and p."""
    overlap = torch.minimum(p, q)
    return 0.5 * float((overlap + (1 - overlap.sum()) * p - p).abs().sum())


def first_token_tv_untempered(p, q_t, q_1):
    """Exact TV between the mutant's first-token law and p: x ~ q_t accepted w.p. min(1, p / q_1),
    else a residual draw from norm(max(0, p - q_1))."""
    accept = q_t * torch.clamp(p / torch.where(q_1 > 0, q_1, torch.ones_like(q_1)), max=1.0)
    accept = torch.where(q_1 > 0, accept, torch.zeros_like(accept))
    res = torch.clamp(p - q_1, min=0.0)
    res = res / res.sum() if res.sum() > 0 else p
    law = accept + (1 - accept.sum()) * res
    return 0.5 * float((law - p).abs().sum())


@pytest.mark.parametrize(
    "mutation", ["p_as_residual", pytest.param("untempered_q", marks=pytest.mark.slow)]
)  # 14 s each
def test_law_test_rejects_mutations(law_setup, tiny_decode, monkeypatch, mutation):
    target, pool, prompts = law_setup
    sampling, prompt = SETTINGS[MUTANT_SETTING], prompts[MUTANT_ARM]
    law = exact_law(target, prompt, sampling)
    with torch.inference_mode():
        p = logits_to_probs(target.model(torch.tensor([prompt])).logits[0, -1], sampling)
    drafter = pool[MUTANT_ARM]
    q_t = first_position(drafter, prompt, sampling)
    if mutation == "p_as_residual":
        shift = first_token_tv_p_residual(p, q_t)
        from specbench.decoding import acceptance

        monkeypatch.setitem(
            acceptance.RULES, "full", verify_sampling_p_residual
        )  # the rule rounds.judge applies
    else:
        shift = first_token_tv_untempered(
            p, q_t, first_position(drafter, prompt, replace(sampling, temperature=1.0))
        )
        monkeypatch.setattr(ModelDrafter, "propose", propose_untempered_q)
    # the mutant's 3-token law is at least this far from the target's: within the test's power
    assert shift >= DETECTABLE_TV, f"mutant's first-token TV {shift:.3f}: the prompt does not separate it"
    counts, _ = sample_sequences(target, pool, MUTANT_ARM, prompt, sampling, 2, tiny_decode=tiny_decode)
    verdict = law_verdict(counts, law, RUNS)
    # (the unmutated loop on the same prompt, setting, draft length and seed passes: the grid's
    # quantized_dynamic-t0.7-k2 case)
    assert not verdict["ok"], f"the law test accepted the '{mutation}' mutant: {verdict}"


@pytest.mark.slow  # 2,000 batches of three rows
def test_three_token_law_in_a_batch_of_three_two_in_flight(law_setup):
    """Issue 68: three rows of model drafters (the HF drafter twice, drafting in one forward a position, and the early
    exit) of three prompts, two in flight (the third joins when one finishes, into the row it frees), one target
    forward a round: each row's first three tokens follow its own prompt's exact law, rejections and all."""
    from specbench.decoding.engine import verifier_for
    from specbench.decoding.loop import DecodeSpec, Limits
    from specbench.timing import Clock
    from tests.batching import decode_batch

    target, pool, prompts = law_setup
    sampling = SETTINGS["t0.7"]
    arms = ["hf", "early_exit", "hf"]
    chosen = [prompts["hf"], prompts["early_exit"], prompts["quantized_weight"]]
    laws = [exact_law(target, p, sampling) for p in chosen]
    spec = DecodeSpec(
        sampling, Limits(max_new_tokens=LAW_TOKENS, draft_length=LAW_TOKENS - 1), frozenset(), Clock()
    )
    verifier, rng = verifier_for(target, 2), torch.Generator().manual_seed(4321)
    counts = [Counter() for _ in arms]
    rejected = [0] * len(arms)
    for _ in range(RUNS):
        result = decode_batch(target, [pool[a] for a in arms], chosen, spec, rng, rows=2, verifier=verifier)
        for r, gen in enumerate(result.generations):
            assert len(gen.tokens) == LAW_TOKENS
            counts[r][tuple(gen.tokens)] += 1
            rejected[r] += gen.rounds[0].accepted < gen.rounds[0].drafted
    assert all(n > 0.1 * RUNS for n in rejected)  # every row's drafts were rejected often
    for r in range(len(arms)):
        check(counts[r], laws[r])
