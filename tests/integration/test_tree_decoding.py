"""Token trees: one target forward verifies several drafters' drafts (decoder-only targets).

fp32 tiny Llama: the tree forward's rows equal a chain forward over each path; after a tree round the KV
cache equals a fresh forward over the committed tokens; greedy tree decoding equals autoregressive decoding
with drafts that share prefixes, are disjoint, empty, hit EOS inside a branch or run into max_new_tokens;
a drafter outside the round's tree does no work.
"""

from __future__ import annotations

import pytest
import torch

from specbench.decoding.drafter import Draft, Drafter
from specbench.decoding.tree import build_tree
from specbench.errors import SpecbenchError
from specbench.pipelines.methods import make_selector
from specbench.selection import FixedTree, Router, TreeHedge, TreeUCB

PROMPT = "The quick brown fox jumps over the lazy dog. The quick brown"
MAX_NEW = 24
LONG = 96  # the selector tests: ~20 rounds


def fresh_logits(model, ids: list[int]) -> torch.Tensor:
    with torch.inference_mode():
        return model(input_ids=torch.tensor([ids]), use_cache=False).logits[0].float()


class Scripted(Drafter):
    """Drafts from a known output (the autoregressive one): ``good`` correct tokens, then ``bad`` wrong
    ones (each correct token + ``shift``); counts its calls (the fairness check)."""

    def __init__(
        self,
        name,
        reference: list[int],
        prompt_len: int,
        good: int,
        bad: int = 2,
        shift: int = 1,
        vocab: int = 256,
    ):
        self.name, self.reference, self.prompt_len = name, reference, prompt_len
        self.good, self.bad, self.shift, self.vocab = good, bad, shift, vocab
        self.calls = 0

    def propose(self, tokens, k, sampling, rng, eos_ids=frozenset()) -> Draft:
        self.calls += 1
        at = len(tokens) - self.prompt_len
        truth = self.reference[at : at + self.good + self.bad]
        out = truth[: self.good] + [(t + self.shift) % self.vocab for t in truth[self.good :]]
        return Draft(out[:k], None)


@pytest.fixture(scope="module")
def setup(tiny_llama_target, tiny_llama_pool, tiny_decode):
    target = tiny_llama_target
    ids = target.tokenizer(PROMPT)["input_ids"]
    ref = tiny_decode(
        target,
        tiny_llama_pool,
        "autoregressive",
        ids,
        max_new_tokens=LONG,
        draft_length=1,
        eos_ids=frozenset(),
    )
    return target, ids, ref.tokens


def test_tree_rows_equal_chain_forward_on_every_path(setup):
    target, ids, _ = setup
    target.prefill(ids)
    drafts = {"a": [5, 6, 7], "b": [5, 9], "c": [], "d": [40, 41, 42, 43], "e": [5, 6, 8]}
    tree = build_tree(drafts)
    assert tree.size == 9 and not tree.is_chain  # 5, 6 shared by a and e; 5 by b
    logits = target.score_tree(tree).logits
    assert logits.shape[0] == tree.size + 1 and target.calls == 1
    for member, path in tree.paths.items():
        expected = fresh_logits(target.model, target.tokens + [tree.tokens[n] for n in path])[
            -(len(path) + 1) :
        ]
        assert torch.allclose(logits[tree.rows(path)], expected, atol=1e-4, rtol=1e-4), member


def test_tree_round_compacts_the_cache(setup):
    target, ids, _ = setup
    target.prefill(ids)
    for drafts, winner, keep in [
        ({"a": [5, 6, 7], "b": [5, 9, 10], "c": [30]}, "b", 2),
        ({"a": [11, 12], "b": [13, 14, 15]}, "b", 3),
        ({"a": [20, 21], "b": [22]}, "a", 0),
    ]:
        tree = build_tree(drafts)
        target.score_tree(tree)
        path = tree.paths[winner][:keep]
        target.commit_tree(path, [tree.tokens[n] for n in path] + [99])
        assert target.lm.cached == target.tokens[:-1]
        got = target.score([3, 4]).logits
        expected = fresh_logits(target.model, target.tokens + [3, 4])[-3:]
        assert torch.allclose(got, expected, atol=1e-4, rtol=1e-4)
        target.commit([3])


def scripted_pool(tiny_llama_pool, ref, prompt_len, specs):
    pool = dict(tiny_llama_pool)
    for name, good, bad, shift in specs:
        pool[name] = Scripted(name, ref, prompt_len, good, bad, shift)
    return pool


