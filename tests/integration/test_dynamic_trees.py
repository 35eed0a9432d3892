"""Dynamic draft trees inside a draft head (EAGLE-2 layout) on the tiny Llama target, fp32.

- greedy decoding with a head's dynamic tree equals autoregressive decoding (full and sub-vocabulary heads,
  several depths and sizes);
- the tree's attention inside the head is right: every node's children were drawn from exactly the head's
  distribution after a chain forward over that node's path;
- greedy: width 1 is the chain (same rounds, same drafts); a wider tree keeps at least the chain's tokens a round
  on a repetitive prompt where the head's top-1 often misses;
- sampling with a dynamic tree reproduces the target's two-token law.
"""

from __future__ import annotations

from collections import Counter

import pytest
import torch

from specbench.decoding.drafter import AUTOREGRESSIVE, DecodeContext
from specbench.decoding.sampling import SamplingParams, logits_to_probs
from specbench.drafters import build_pool
from specbench.drafters.dynamic_tree import ancestors
from specbench.errors import SpecbenchError
from specbench.pipelines.methods import make_selector
from tests.integration.test_eagle import PROMPTS, write_head


@pytest.fixture(scope="module")
def tree_pool(tiny_llama_target, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("dyn")
    target = tiny_llama_target
    full = write_head(tmp, target, "full")
    sub = write_head(tmp, target, "sub", d2t=torch.arange(3, 3 + 200))
    kind = "specbench.drafters.eagle.build"
    pool = build_pool(
        target,
        {
            "chain": {"_target_": kind, "checkpoint": str(full)},
            "width1": {"_target_": kind, "checkpoint": str(full), "tree": {"width": 1, "nodes": 8}},
            "tree": {"_target_": kind, "checkpoint": str(full), "tree": {"width": 3, "nodes": 10}},
            "tree_sub": {"_target_": kind, "checkpoint": str(sub), "tree": {"width": 2, "nodes": 6}},
            "tree_wide": {"_target_": kind, "checkpoint": str(full), "tree": {"width": 4, "nodes": 24}},
        },
    )
    return target, pool


@pytest.mark.parametrize("draft_length", [1, 3, 5])
@pytest.mark.parametrize("arm", ["tree", "tree_sub", "tree_wide"])
def test_greedy_dynamic_tree_equals_autoregressive(tree_pool, tiny_decode, arm, draft_length):
    target, pool = tree_pool
    for text in PROMPTS:
        prompt = target.tokenizer(text)["input_ids"]
        ref = tiny_decode(target, pool, AUTOREGRESSIVE, prompt, max_new_tokens=30)
        gen = tiny_decode(target, pool, arm, prompt, max_new_tokens=30, draft_length=draft_length)
        assert gen.tokens == ref.tokens
        assert gen.accepted > 0
        if draft_length > 1:
            assert max(r.drafted for r in gen.rounds) > draft_length  # real trees, not chains


def test_width_one_is_the_chain(tree_pool, tiny_decode):
    target, pool = tree_pool
    prompt = target.tokenizer(PROMPTS[0])["input_ids"]
    chain = tiny_decode(target, pool, "chain", prompt, max_new_tokens=30, draft_length=4)
    one = tiny_decode(target, pool, "width1", prompt, max_new_tokens=30, draft_length=4)
    assert [(r.drafted, r.accepted) for r in one.rounds] == [(r.drafted, r.accepted) for r in chain.rounds]


def test_wider_tree_keeps_more_tokens_per_round(tree_pool, tiny_decode):
    target, pool = tree_pool
    prompt = target.tokenizer(PROMPTS[0])["input_ids"]
    chain = tiny_decode(target, pool, "chain", prompt, max_new_tokens=40, draft_length=4)
    wide = tiny_decode(target, pool, "tree_wide", prompt, max_new_tokens=40, draft_length=4)
    assert wide.tokens == chain.tokens
    assert len(wide.rounds) < len(chain.rounds)


@pytest.mark.parametrize("arm", ["tree", "tree_sub"])
def test_each_node_is_drawn_from_the_heads_chain_distribution(tree_pool, arm):
    """Tree attention inside the head: the distribution a node's children came from equals the head's after a
    plain chain forward over that node's path (the head's ``chain``), for every node."""
    with torch.inference_mode():
        _check_node_distributions(*tree_pool, arm)


def _check_node_distributions(target, pool, arm):
    head = pool[arm]
    prompt = target.tokenizer(PROMPTS[1])["input_ids"]
    query = DecodeContext()
    pre = target.prefill(prompt, layers=(head.layer,))
    query.record_states(pre.states, rows=len(target.tokens) - 1, start=0)
    head.sync(query, target.tokens)
    draft = head.propose(target.tokens, 4, SamplingParams(), torch.Generator().manual_seed(0))
    assert draft.parents is not None and len(draft.tokens) > 4
    for i, parent in enumerate(draft.parents):
        path = [draft.tokens[a] for a in reversed(ancestors(draft.parents, i))] + [draft.tokens[i]]
        hs = head.chain(
            query, target.tokens, path + [0]
        )  # row j drafts position j: the last row follows the path
        want = head.distributions(head.logits(hs[-1:]), SamplingParams())[0][0]
        children = [c for c, p in enumerate(draft.parents) if p == i]
        for c in children:
            torch.testing.assert_close(draft.probs[c], want, atol=2e-5, rtol=1e-4)
        # and the node's own score is the product of the head's probabilities along its path
        first = head.distributions(head.logits(hs[:1]), SamplingParams())[0][0]
        if parent < 0:
            assert draft.scores[i] == pytest.approx(float(first[draft.tokens[i]]), rel=1e-4)


def test_tree_config_is_checked(tiny_llama_target, tmp_path):
    path = write_head(tmp_path, tiny_llama_target, "h")
    for bad in ({"width": 0, "nodes": 4}, {"width": 2}, {"width": 2, "nodes": 3, "depth": 4}, "wide"):
        with pytest.raises(SpecbenchError, match="tree"):
            build_pool(
                tiny_llama_target,
                {"h": {"_target_": "specbench.drafters.eagle.build", "checkpoint": str(path), "tree": bad}},
            )


def two_token_law(target, pool, selector, seed: int, runs: int = 3000) -> int:
    """Decode two sampled tokens ``runs`` times with ``selector`` after a repetitive prompt (the pass-through head's
    guesses then overlap the target's top tokens) and check their law against the target's exact one; returns the
    draft tokens accepted in all."""
    from tests.integration.test_sampling_lossless import SAMPLING, check_law, exact_two_token_law

    prompt = target.tokenizer("ab" * 12)["input_ids"]
    law = exact_two_token_law(target, prompt)
    rng = torch.Generator().manual_seed(seed)
    counts: Counter = Counter()
    accepted = 0
    for _ in range(runs):
        gen = _decode_stream(
            target, pool, selector, prompt, None, max_new_tokens=2, sampling=SAMPLING, rng=rng, draft_length=3
        )
        counts[tuple(gen.tokens)] += 1
        accepted += gen.accepted
    check_law(counts, law, runs)
    return accepted


@pytest.mark.slow  # 15 s
def test_sampling_law_with_dynamic_trees(tree_pool):
    target, pool = tree_pool
    accepted = two_token_law(target, pool, "tree_sub", seed=11)
    assert 0 < accepted < 3000  # both verification branches are exercised


@pytest.fixture(scope="module")
def retrieval_pool(tree_pool, tiny_llama_target):
    target, pool = tree_pool
    extra = build_pool(
        target,
        {
            "suffix": {"_target_": "specbench.drafters.suffix.build", "tree": {"width": 3, "nodes": 12}},
            "suffix_chain": {"_target_": "specbench.drafters.suffix.build", "tree": None},
        },
    )
    return target, {**pool, **{k: v for k, v in extra.items() if k.startswith("suffix")}}


def _decode_stream(
    target, pool, selector, prompt, stream, max_new_tokens=30, sampling=None, rng=None, draft_length=6
):
    from specbench.decoding.loop import DecodeSpec, Limits, decode
    from specbench.selection import Fixed
    from specbench.timing import Clock

    if isinstance(selector, str):
        selector = Fixed(list(pool), selector)
    spec = DecodeSpec(
        sampling or SamplingParams(),
        Limits(max_new_tokens=max_new_tokens, draft_length=draft_length),
        frozenset({int(target.tokenizer.eos_token_id)}),
        Clock(),
        None,
        stream,
    )
    return decode(target, pool, selector, list(prompt), spec, rng or torch.Generator().manual_seed(0))


@pytest.mark.parametrize("arm", ["suffix", "suffix_chain"])
def test_greedy_suffix_with_memory_equals_autoregressive(retrieval_pool, tiny_decode, arm):
    """Two passes over the prompts in one stream: the second pass drafts from the memory of the first (far more
    accepted tokens) and every output still equals autoregressive decoding."""
    target, pool = retrieval_pool
    prompts = [target.tokenizer(t)["input_ids"] for t in PROMPTS]
    refs = [tiny_decode(target, pool, AUTOREGRESSIVE, p, max_new_tokens=30).tokens for p in prompts]
    accepted = []
    for _ in range(2):
        total = 0
        for p, ref in zip(prompts, refs):
            gen = _decode_stream(target, pool, arm, p, stream=f"test:{arm}")
            assert gen.tokens == ref
            total += gen.accepted
        accepted.append(total)
    assert accepted[1] > accepted[0] + 10, accepted


@pytest.mark.slow
def test_sampling_law_retrieval_tree_first_then_head_tree(retrieval_pool):
    """Production order: the retrieval drafter's deterministic branches first, then a head's sampled dynamic tree,
    in one token tree: the target's two-token law holds."""
    from specbench.selection import FixedTree

    target, pool = retrieval_pool
    two_token_law(target, pool, FixedTree(list(pool), ["suffix", "tree_sub"]), seed=5)


def test_budget_greedy_equals_autoregressive_and_records_its_plan(retrieval_pool, tiny_decode):
    from specbench.selection import Budget

    target, pool = retrieval_pool
    selector = Budget(list(pool), retrieval="suffix", models=["tree", "chain"], max_nodes=10)
    played = set()
    for _ in range(2):
        for text in PROMPTS:
            prompt = target.tokenizer(text)["input_ids"]
            ref = tiny_decode(target, pool, AUTOREGRESSIVE, prompt, max_new_tokens=30)
            gen = _decode_stream(target, pool, selector, prompt, stream="budget")
            assert gen.tokens == ref.tokens
            assert all(r.expected is not None and r.predicted_s > 0 for r in gen.rounds)
            assert all(r.drafted <= 10 for r in gen.rounds)
            played |= {r.arm for r in gen.rounds}
    assert any(a.startswith("tree:") or a in ("tree", "chain") for a in played), played
    cal = selector.calibration["tree"]
    assert sum(cal.trials.values()) > 0  # every verified node whose parent was accepted is an observation


@pytest.mark.slow
def test_budget_sampling_law(retrieval_pool):
    from specbench.selection import Budget

    target, pool = retrieval_pool
    two_token_law(
        target,
        pool,
        Budget(list(pool), retrieval="suffix", models=["tree_sub"], calibration={"optimism": 5.0}),
        seed=3,
    )


def test_budget_refuses_unknown_drafters(retrieval_pool):
    from specbench.selection import Budget

    _, pool = retrieval_pool
    with pytest.raises(SpecbenchError, match="retrieval"):
        Budget(list(pool), retrieval="nope")
    with pytest.raises(SpecbenchError, match="model drafter"):
        Budget(list(pool), retrieval="suffix", models=["autoregressive"])


def test_flash_attention_is_refused_before_decoding():
    """Trees need a custom 4D mask: a model running a flash-attention kernel is refused before decoding (tree
    selectors by check_trees; tree drafters at build, through the same check), eager and sdpa pass."""
    from types import SimpleNamespace

    from specbench.decoding.loop import check_trees
    from specbench.models.cache import check_tree_attention
    from specbench.selection import FixedTree

    def model(impl):
        return SimpleNamespace(config=SimpleNamespace(_attn_implementation=impl))

    for impl in ("eager", "sdpa"):
        check_tree_attention(model(impl), "x")
    with pytest.raises(SpecbenchError, match="4D mask") as err:
        check_tree_attention(model("flash_attention_2"), "drafter 'h' (tree)")
    assert "sdpa" in err.value.fix
    target = SimpleNamespace(is_encoder_decoder=False, model=model("flash_attention_2"))
    with pytest.raises(SpecbenchError, match="method 'tree:a.b'.*4D mask"):
        check_trees(FixedTree(["a", "b", AUTOREGRESSIVE], ["a", "b"]), target, "tree:a+b")
    check_trees(FixedTree(["a", "b", AUTOREGRESSIVE], ["a"]), target, "fixed:a")  # one draft a round: no tree


def test_router_by_expected_tokens(retrieval_pool, tiny_decode):
    """SuffixDecoding's hybrid: the retrieval draft plays only when its own expected accepted tokens reach the bar;
    with an unreachable bar every round falls back to the head, and outputs stay exact either way."""
    from specbench.selection import Router

    target, pool = retrieval_pool
    prompt = target.tokenizer(PROMPTS[0])["input_ids"]
    ref = tiny_decode(target, pool, AUTOREGRESSIVE, prompt, max_new_tokens=30)
    arms = {}
    for bar in (0.0, 1000.0):
        router = Router(list(pool), lookup="suffix_chain", min_match=1, fallback="chain", min_expected=bar)
        gen = _decode_stream(target, pool, router, prompt, None)
        assert gen.tokens == ref.tokens
        arms[bar] = {r.arm for r in gen.rounds}
    assert "suffix_chain" in arms[0.0] and arms[1000.0] == {"chain"}
    bad = {
        "_target_": "specbench.selection.Router",
        "lookup": "suffix",
        "fallback": "chain",
        "min_expected": -1,
    }
    with pytest.raises(
        SpecbenchError, match="selector.min_expected=-1: expected a finite number >= 0 or null"
    ):
        make_selector(bad, list(pool))


def test_trace_refuses_tree_drafters(retrieval_pool):
    from specbench.decoding.trace import check_chains

    _, pool = retrieval_pool
    with pytest.raises(SpecbenchError, match="tree=null"):
        check_chains(pool, {"suffix": 4, "chain": 4})
    check_chains(pool, {"suffix_chain": 4, "chain": 4})
