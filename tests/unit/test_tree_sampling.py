"""Multi-draft (token-tree) speculative sampling is lossless: the exact three-token law.

A seeded synthetic target over 5 tokens (its logits a fixed function of the prefix) and three drafters:
two model-like ones drawing from their own processed distributions (with the same temperature and
top-p as the target) and a deterministic one (one-hot q, as prompt lookup). Each round drafts up to two
tokens per member, merges the drafts into a trie, and verifies them with ``verify_tree_sampling`` over
the target's rows for every node, until three tokens are out, exactly as the decode loop does (the room
for the bonus token included). The empirical law of the three tokens must match the product of the
target's processed distributions; skipping the residual correction between siblings must not.
"""

from __future__ import annotations

import itertools
import math
from collections import Counter

import pytest
import torch

from specbench.decoding.sampling import SamplingParams, logits_to_probs
from specbench.decoding.tree import build_tree, verify_tree_greedy, verify_tree_sampling

V = 5
OUT = 3
DRAFT = 2
RUNS = 6000


def chi2_critical(df: int) -> float:
    """Upper 1e-3 quantile of chi-square(df) (Wilson-Hilferty)."""
    h = 2.0 / (9.0 * df)
    return df * (1.0 - h + 3.090 * math.sqrt(h)) ** 3


class Law:
    """Processed distributions of the target (seed 0) and two drafters (seeds 1, 2), memoised by prefix."""

    def __init__(self, sampling: SamplingParams):
        self.sampling = sampling
        self.memo: dict = {}

    def probs(self, who: int, prefix: tuple[int, ...]) -> torch.Tensor:
        key = (who, prefix)
        if key not in self.memo:
            g = torch.Generator().manual_seed(hash((who, prefix)) % (2**31))
            logits = 1.5 * torch.randn(V, generator=g)
            self.memo[key] = logits_to_probs(logits, self.sampling)
        return self.memo[key]


def one_run(law: Law, rng: torch.Generator, residual_rule=None) -> tuple[int, ...]:
    out: list[int] = []
    while len(out) < OUT:
        k = min(DRAFT, OUT - len(out) - 1)
        drafts, q = {}, {}
        for who, name in ((1, "m1"), (2, "m2")):
            toks, rows = [], []
            for _ in range(k):
                dist = law.probs(who, tuple(out + toks))
                toks.append(int(torch.multinomial(dist, 1, generator=rng)))
                rows.append(dist)
            drafts[name], q[name] = toks, (torch.stack(rows) if rows else None)
        drafts["one_hot"] = [(sum(out) + i) % V for i in range(k)]  # deterministic: q is one-hot
        q["one_hot"] = None
        tree = build_tree(drafts)
        prefixes = [()] + [tuple(tree.tokens[m] for m in path_to(tree, n)) for n in range(tree.size)]
        p = torch.stack([law.probs(0, tuple(out) + pre) for pre in prefixes])
        kwargs = {} if residual_rule is None else {"residual_rule": residual_rule}
        verdict = verify_tree_sampling(tree, q, p, rng, **kwargs)
        out.extend(verdict.tokens)
    return tuple(out[:OUT])


def path_to(tree, node: int) -> list[int]:
    path = []
    while node >= 0:
        path.append(node)
        node = tree.parents[node]
    return path[::-1]


def exact_law(law: Law) -> dict[tuple[int, ...], float]:
    out = {}
    for seq in itertools.product(range(V), repeat=OUT):
        prob = 1.0
        for i in range(OUT):
            prob *= float(law.probs(0, seq[:i])[seq[i]])
        if prob > 0:
            out[seq] = prob
    assert sum(out.values()) == pytest.approx(1.0, abs=1e-5)
    return out


def chi_square(counts: Counter, law: dict, runs: int) -> tuple[float, int]:
    outside = {k: v for k, v in counts.items() if k not in law}
    assert not outside, f"sequences the target gives probability 0: {outside}"
    big = {k: p for k, p in law.items() if p * runs >= 5}
    stat = sum((counts.get(k, 0) - p * runs) ** 2 / (p * runs) for k, p in big.items())
    rest_p, rest_n = 1.0 - sum(big.values()), runs - sum(counts.get(k, 0) for k in big)
    cells = len(big)
    if rest_p * runs >= 5:
        stat += (rest_n - rest_p * runs) ** 2 / (rest_p * runs)
        cells += 1
    return stat, cells - 1


@pytest.mark.parametrize(
    "sampling",
    [
        SamplingParams(temperature=0.7),
        SamplingParams(temperature=1.3),
        SamplingParams(temperature=1.0, top_p=0.9),
    ],
    ids=["t0.7", "t1.3", "top_p0.9"],
)
def test_tree_sampling_reproduces_the_three_token_law(sampling):
    law = Law(sampling)
    exact = exact_law(law)
    rng = torch.Generator().manual_seed(7)
    counts = Counter(one_run(law, rng) for _ in range(RUNS))
    stat, df = chi_square(counts, exact, RUNS)
    assert df >= 8
    assert stat < chi2_critical(df), f"chi-square {stat:.1f} with {df} degrees of freedom"
    tv = 0.5 * sum(abs(counts.get(k, 0) / RUNS - p) for k, p in exact.items())
    assert tv < 0.06, tv


def test_accepting_a_sibling_without_the_residual_correction_is_caught():
    law = Law(SamplingParams(temperature=1.0))
    exact = exact_law(law)
    rng = torch.Generator().manual_seed(7)
    no_correction = lambda dist, q, x: dist  # noqa: E731 (the mutation: the next sibling sees p, not the residual)
    counts = Counter(one_run(law, rng, residual_rule=no_correction) for _ in range(RUNS))
    stat, df = chi_square(counts, exact, RUNS)
    assert stat > 3 * chi2_critical(df), f"the mutation went unnoticed: chi-square {stat:.1f}, df {df}"