@pytest.mark.parametrize(
    "specs",
    [
        [("s_long", 3, 2, 1), ("s_short", 1, 3, 1)],  # shared prefixes (same correct head, branches differ)
        [("s_wrong", 0, 4, 1), ("s_right", 4, 0, 1)],  # disjoint: the first tokens differ
        [("s_empty", 0, 0, 1), ("s_some", 2, 2, 2)],  # an empty draft
        [("s_a", 2, 2, 1), ("s_b", 2, 2, 2), ("s_c", 0, 3, 3)],  # three drafters
    ],
)
@pytest.mark.parametrize("max_new", [MAX_NEW, 13])  # 13: drafts run into max_new_tokens inside a branch
def test_tree_greedy_equals_autoregressive(setup, tiny_llama_pool, tiny_decode, specs, max_new):
    target, ids, ref = setup
    pool = scripted_pool(tiny_llama_pool, ref, len(ids), specs)
    members = [s[0] for s in specs]
    gen = tiny_decode(
        target,
        pool,
        FixedTree(list(pool), members),
        ids,
        max_new_tokens=max_new,
        draft_length=4,
        eos_ids=frozenset(),
    )
    assert gen.tokens == ref[:max_new]
    assert gen.target_calls == len(gen.rounds) < max_new
    best = max(min(g, 4) for _, g, _, _ in specs)
    for r in gen.rounds:
        assert r.members == members and r.arm == "tree:" + "+".join(members)
        assert r.accepted == max(r.member_accepted.values())
        assert set(r.winners) == (
            {m for m, a in r.member_accepted.items() if a == r.accepted} if r.accepted else set()
        )
        if r.index < len(gen.rounds) - 1 and max_new == MAX_NEW:
            assert r.accepted == best
            assert r.member_accepted == {m: min(g, 4) for m, g, _, _ in specs}
        assert r.tree_size <= sum(min(g + b, 4) for _, g, b, _ in specs)


def test_tree_with_model_drafters_equals_autoregressive(setup, tiny_llama_pool, tiny_decode):
    target, ids, ref = setup
    for members in (["prompt_lookup", "hf"], ["hf", "early_exit", "quantized_dynamic"]):
        gen = tiny_decode(
            target,
            tiny_llama_pool,
            FixedTree(list(tiny_llama_pool), members),
            ids,
            max_new_tokens=MAX_NEW,
            draft_length=3,
            eos_ids=frozenset(),
        )
        assert gen.tokens == ref[:MAX_NEW], members
        assert any(r.tree_size > 0 for r in gen.rounds)


def test_eos_inside_a_branch_stops_the_output(setup, tiny_llama_pool, tiny_decode):
    target, ids, ref = setup
    stop = ref[9]  # this token ends the output (the autoregressive run stops at its first occurrence)
    first = ref.index(stop)
    pool = scripted_pool(tiny_llama_pool, ref, len(ids), [("s_a", 4, 0, 1), ("s_b", 1, 3, 1)])
    gen = tiny_decode(
        target,
        pool,
        FixedTree(list(pool), ["s_a", "s_b"]),
        ids,
        max_new_tokens=MAX_NEW,
        draft_length=4,
        eos_ids=frozenset({stop}),
    )
    assert gen.tokens == ref[: first + 1] and gen.stop == "eos"


def test_a_drafter_outside_the_tree_does_no_work(setup, tiny_llama_pool, tiny_decode):
    target, ids, ref = setup
    pool = scripted_pool(
        tiny_llama_pool, ref, len(ids), [("s_a", 2, 1, 1), ("s_b", 1, 1, 2), ("s_idle", 3, 0, 1)]
    )
    gen = tiny_decode(
        target,
        pool,
        FixedTree(list(pool), ["s_a", "s_b"]),
        ids,
        max_new_tokens=MAX_NEW,
        draft_length=4,
        eos_ids=frozenset(),
    )
    assert pool["s_idle"].calls == 0
    assert pool["s_a"].calls == pool["s_b"].calls == len(gen.rounds)


class Env(Drafter):
    """A seeded environment: drafts the right continuation for ``good`` tokens (of 4)."""

    def __init__(self, name, ref, prompt_len, good):
        self.inner = Scripted(name, ref, prompt_len, good, 4 - good, 1)
        self.name = name

    def propose(self, tokens, k, sampling, rng, eos_ids=frozenset()):
        return self.inner.propose(tokens, k, sampling, rng, eos_ids)


@pytest.mark.parametrize(
    "make",
    [
        lambda arms: TreeUCB(arms, always=["s_always"], size=1, reward="be", beta=0.3),
        lambda arms: TreeHedge(arms, always=["s_always"], size=1, reward="be", eta=2.0, seed=3),
    ],
)
def test_subset_selectors_find_the_best_drafter(setup, tiny_llama_pool, tiny_decode, make):
    target, ids, ref = setup
    base = {k: v for k, v in tiny_llama_pool.items() if k == "autoregressive"}
    pool = dict(base)
    for name, good in (("s_always", 0), ("s_weak", 1), ("s_best", 4), ("s_mid", 2)):
        pool[name] = Env(name, ref, len(ids), good)
    selector = make(list(pool))
    gen = tiny_decode(target, pool, selector, ids, max_new_tokens=LONG, draft_length=4, eos_ids=frozenset())
    assert gen.tokens == ref[:LONG]
    chosen = [r.members[1] for r in gen.rounds]
    assert all(r.members[0] == "s_always" for r in gen.rounds)
    # after the first rounds the best drafter is in the tree nearly always
    late = chosen[3:]
    assert late and late.count("s_best") >= 0.75 * len(late), chosen


