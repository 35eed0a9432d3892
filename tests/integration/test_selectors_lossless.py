"""Every selector config decodes losslessly on both tiny families.

Each ``conf/selector/*.yaml`` is composed the way ``methods=[selector:<name>]`` composes it
(``specbench.pipelines.methods.parse_methods``: the option with its defaults list, instantiated over
the pool's arms), ``policy`` with a random policy checkpoint written for the family's target. It
then decodes greedily on the tiny Llama and the tiny T5 with every drafter kind in the pool, over
several prompts one after another (so selectors that learn within a query, or across queries, play
more than one arm), and its output ids must equal the autoregressive arm's.
"""

from __future__ import annotations

import pytest
import torch

from specbench.configs import group_options
from specbench.pipelines.methods import parse_methods

PROMPTS = [
    "The quick brown fox jumps over the lazy dog. The quick brown",
    "abc abc abc abc",
    "Translate to German: the house is small.",
    "1 + 1 = 2, 2 + 2 = 4, 3 + 3 =",
]
MAX_NEW = 24
DRAFT_LENGTH = 3
SELECTORS = group_options("selector")
# options whose drafter names are the real pools' (quantized, the retrieval drafter with memory, the generalist
# head): the tiny pool's own (prompt lookup has no scores, so router_suffix's bar is 0 here)
TINY_NAMES = {
    "fixed": {"arm": "quantized_dynamic"},
    "budget": {"retrieval": "prompt_lookup"},
    "budget_by_task": {"retrieval": "prompt_lookup"},
    "budget_by_query": {"retrieval": "prompt_lookup"},
    "budget_kept": {"retrieval": "prompt_lookup"},
    "router_sam": {"lookup": "prompt_lookup", "fallback": "hf", "min_match": 1},
    "router_suffix": {"lookup": "prompt_lookup", "fallback": "hf", "min_expected": 0.0},
}


def test_every_selector_config_is_covered():
    assert len(SELECTORS) >= 13 and {"epsilon_greedy", "policy", "ucb", "exp3", "fixed"} <= set(SELECTORS)


def policy_root(setup, tmp_path):
    """A run-config stand-in whose ``policy.checkpoint`` is a random policy over the pool's arms."""
    from omegaconf import OmegaConf

    from specbench.policy.checkpoint import save_checkpoint
    from specbench.policy.model import Policy
    from specbench.policy.net import PolicyNet

    cfg = setup.model.config
    dim = int(getattr(cfg, "hidden_size", None) or cfg.d_model)
    arms = list(setup.pool)
    policy = Policy(
        model=PolicyNet(dim, len(arms), generator=torch.Generator().manual_seed(3)),
        mean=torch.zeros(dim),
        std=torch.ones(dim),
        arms=arms,
    )
    target = f"embedded:{setup.family}"
    path = save_checkpoint(
        tmp_path / "policy.pt",
        policy,
        arms=arms,
        alpha=0.5,
        config={},
        embedding={"pooling": "mean", "source": "decoder_last_hidden", "dim": dim, "target": target},
    )
    return OmegaConf.create({"policy": {"checkpoint": str(path)}, "target": {"model": target}})


@pytest.fixture(scope="module")
def autoregressive(tiny_setup, tiny_decode):
    return [
        tiny_decode(
            tiny_setup.target,
            tiny_setup.pool,
            "autoregressive",
            tiny_setup.tokenizer(text)["input_ids"],
            max_new_tokens=MAX_NEW,
            draft_length=1,
        ).tokens
        for text in PROMPTS
    ]


@pytest.mark.parametrize("name", SELECTORS)
def test_selector_config_decodes_like_autoregressive(tiny_setup, tiny_decode, autoregressive, tmp_path, name):
    setup = tiny_setup
    root = policy_root(setup, tmp_path) if name == "policy" else None
    if name in TINY_NAMES:  # the options name pool keys of the real pools: the tiny pool's own
        from omegaconf import OmegaConf

        root = OmegaConf.create({"selector_overrides": TINY_NAMES[name]})
    methods = parse_methods([f"selector:{name}"], setup.pool, None, root=root)
    assert [m.name for m in methods][0] == "autoregressive" and len(methods) == 2
    selector = methods[1].make_selector()  # one selector for the whole stream, as a run keeps per method
    if (
        selector.trees and setup.target.is_encoder_decoder
    ):  # token trees: decoder-only targets, refused up front
        from specbench.errors import SpecbenchError

        with pytest.raises(SpecbenchError, match="needs a decoder-only target"):
            tiny_decode(setup.target, setup.pool, selector, setup.tokenizer(PROMPTS[0])["input_ids"])
        return
    played = set()
    for text, expected in zip(PROMPTS, autoregressive):
        gen = tiny_decode(
            setup.target,
            setup.pool,
            selector,
            setup.tokenizer(text)["input_ids"],
            max_new_tokens=MAX_NEW,
            draft_length=DRAFT_LENGTH,
        )
        assert gen.tokens == expected, (name, text)
        assert sum(r.emitted for r in gen.rounds) == len(gen.tokens)
        played |= {a for r in gen.rounds for a in (r.members or [r.arm])}  # a tree round plays its members
    assert played <= set(setup.pool)
    if name not in ("fixed", "policy", "random_per_query"):  # those keep one arm per query by design
        assert len(played) >= 2, f"{name} played only {played}: its switching was not exercised"