def test_greedy_tree_walk_and_member_agreement():
    tree = build_tree({"a": [1, 2, 3], "b": [1, 4], "c": [], "d": [2]})
    logits = torch.full((tree.size + 1, V), -5.0)
    # root -> 1 (shared), then 4 (b's branch), then row of node "4" says 0 (bonus)
    logits[0, 1] = logits[1 + tree.paths["a"][0], 4] = logits[1 + tree.paths["b"][1], 0] = 5.0
    verdict = verify_tree_greedy(tree, logits)
    assert verdict.tokens == [1, 4, 0] and verdict.accepted == 2
    assert {m: verdict.agreement(tree, m) for m in tree.paths} == {"a": 1, "b": 2, "c": 0, "d": 0}
    assert verdict.winners(tree) == ["b"]


# -- one node in production order: the deterministic (retrieval) candidate first, then two model drafters whose
#    draws often coincide; the law test must catch each natural mistake (a statistic far past its critical value)
P_NODE = torch.tensor([0.40, 0.30, 0.20, 0.10])
Q1 = torch.tensor([0.10, 0.60, 0.25, 0.05])
Q2 = torch.tensor([0.05, 0.55, 0.35, 0.05])
ONE_HOT = 1  # the retrieval drafter's token: also the model drafters' favourite
DRAWS = 20_000


def node_tree_and_q(rng: torch.Generator):
    """A depth-1 tree: the one-hot candidate first, then one draw from each model drafter (as the loop orders them)."""
    drafts = {
        "retrieval": [ONE_HOT],
        "m1": [int(torch.multinomial(Q1, 1, generator=rng))],
        "m2": [int(torch.multinomial(Q2, 1, generator=rng))],
    }
    return build_tree(drafts), {"retrieval": None, "m1": Q1[None], "m2": Q2[None]}


def production(rng):
    tree, q = node_tree_and_q(rng)
    return verify_tree_sampling(tree, q, torch.stack([P_NODE] * (tree.size + 1)), rng).tokens[0]


def mutant(kind: str):
    """The node's recursive rejection with one mistake: ``skip_tried`` (a token already rejected is not tried
    again), ``p_residual`` (the residual taken from p, not from the running residual), ``final_from_p`` (after
    every rejection the token is drawn from p)."""

    def run(rng):
        tree, q = node_tree_and_q(rng)
        dist, tried = P_NODE.clone(), set()
        for member in ("retrieval", "m1", "m2"):
            x = tree.tokens[tree.paths[member][0]]
            qm = (
                q[member][0]
                if q[member] is not None
                else torch.nn.functional.one_hot(torch.tensor(x), 4).float()
            )
            if kind == "skip_tried" and x in tried:
                continue
            tried.add(x)
            if float(torch.rand(1, generator=rng)) * float(qm[x]) < float(dist[x]):
                return x
            base = P_NODE if kind == "p_residual" else dist
            left = torch.clamp(base - qm, min=0)
            dist = left / left.sum() if left.sum() > 0 else base
        final = P_NODE if kind == "final_from_p" else dist
        return int(torch.multinomial(final, 1, generator=rng))

    return run


def node_statistic(run) -> float:
    rng = torch.Generator().manual_seed(13)
    counts = Counter(run(rng) for _ in range(DRAWS))
    return sum(
        (counts.get(v, 0) - float(P_NODE[v]) * DRAWS) ** 2 / (float(P_NODE[v]) * DRAWS) for v in range(4)
    )


def test_node_law_in_production_order_and_its_mutations_are_caught():
    critical = chi2_critical(3)
    assert node_statistic(production) < critical
    for kind in ("skip_tried", "p_residual", "final_from_p"):
        stat = node_statistic(mutant(kind))
        assert stat > 3 * critical, (
            f"the law test misses the mutation {kind}: {stat:.1f} against {critical:.1f}"
        )


# -- the same node with a dynamic tree: the retrieval candidate first, then a model drafter's three siblings drawn
#    i.i.d. with replacement from its q (drafters/dynamic_tree.py); drafting-side mistakes must be caught too
def dynamic_node(siblings):
    def run(rng):
        draws = siblings(rng)
        tree = build_tree({"retrieval": [ONE_HOT], "head": draws}, {"head": [-1] * len(draws)})
        q = {"retrieval": None, "head": Q1[None].expand(len(draws), -1)}
        return verify_tree_sampling(tree, q, torch.stack([P_NODE] * (tree.size + 1)), rng).tokens[0]

    return run


def test_dynamic_tree_node_law_and_its_drafting_mistakes_are_caught():
    """Production: three draws with replacement (a token drawn twice is tried twice). Mistakes: dropping repeated
    draws (``unique``), or keeping the drafter's top three tokens instead of draws (``top``, as greedy does)."""
    critical = chi2_critical(3)
    draws = dynamic_node(lambda rng: torch.multinomial(Q1, 3, replacement=True, generator=rng).tolist())
    assert node_statistic(draws) < critical
    mistakes = {
        "unique": lambda rng: list(
            dict.fromkeys(torch.multinomial(Q1, 3, replacement=True, generator=rng).tolist())
        ),
        "top": lambda rng: torch.topk(Q1, 3).indices.tolist(),
    }
    for kind, siblings in mistakes.items():
        stat = node_statistic(dynamic_node(siblings))
        assert stat > 3 * critical, (
            f"the law test misses the mistake {kind}: {stat:.1f} against {critical:.1f}"
        )