@pytest.mark.parametrize("min_match,expect", [(1, "prompt_lookup"), (4, "hf")])
def test_router_plays_lookup_on_a_long_match_else_the_fallback(
    setup, tiny_llama_pool, tiny_decode, min_match, expect
):
    target, ids, ref = setup
    router = Router(list(tiny_llama_pool), lookup="prompt_lookup", min_match=min_match, fallback="hf")
    gen = tiny_decode(
        target, tiny_llama_pool, router, ids, max_new_tokens=MAX_NEW, draft_length=3, eos_ids=frozenset()
    )
    assert gen.tokens == ref[:MAX_NEW]
    arms = [r.arm for r in gen.rounds]
    # prompt lookup matches at most max_ngram = 3 tokens: with min_match 4 it never plays
    assert (expect in arms) and (expect == "prompt_lookup" or "prompt_lookup" not in arms)


def test_router_fallback_ucb_finds_the_better_drafter(setup, tiny_llama_pool, tiny_decode):
    target, ids, ref = setup
    pool = {
        "autoregressive": tiny_llama_pool["autoregressive"],
        "prompt_lookup": tiny_llama_pool["prompt_lookup"],
    }
    for name, good in (("s_weak", 0), ("s_best", 4)):
        pool[name] = Env(name, ref, len(ids), good)
    router = Router(list(pool), min_match=4, ucb={"reward": "be", "beta": 0.3})
    gen = tiny_decode(target, pool, router, ids, max_new_tokens=LONG, draft_length=4, eos_ids=frozenset())
    assert gen.tokens == ref[:LONG]
    arms = [r.arm for r in gen.rounds][2:]
    assert arms.count("s_best") >= 0.75 * len(arms), arms


def test_tree_selectors_refuse_bad_members(tiny_llama_pool):
    arms = list(tiny_llama_pool)
    with pytest.raises(SpecbenchError, match="no arm named nope"):
        FixedTree(arms, ["prompt_lookup", "nope"])
    with pytest.raises(SpecbenchError, match="autoregressive arm drafts nothing"):
        FixedTree(arms, ["autoregressive", "hf"])
    with pytest.raises(SpecbenchError, match="size 9"):
        TreeUCB(arms, always=["prompt_lookup"], size=9)
    with pytest.raises(SpecbenchError, match="selector.min_match=0: expected an integer >= 1"):
        make_selector({"_target_": "specbench.selection.Router", "min_match": 0}, arms)


def test_encoder_decoder_targets_refuse_trees(tiny_t5_target):
    target = tiny_t5_target
    target.prefill(target.tokenizer("translate this")["input_ids"])
    with pytest.raises(SpecbenchError, match="decoder-only"):
        target.score_tree(build_tree({"a": [5, 6], "b": [7]}))


def test_router_tree_verifies_lookup_and_fallback_together_on_a_short_match(
    setup, tiny_llama_pool, tiny_decode
):
    target, ids, ref = setup
    router = Router(list(tiny_llama_pool), lookup="prompt_lookup", min_match=4, fallback="hf", tree=True)
    gen = tiny_decode(
        target, tiny_llama_pool, router, ids, max_new_tokens=MAX_NEW, draft_length=3, eos_ids=frozenset()
    )
    assert gen.tokens == ref[:MAX_NEW]
    # min_match 4 > max_ngram: every round is the fallback tree, which keeps prompt lookup's draft
    assert all(r.members == ["prompt_lookup", "hf"] for r in gen.rounds)
    assert any(
        r.tree_size > 3 for r in gen.rounds
    )  # hf drafts at most 3: prompt lookup's draft was in the tree


@pytest.mark.parametrize("arch", ["llama", "qwen2", "gemma2"])
def test_tree_rows_equal_chains_in_each_decoder_family(arch):
    """The paper-scale families (Llama / Vicuna, Qwen2, Gemma-2) take the tree mask and depths: each path's
    rows equal a chain forward over it, and after the round the cache equals a fresh forward."""
    from specbench.models import Target
    from specbench.models.loading import LoadedModel
    from specbench.models.tiny import byte_tokenizer, tiny_model

    tok = byte_tokenizer()
    target = Target(LoadedModel(tiny_model(arch, tok, layers=2, hidden=32, seed=5), tok, f"tiny {arch}"))
    ids = tok("Trees verify several drafts at once.")["input_ids"]
    target.prefill(ids)
    tree = build_tree({"a": [50, 51, 52], "b": [50, 60], "c": [70, 71]})
    logits = target.score_tree(tree).logits
    for member, path in tree.paths.items():
        expected = fresh_logits(target.model, target.tokens + [tree.tokens[n] for n in path])[
            -(len(path) + 1) :
        ]
        assert torch.allclose(logits[tree.rows(path)], expected, atol=1e-4, rtol=1e-4), (arch, member)
    path = tree.paths["b"]
    target.commit_tree(path, [tree.tokens[n] for n in path] + [65])
    got = target.score([3]).logits
    assert torch.allclose(got, fresh_logits(target.model, target.tokens + [3])[-2:], atol=1e-4, rtol=1e-4)
