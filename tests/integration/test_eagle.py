"""The ``eagle`` drafter kind (EAGLE-1 feature-level draft head) on the tiny Llama target.

- greedy decoding with a head equals autoregressive decoding, with and without a sub-vocabulary,
  across draft lengths and while switching with other drafters;
- sampling with a head reproduces the target's two-token law;
- the head's cache rolls back after partial acceptance (its drafts equal a fresh head's);
- a checkpoint round-trips, the published EAGLE-1 layout loads (``pytorch_model.bin``, no
  input norm in layer 0, an ``embed_tokens`` tensor that is ignored), and a head trained for
  another vocabulary is refused with a message naming both targets.
"""

from __future__ import annotations

import json
from collections import Counter

import pytest
import torch

from specbench.decoding.drafter import AUTOREGRESSIVE, DecodeContext
from specbench.decoding.sampling import SamplingParams
from specbench.drafters import build_pool
from specbench.drafters.eagle import EagleHead, build
from specbench.drafters.head_files import save_head, vocab_fingerprint
from specbench.errors import SpecbenchError

PROMPTS = ["The quick brown fox jumps over the lazy dog. The quick brown", "Speculative decoding: 1, 2, 3,"]
# The EAGLE-1 checkpoint layout for one Llama decoder layer (SafeAILab/EAGLE model/cnets.py):
# layer 0 has no input_layernorm, the head has no final norm.
EAGLE1_KEYS = {
    "fc.weight",
    "fc.bias",
    "layers.0.self_attn.q_proj.weight",
    "layers.0.self_attn.k_proj.weight",
    "layers.0.self_attn.v_proj.weight",
    "layers.0.self_attn.o_proj.weight",
    "layers.0.mlp.gate_proj.weight",
    "layers.0.mlp.up_proj.weight",
    "layers.0.mlp.down_proj.weight",
    "layers.0.post_attention_layernorm.weight",
}


def near_target_head(target, seed=0, noise=0.02) -> EagleHead:
    """A head that passes the target's feature through (fc = [0 | I], residual branches near zero), so
    it drafts roughly what the target predicted one position earlier: overlapping but not equal."""
    torch.manual_seed(seed)
    head = EagleHead(target.model, layers=1)
    hidden = target.config.hidden_size
    with torch.no_grad():
        head.fc.weight.zero_()
        head.fc.weight[:, hidden:] = torch.eye(hidden)
        head.fc.weight.add_(noise * torch.randn_like(head.fc.weight))
        head.fc.bias.zero_()
        layer = head.layers[0]
        layer.self_attn.o_proj.weight.mul_(0.1)
        layer.mlp.down_proj.weight.mul_(0.1)
    return head.eval()


def write_head(tmp_path, target, name="head", d2t=None, meta=None, seed=0):
    path = tmp_path / name
    save_head(
        near_target_head(target, seed),
        d2t,
        path,
        meta
        if meta is not None
        else {"kind": "eagle", "target": "embedded:tiny_llama", "vocab": vocab_fingerprint(target.tokenizer)},
    )
    return path


