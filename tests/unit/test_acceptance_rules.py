"""The lossless acceptance rules (``decoding/acceptance.py``) on a seeded world of prefix-dependent target and drafter
distributions over 3 tokens (no model): the first 3 tokens of a generation follow the target's law under every rule,
with a sampled and with a deterministic drafter; a negative control for each rule (the same rule mutated to keep one
rejected token, and for the rules that read ``q`` a declared ``q`` 30% off the one that drew the draft) is rejected, the test's power against it
computed from the noncentral chi-square, not assumed; block verification keeps at least what token-wise verification
keeps; strict keeps the least."""

from __future__ import annotations

import itertools
import math
from collections import Counter

import pytest
import torch

from specbench.decoding.acceptance import BLOCK, FULL, ONEHOT, RULES, STRICT
from specbench.decoding.verify import Verdict
from tests.integration.test_sampling_law_wide import chi2_critical, ncx2_sf

V, L, RUNS = 3, 3, 4000
POWER = 0.9  # a negative control must be rejected, and the test must have had at least this power against it


class World:
    """Target and drafter distributions by prefix, drawn once per prefix from a seeded generator."""

    def __init__(self, seed: int):
        self.seed = seed
        self.tables: dict[tuple, torch.Tensor] = {}

    def _dist(self, kind: int, prefix: tuple) -> torch.Tensor:
        key = (kind, prefix)
        if key not in self.tables:
            g = torch.Generator().manual_seed(hash((self.seed, kind, prefix)) % 2**31)
            w = torch.rand(V, generator=g, dtype=torch.float64) ** 2 + 0.05
            self.tables[key] = w / w.sum()
        return self.tables[key]

    def p(self, prefix: tuple) -> torch.Tensor:
        return self._dist(0, prefix)

    def q(self, prefix: tuple) -> torch.Tensor:
        return self._dist(1, prefix)

    def law(self) -> dict[tuple, float]:
        out = {}
        for seq in itertools.product(range(V), repeat=L):
            prob = 1.0
            for t in range(L):
                prob *= float(self.p(seq[:t])[seq[t]])
            out[seq] = prob
        return out


def keep_one_rejected(rule):
    """A rule mutated to keep the first rejected draft token instead of the token it draws there."""

    def mutated(draft, q, p, rng):
        v = rule(draft, q, p, rng)
        if v.accepted < len(draft):
            return Verdict(v.accepted + 1, [*draft[: v.accepted + 1], *v.tokens[v.accepted + 1 :]])
        return v

    return mutated


def generate(world: World, verify, k: int, sampled: bool, rng: torch.Generator, wrong_q: bool = False):
    """One generation's first ``L`` tokens, round by round: ``k`` draft tokens (drawn from the drafter's distributions,
    or its argmax), verified by ``verify`` against the target's rows; also the accepted tokens of each round."""
    out: tuple = ()
    kept = []
    while len(out) < L:
        draft, q_rows = [], []
        for _ in range(k):
            dist = world.q(out + tuple(draft))
            x = int(torch.multinomial(dist, 1, generator=rng)) if sampled else int(dist.argmax())
            draft.append(x)
            q_rows.append(0.7 * dist + 0.3 / V if wrong_q else dist)  # wrong: 30% of it declared uniform
        p = torch.stack([world.p(out + tuple(draft[:i])) for i in range(k + 1)])
        v = verify(draft, torch.stack(q_rows) if sampled else None, p, rng)
        kept.append(v.accepted)
        out += tuple(v.tokens)
    return out[:L], kept


def chi2(counts: Counter, law: dict, n: int) -> float:
    return sum((counts.get(s, 0) - n * p) ** 2 / (n * p) for s, p in law.items())


def run(world, verify, k, sampled, seed, wrong_q=False):
    rng = torch.Generator().manual_seed(seed)
    counts, kept = Counter(), []
    for _ in range(RUNS):
        seq, rounds = generate(world, verify, k, sampled, rng, wrong_q)
        counts[seq] += 1
        kept.extend(rounds)
    return counts, sum(kept) / len(kept)


def power_against(counts: Counter, law: dict, n: int, crit: float) -> float:
    """The chi-square test's power at ``n`` runs against the law the control's counts show (plug-in noncentrality):
    the noncentral chi-square's tail, or its normal approximation where the noncentrality is large."""
    lam = sum((counts.get(s, 0) / n - p) ** 2 / p for s, p in law.items()) * n
    df = len(law) - 1
    if lam < 200:
        return ncx2_sf(crit, df, lam)
    return 0.5 * math.erfc((crit - df - lam) / math.sqrt(2 * (df + 2 * lam)) / math.sqrt(2))


