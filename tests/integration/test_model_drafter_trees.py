"""Dynamic draft trees inside model drafters that run on their own KV cache (an HF model, an early exit, an int8
copy: ``ModelDrafter``), on the tiny Llama target in fp32.

- greedy decoding with each kind's dynamic tree equals autoregressive decoding, and real trees are drafted;
- width 1 is the chain (same rounds, same drafts);
- tree attention inside the drafter is right: the distribution each node's children came from equals the drafter's
  after a plain chain forward over the node's path, and the drafter's cache holds only committed tokens afterwards;
- under sampling the target's two-token law holds (slow set);
- an encoder-decoder drafter and a bad ``tree`` are refused before decoding.
"""

from __future__ import annotations

import pytest
import torch

from specbench.decoding.drafter import AUTOREGRESSIVE, DecodeContext
from specbench.decoding.sampling import SamplingParams, logits_to_probs
from specbench.drafters import build_pool
from specbench.drafters.dynamic_tree import ancestors
from specbench.errors import SpecbenchError
from tests.conftest import tiny_drafter_configs
from tests.integration.test_dynamic_trees import two_token_law
from tests.integration.test_eagle import PROMPTS

KINDS = ("hf", "early_exit", "quantized_dynamic")


@pytest.fixture(scope="module")
def model_tree_pool(tiny_llama_target):
    configs = tiny_drafter_configs("tiny_llama", KINDS)
    trees = {f"{k}_tree": {**cfg, "tree": {"width": 3, "nodes": 10}} for k, cfg in configs.items()}
    one = {"hf_width1": {**configs["hf"], "tree": {"width": 1, "nodes": 8}}}
    return tiny_llama_target, build_pool(tiny_llama_target, {**configs, **trees, **one})


@pytest.mark.parametrize("kind", KINDS)
def test_greedy_model_drafter_tree_equals_autoregressive(model_tree_pool, tiny_decode, kind):
    target, pool = model_tree_pool
    for text in PROMPTS:
        prompt = target.tokenizer(text)["input_ids"]
        ref = tiny_decode(target, pool, AUTOREGRESSIVE, prompt, max_new_tokens=30)
        gen = tiny_decode(target, pool, f"{kind}_tree", prompt, max_new_tokens=30, draft_length=4)
        assert gen.tokens == ref.tokens
        assert max(r.drafted for r in gen.rounds) > 4  # real trees, not chains


def test_width_one_is_the_chain(model_tree_pool, tiny_decode):
    target, pool = model_tree_pool
    prompt = target.tokenizer(PROMPTS[0])["input_ids"]
    chain = tiny_decode(target, pool, "hf", prompt, max_new_tokens=30, draft_length=4)
    one = tiny_decode(target, pool, "hf_width1", prompt, max_new_tokens=30, draft_length=4)
    assert [(r.drafted, r.accepted) for r in one.rounds] == [(r.drafted, r.accepted) for r in chain.rounds]


@pytest.mark.parametrize("kind", ["hf", "early_exit"])
def test_each_node_is_drawn_from_the_drafters_chain_distribution(model_tree_pool, kind):
    target, pool = model_tree_pool
    drafter = pool[f"{kind}_tree"]
    tokens = target.tokenizer(PROMPTS[1])["input_ids"]
    drafter.sync(DecodeContext(), tokens)
    draft = drafter.propose(tokens, 4, SamplingParams(), torch.Generator().manual_seed(0))
    assert draft.parents is not None and len(draft.tokens) > 4
    assert drafter.lm.cached == tokens  # the tree's rows are gone: only committed tokens stay cached
    for i in range(len(draft.tokens)):
        path = [draft.tokens[a] for a in reversed(ancestors(draft.parents, i))] + [draft.tokens[i]]
        want = logits_to_probs(drafter.lm.sync(tokens + path), SamplingParams())
        for c in (c for c, p in enumerate(draft.parents) if p == i):
            torch.testing.assert_close(draft.probs[c], want, atol=2e-5, rtol=1e-4)
    drafter.lm.crop(len(tokens))


@pytest.mark.slow  # 15 s
def test_sampling_law_with_a_model_drafters_tree(model_tree_pool):
    target, pool = model_tree_pool
    accepted = two_token_law(target, pool, "quantized_dynamic_tree", seed=13)
    assert 0 < accepted < 3000


def test_model_drafter_tree_is_refused_where_it_cannot_attend(tiny_t5_target, tiny_llama_target):
    hf_t5 = tiny_drafter_configs("tiny_t5", ("hf",))["hf"]
    with pytest.raises(SpecbenchError, match="decoder-only drafter"):
        build_pool(tiny_t5_target, {"d": {**hf_t5, "tree": {"width": 2, "nodes": 4}}})
    hf = tiny_drafter_configs("tiny_llama", ("hf",))["hf"]
    with pytest.raises(SpecbenchError, match="tree.width"):
        build_pool(tiny_llama_target, {"d": {**hf, "tree": {"width": 0, "nodes": 4}}})