@pytest.fixture(scope="module")
def eagle_pool(tiny_llama_target, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("eagle")
    target = tiny_llama_target
    full = write_head(tmp, target, "full")
    sub_ids = torch.arange(3, 3 + 200)  # a sub-vocabulary of 200 of the 259 ids (ASCII bytes among them)
    sub = write_head(tmp, target, "sub", d2t=sub_ids)
    pool = build_pool(
        target,
        {
            "eagle": {"_target_": "specbench.drafters.eagle.build", "checkpoint": str(full)},
            "eagle_sub": {"_target_": "specbench.drafters.eagle.build", "checkpoint": str(sub)},
            "eagle_dynamic": {
                "_target_": "specbench.drafters.eagle.build",
                "checkpoint": str(full),
                "confidence_threshold": 0.3,
            },
            "prompt_lookup": {"_target_": "specbench.drafters.prompt_lookup.build"},
        },
    )
    return target, pool


@pytest.mark.parametrize("draft_length", [1, 3, 5])
@pytest.mark.parametrize("arm", ["eagle", "eagle_sub", "eagle_dynamic"])
def test_greedy_equals_autoregressive(eagle_pool, tiny_decode, arm, draft_length):
    target, pool = eagle_pool
    for text in PROMPTS:
        prompt = target.tokenizer(text)["input_ids"]
        ref = tiny_decode(target, pool, AUTOREGRESSIVE, prompt, max_new_tokens=30)
        gen = tiny_decode(target, pool, arm, prompt, max_new_tokens=30, draft_length=draft_length)
        assert gen.tokens == ref.tokens
        assert gen.drafted > 0
        assert gen.accepted > 0, text  # the pass-through head is a real drafter, not noise, on every prompt


def test_confidence_threshold_shortens_drafts(eagle_pool, tiny_decode):
    """A dynamic draft length: the head stops after a token it doubts, so it drafts fewer tokens per
    round than with the threshold off (same head)."""
    target, pool = eagle_pool
    prompt = target.tokenizer(PROMPTS[0])["input_ids"]
    fixed = tiny_decode(target, pool, "eagle", prompt, max_new_tokens=30, draft_length=5)
    dynamic = tiny_decode(target, pool, "eagle_dynamic", prompt, max_new_tokens=30, draft_length=5)
    per_round = lambda g: g.drafted / sum(1 for r in g.rounds if r.drafted)  # noqa: E731
    assert per_round(dynamic) < per_round(fixed)


def test_sub_vocabulary_drafts_only_its_tokens(eagle_pool, tiny_decode):
    target, pool = eagle_pool
    prompt = target.tokenizer(PROMPTS[0])["input_ids"]
    gen = tiny_decode(target, pool, "eagle_sub", prompt, max_new_tokens=20)
    assert gen.drafted > 0
    d = pool["eagle_sub"]
    d.sync(d._query, list(target.tokens))
    draft = d.propose(
        list(target.tokens), 4, SamplingParams(temperature=1.0), torch.Generator().manual_seed(0)
    )
    allowed = set(range(3, 203))
    assert draft.tokens and set(draft.tokens) <= allowed
    outside = torch.ones(target.vocab_size, dtype=torch.bool)
    outside[list(allowed)] = False
    assert float(draft.probs[:, outside].abs().max()) == 0.0  # q lives in the full vocabulary, 0 outside
    torch.testing.assert_close(draft.probs.sum(-1), torch.ones(len(draft.tokens)))


def test_switching_with_other_drafters_stays_exact(eagle_pool, tiny_decode):
    """The head idles while other arms play, then catches up from the recorded target features."""
    from specbench.selection.base import Selector

    class Cycle(Selector):
        def __init__(self, arms):
            super().__init__(arms)
            self.i = 0

        def select(self):
            self.i += 1
            return ["eagle", AUTOREGRESSIVE, "prompt_lookup", "eagle_sub", "eagle"][self.i % 5]

    target, pool = eagle_pool
    prompt = target.tokenizer(PROMPTS[1])["input_ids"]
    ref = tiny_decode(target, pool, AUTOREGRESSIVE, prompt, max_new_tokens=40)
    gen = tiny_decode(target, pool, Cycle(list(pool)), prompt, max_new_tokens=40)
    assert gen.tokens == ref.tokens and gen.switches > 0


def test_cache_rolls_back_after_partial_acceptance(eagle_pool, tiny_decode):
    """After a generation with rejections, the head's next draft equals that of a head that starts the
    same committed sequence from scratch."""
    target, pool = eagle_pool
    prompt = target.tokenizer(PROMPTS[0])["input_ids"]
    gen = tiny_decode(target, pool, "eagle", prompt, max_new_tokens=25, draft_length=4)
    assert any(r.accepted < r.drafted for r in gen.rounds)  # some draft was cut short
    d = pool["eagle"]
    committed = list(target.tokens)
    ctx = d._query
    d.sync(ctx, committed)
    warm = d.propose(committed, 4, SamplingParams(), torch.Generator().manual_seed(0))
    fresh_ctx = DecodeContext()
    fresh_ctx.record_states({d.layer: ctx.states(d.layer)}, rows=len(committed) - 1, start=0)
    d.sync(fresh_ctx, committed)
    cold = d.propose(committed, 4, SamplingParams(), torch.Generator().manual_seed(0))
    assert warm.tokens == cold.tokens
    torch.testing.assert_close(warm.probs, cold.probs, atol=1e-4, rtol=1e-4)


@pytest.mark.slow  # 35 s: the heads' law in the slow set (its greedy equality in make test)
def test_sampling_law_matches_target(eagle_pool, tiny_decode):
    from tests.integration.test_sampling_lossless import SAMPLING, check_law, exact_two_token_law

    target, pool = eagle_pool
    # a repetitive prompt: the pass-through head's guess (the target's previous prediction) then overlaps
    # the target's top-4, so drafts are both accepted and rejected
    prompt = target.tokenizer("ab" * 12)["input_ids"]
    law = exact_two_token_law(target, prompt)
    rng = torch.Generator().manual_seed(7)
    counts: Counter = Counter()
    accepted = 0
    runs = 3000
    for _ in range(runs):
        gen = tiny_decode(
            target,
            pool,
            "eagle_sub",
            prompt,
            max_new_tokens=2,
            draft_length=4,
            sampling=SAMPLING,
            eos_ids=frozenset(),
            rng=rng,
        )
        counts[tuple(gen.tokens)] += 1
        accepted += gen.accepted
    assert 0 < accepted < runs  # both verification branches are exercised
    check_law(counts, law, runs)


def test_checkpoint_round_trip(tiny_llama_target, tmp_path):
    target = tiny_llama_target
    path = write_head(tmp_path, target, d2t=torch.arange(10, 60))
    d = build(target, "e", checkpoint=str(path))
    again = tmp_path / "again"
    save_head(d.head, d.logits.d2t, again, {"kind": "eagle", "vocab": vocab_fingerprint(target.tokenizer)})
    d2 = build(target, "e2", checkpoint=str(again))
    for a, b in zip(d.head.state_dict().values(), d2.head.state_dict().values()):
        torch.testing.assert_close(a, b)
    assert d2.logits.d2t.tolist() == list(range(10, 60))
    assert 0 < d.cost < 1


def test_foreign_target_is_refused(tiny_llama_target, tmp_path):
    path = write_head(
        tmp_path,
        tiny_llama_target,
        meta={"kind": "eagle", "target": "lmsys/vicuna-7b-v1.3", "vocab": "0123456789abcdef"},
    )
    with pytest.raises(SpecbenchError, match="vicuna-7b-v1.3") as err:
        build(tiny_llama_target, "e", checkpoint=str(path))
    assert "tiny_llama" in str(err.value.problem)


def test_missing_checkpoint_names_the_make_target(tiny_llama_target, tmp_path):
    with pytest.raises(SpecbenchError) as err:
        build(tiny_llama_target, "e", checkpoint=str(tmp_path / "nope"), make_target="make specialists")
    assert "make specialists" in err.value.fix


def test_eagle1_layout_loads(tiny_llama_target, tmp_path, tiny_decode):
    """A head stored as EAGLE-1 publishes it: pytorch_model.bin with fc.* / layers.* (+ embed_tokens),
    a plain Llama config.json, no specbench metadata."""
    target = tiny_llama_target
    head = near_target_head(target, seed=3)
    state = {k: v.clone() for k, v in head.state_dict().items()}
    assert set(state) == EAGLE1_KEYS
    state["embed_tokens.weight"] = torch.zeros(target.vocab_size, target.config.hidden_size)
    path = tmp_path / "eagle1"
    path.mkdir()
    torch.save(state, path / "pytorch_model.bin")
    config = target.config.to_dict()
    config["num_hidden_layers"] = 1
    (path / "config.json").write_text(json.dumps(config, default=str))
    d = build(target, "e", checkpoint=str(path))
    for k, v in d.head.state_dict().items():
        torch.testing.assert_close(v, state[k])
    prompt = target.tokenizer(PROMPTS[1])["input_ids"]
    pool = {**build_pool(target, {}), "e": d}
    ref = tiny_decode(target, pool, AUTOREGRESSIVE, prompt, max_new_tokens=20)
    assert tiny_decode(target, pool, "e", prompt, max_new_tokens=20).tokens == ref.tokens