@pytest.mark.parametrize(
    "name, k, sampled",
    [
        *((r, 2, True) for r in (FULL, ONEHOT, STRICT, BLOCK)),
        *((r, 2, False) for r in (FULL, BLOCK)),
        *(pytest.param(r, 3, True, marks=pytest.mark.slow) for r in (FULL, ONEHOT, STRICT, BLOCK)),
    ],
)
def test_each_rule_keeps_the_targets_law_and_its_negative_control_is_rejected(name, k, sampled):
    world = World(7)
    law = world.law()
    crit = chi2_critical(len(law) - 1)
    counts, _ = run(world, RULES[name], k, sampled, seed=1)
    assert chi2(counts, law, RUNS) < crit, f"{name}: the target's law rejected"
    controls = {"keeps a rejected token": (keep_one_rejected(RULES[name]), False)}
    if sampled and name in (FULL, BLOCK):
        controls["declares a wrong q"] = (RULES[name], True)
    for what, (verify, wrong_q) in controls.items():
        bad, _ = run(world, verify, k, sampled, seed=2, wrong_q=wrong_q)
        stat = chi2(bad, law, RUNS)
        power = power_against(bad, law, RUNS, crit)
        print(f"{name} k={k} {what}: chi-square {stat:.1f} (critical {crit:.1f}), power {power:.3f}")
        assert stat > crit and power >= POWER, (
            f"{name} {what}: chi-square {stat:.1f} (critical {crit:.1f}), power {power:.2f}"
        )


def test_block_keeps_at_least_what_token_wise_keeps_and_strict_the_least():
    """Mean accepted tokens a round on the same world with a sampled 3-token draft: block >= full >= onehot, and
    strict below full (vLLM's default keeps less of a sampled draft than the p/q rule)."""
    world = World(11)
    kept = {name: run(world, RULES[name], 3, True, seed=3)[1] for name in (FULL, ONEHOT, STRICT, BLOCK)}
    noise = 0.03
    assert kept[BLOCK] >= kept[FULL] - noise, kept
    assert kept[FULL] > kept[STRICT] + noise and kept[FULL] >= kept[ONEHOT] - noise, kept


def test_an_unknown_rule_is_refused_naming_the_rules():
    from specbench.decoding.sampling import SamplingParams
    from specbench.errors import SpecbenchError

    with pytest.raises(SpecbenchError, match=r"decoding.acceptance.*one of full, onehot, strict, block"):
        SamplingParams(temperature=0.7, acceptance="blocks")


def test_a_rule_a_cascade_or_a_tree_cannot_use_is_refused_before_any_model_loads():
    from omegaconf import OmegaConf

    from specbench.decoding.cascade import Cascade
    from specbench.decoding.sampling import SamplingParams
    from specbench.errors import SpecbenchError
    from specbench.pipelines.methods import check_methods
    from specbench.pipelines.session.settings import check_acceptance

    block = SamplingParams(temperature=0.7, acceptance=BLOCK)
    with pytest.raises(SpecbenchError, match="cascade=chow verifies against its own mixture"):
        check_acceptance(block, Cascade("chow", 0.5))
    check_acceptance(block, None)
    check_acceptance(SamplingParams(acceptance=BLOCK), Cascade("chow", 0.5))  # greedy: no rule is applied

    def cfg(methods, acceptance=BLOCK, temperature=0.7):
        return OmegaConf.create(
            {
                "methods": methods,
                "decoding": {"temperature": temperature, "acceptance": acceptance},
                "pool": {
                    "drafters": {
                        "prompt_lookup": {"tree": None},
                        "suffix": {"tree": {"width": 3, "nodes": 12}},
                    }
                },
                "selector": None,
            }
        )

    check_methods(cfg(["autoregressive", "fixed:prompt_lookup"]))
    for methods, named in (
        (["fixed:suffix"], "its drafters suffix draft trees"),
        (["tree:prompt_lookup+suffix"], "tree:prompt_lookup\\+suffix"),
    ):
        with pytest.raises(SpecbenchError, match=named):
            check_methods(cfg(methods))
    check_methods(cfg(["fixed:suffix"], acceptance=FULL))
    check_methods(cfg(["fixed:suffix"], temperature=0.0))
