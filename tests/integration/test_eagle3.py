"""The ``eagle3`` drafter kind (EAGLE-3 heads) on the tiny Llama target, from tiny random checkpoints
written in both published layouts: SafeAILab/EAGLE (``midlayer.*``, ``draft_vocab_size``, aux ids under
``eagle_config``, the target's embeddings) and vLLM ``speculators`` (``speculators_model_type: eagle3``,
``transformer_layer_config``, ``layers.0.*``, its own ``embed_tokens``, an fc bias, ``norm_before_residual``),
each with a 200-token draft vocabulary (``d2t`` offsets, ``t2d`` mask) of the target's 259.

- greedy decoding through the decode loop with the head equals autoregressive decoding;
- under sampling drafts are accepted and rejected, and after partial acceptance the head's cache has
  rolled back (its next draft equals a fresh head's);
- the first draft distribution equals a hand computation of the EAGLE-3 step from the file's tensors
  (fc over three HF hidden-state indices, cat(input_layernorm(embed), hidden_norm(h)), residual choice,
  MLP, final norm, draft lm_head), so every tensor was loaded where it belongs;
- in sampling mode q lives in the full vocabulary, zero outside the draft vocabulary;
- clear errors: neither layout, hidden size mismatch, aux ids out of range, another speculators kind,
  missing checkpoint, an encoder-decoder target; the default aux ids; the conf/drafter/eagle3.yaml pool entry.
"""

from __future__ import annotations

import inspect
import json
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from specbench.decoding.drafter import AUTOREGRESSIVE, DecodeContext
from specbench.decoding.sampling import SamplingParams
from specbench.drafters import build_pool
from specbench.drafters.eagle.eagle3 import Eagle3Drafter, build
from specbench.errors import SpecbenchError

PROMPTS = ["The quick brown fox jumps over the lazy dog. The quick brown", "abcabcabcabcabc abcabc"]
ROOT = Path(__file__).resolve().parents[2]
# a non-contiguous draft vocabulary: 200 of the target's 259 ids
DRAFT_IDS = [i for i in range(2, 259) if i % 5 != 0][:200]
AUX_EAGLE3 = [1, 2, 4]  # 4 = L: the final (normed) hidden state, which a pass-through fc copies
AUX_SPECULATORS = [2, 3, 4]


def tensors(
    target,
    aux,
    *,
    passthrough: bool,
    seed: int,
    own_embed: bool = False,
    fc_bias: bool = False,
    fc_in: int | None = None,
    lm_scale: float = 1.0,
) -> dict[str, torch.Tensor]:
    """An EAGLE-3 head's tensors (``layers.0.*`` naming). ``passthrough``: fc copies the last aux feature
    and the layer's branches are small, so the head drafts roughly the target's previous prediction."""
    cfg = target.config
    hidden, heads, kv, hd, inter = (
        cfg.hidden_size,
        cfg.num_attention_heads,
        cfg.num_key_value_heads,
        cfg.head_dim,
        cfg.intermediate_size,
    )
    g = torch.Generator().manual_seed(seed)
    rnd = lambda *shape, s=1.0: s * torch.randn(*shape, generator=g)  # noqa: E731
    small = 0.02 if passthrough else 0.3
    fc_in = fc_in or len(aux or [0, 0, 0]) * hidden
    if passthrough:
        fc = torch.zeros(hidden, fc_in)
        fc[:, fc_in - hidden :] = torch.eye(hidden)
        fc += rnd(hidden, fc_in, s=0.01)
    else:
        fc = rnd(hidden, fc_in, s=0.2)
    norm = lambda: 1.0 + rnd(hidden, s=0.01 if passthrough else 0.3)  # noqa: E731
    out = {
        "fc.weight": fc,
        "layers.0.hidden_norm.weight": norm(),
        "layers.0.input_layernorm.weight": norm(),
        "layers.0.post_attention_layernorm.weight": norm(),
        "layers.0.self_attn.q_proj.weight": rnd(heads * hd, 2 * hidden, s=0.2),
        "layers.0.self_attn.k_proj.weight": rnd(kv * hd, 2 * hidden, s=0.2),
        "layers.0.self_attn.v_proj.weight": rnd(kv * hd, 2 * hidden, s=0.2),
        "layers.0.self_attn.o_proj.weight": rnd(hidden, heads * hd, s=small),
        "layers.0.mlp.gate_proj.weight": rnd(inter, hidden, s=0.2),
        "layers.0.mlp.up_proj.weight": rnd(inter, hidden, s=0.2),
        "layers.0.mlp.down_proj.weight": rnd(hidden, inter, s=small),
        "norm.weight": norm(),
        "lm_head.weight": lm_scale
        * (
            target.model.get_output_embeddings().weight.detach()[DRAFT_IDS].clone()
            + (0 if passthrough else rnd(len(DRAFT_IDS), hidden, s=0.5))
        ),
        "d2t": torch.tensor(DRAFT_IDS) - torch.arange(len(DRAFT_IDS)),  # offsets: target = draft + d2t[draft]
        "t2d": torch.zeros(cfg.vocab_size, dtype=torch.bool).index_fill_(0, torch.tensor(DRAFT_IDS), True),
    }
    if fc_bias:
        out["fc.bias"] = rnd(hidden, s=0.01 if passthrough else 0.2)
    if own_embed:
        out["embed_tokens.weight"] = target.model.get_input_embeddings().weight.detach().clone() + rnd(
            cfg.vocab_size, hidden, s=0.01 if passthrough else 0.5
        )
    return out


def layer_config(target) -> dict:
    cfg = target.config
    return {
        "hidden_size": cfg.hidden_size,
        "num_attention_heads": cfg.num_attention_heads,
        "num_key_value_heads": cfg.num_key_value_heads,
        "head_dim": cfg.head_dim,
        "intermediate_size": cfg.intermediate_size,
        "rms_norm_eps": cfg.rms_norm_eps,
        "hidden_act": "silu",
        "max_position_embeddings": 2048,
        "rope_theta": 10000.0,
        "vocab_size": cfg.vocab_size,
        "num_hidden_layers": 1,
        "model_type": "llama",
    }


def write(path: Path, config: dict, state: dict) -> Path:
    from safetensors.torch import save_file

    path.mkdir(parents=True, exist_ok=True)
    save_file({k: v.contiguous() for k, v in state.items()}, str(path / "model.safetensors"))
    (path / "config.json").write_text(json.dumps(config, indent=1))
    return path


def write_eagle3(path: Path, target, aux=AUX_EAGLE3, **kw) -> Path:
    """SafeAILab/EAGLE (and SpecForge) layout: Llama config + draft_vocab_size, ``midlayer.*`` tensors."""
    state = tensors(target, aux, **kw)
    state = {
        ("midlayer." + k[len("layers.0.") :] if k.startswith("layers.0.") else k): v for k, v in state.items()
    }
    config = {
        "architectures": ["LlamaForCausalLMEagle3"],
        **layer_config(target),
        "draft_vocab_size": len(DRAFT_IDS),
    }
    if aux is not None:
        config["eagle_config"] = {"eagle_aux_hidden_state_layer_ids": list(aux), "use_aux_hidden_state": True}
    return write(path, config, state)


def write_speculators(path: Path, target, aux=AUX_SPECULATORS, kind="eagle3", **kw) -> Path:
    state = tensors(target, aux, own_embed=True, fc_bias=True, **kw)
    state["verifier_lm_head.weight"] = torch.zeros(3, 3)  # training-only tensors are ignored
    config = {
        "speculators_model_type": kind,
        "architectures": ["Eagle3Speculator"],
        "transformer_layer_config": layer_config(target),
        "draft_vocab_size": len(DRAFT_IDS),
        "norm_before_residual": True,
        "target_hidden_size": None,
        "eagle_aux_hidden_state_layer_ids": list(aux),
        "speculators_config": {"algorithm": "eagle3", "default_proposal_method": "greedy"},
    }
    return write(path, config, state)


@pytest.fixture(scope="module")
def heads(tiny_llama_target, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("eagle3")
    t = tiny_llama_target
    dirs = {
        "eagle3": write_eagle3(tmp / "eagle3", t, passthrough=True, seed=0),
        "speculators": write_speculators(tmp / "speculators", t, passthrough=True, seed=1),
        "eagle3_random": write_eagle3(tmp / "eagle3_random", t, passthrough=False, seed=2),
        "speculators_random": write_speculators(tmp / "speculators_random", t, passthrough=False, seed=3),
        # near-uniform draft distributions: under sampling some drafts are accepted
        "eagle3_flat": write_eagle3(tmp / "eagle3_flat", t, passthrough=True, seed=0, lm_scale=0.03),
        "speculators_flat": write_speculators(
            tmp / "speculators_flat", t, passthrough=True, seed=1, lm_scale=0.03
        ),
    }
    pool = build_pool(
        t,
        {
            name: {"_target_": "specbench.drafters.eagle.eagle3.build", "checkpoint": str(d)}
            for name, d in dirs.items()
        },
    )
    return t, pool, dirs


@pytest.mark.parametrize("arm", ["eagle3", "speculators", "speculators_random"])
def test_greedy_equals_autoregressive(heads, tiny_decode, arm):
    target, pool, _ = heads
    for text in PROMPTS:
        prompt = target.tokenizer(text)["input_ids"]
        ref = tiny_decode(target, pool, AUTOREGRESSIVE, prompt, max_new_tokens=24)
        for k in (1, 4):
            gen = tiny_decode(target, pool, arm, prompt, max_new_tokens=24, draft_length=k)
            assert gen.tokens == ref.tokens, (arm, text, k)
            assert gen.drafted > 0


@pytest.mark.parametrize("arm", ["eagle3_flat", "speculators_flat"])
def test_partial_acceptance_rolls_the_cache_back(heads, tiny_decode, arm):
    """Under sampling, near-uniform heads get drafts both accepted and rejected (the random tiny target is
    too peaked and never repeats, so a pass-through head's greedy acceptance is near zero); afterwards the
    head's next draft equals that of the same head starting the committed sequence from scratch."""
    target, pool, _ = heads
    prompt = target.tokenizer(PROMPTS[0])["input_ids"]
    for seed in range(8):
        gen = tiny_decode(
            target,
            pool,
            arm,
            prompt,
            max_new_tokens=30,
            draft_length=4,
            sampling=SamplingParams(temperature=1.0),
            rng=torch.Generator().manual_seed(seed),
        )
        if any(0 < r.accepted < r.drafted for r in gen.rounds):
            break
    else:
        pytest.fail("no round had a draft partly accepted")
    d = pool[arm]
    committed, ctx = list(target.tokens), d._query
    d.sync(ctx, committed)
    warm = d.propose(committed, 4, SamplingParams(), torch.Generator().manual_seed(0))
    fresh = DecodeContext()
    fresh.record_states({a: ctx.states(a) for a in d.state_layers(False)}, rows=len(committed) - 1, start=0)
    d.sync(fresh, committed)
    cold = d.propose(committed, 4, SamplingParams(), torch.Generator().manual_seed(0))
    assert warm.tokens == cold.tokens
    torch.testing.assert_close(warm.probs, cold.probs, atol=1e-4, rtol=1e-4)


def test_a_batch_drafts_each_row_as_its_head_alone(heads, tiny_decode):
    """EAGLE-3 heads of both layouts at batch (``HeadRows``: one forward of a head's stack a draft position for every
    row that plays it, each row fed its own aux-layer states), rows of different prompts: each row's output, and each
    round's drafted and accepted tokens, equal its prompt decoded alone, every row's head drafting."""
    from specbench.decoding.loop import DecodeSpec, Limits
    from specbench.timing import Clock
    from tests.batching import decode_batch

    target, pool, _ = heads
    texts = (PROMPTS[0], PROMPTS[1], PROMPTS[1] + " abc", PROMPTS[0][:30])
    prompts = [target.tokenizer(t)["input_ids"] for t in texts]
    arms = ("eagle3", "speculators", "eagle3", "speculators")
    eos = frozenset({int(target.tokenizer.eos_token_id)})
    spec = DecodeSpec(SamplingParams(), Limits(max_new_tokens=24, draft_length=3), eos, Clock())
    result = decode_batch(target, [pool[a] for a in arms], prompts, spec, torch.Generator())
    for arm, prompt, gen in zip(arms, prompts, result.generations):
        alone = tiny_decode(target, pool, arm, prompt, max_new_tokens=24, draft_length=3, eos_ids=eos)
        assert gen.tokens == alone.tokens, arm
        assert [(r.drafted, r.accepted) for r in gen.rounds] == [
            (r.drafted, r.accepted) for r in alone.rounds
        ]
    assert all(sum(r.drafted for r in g.rounds) > 0 for g in result.generations)  # every row's head drafted


def rms(x, w, eps):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def hand_first_logits(
    state: dict,
    features: list[torch.Tensor],
    embedding: torch.Tensor,
    eps: float,
    heads: int,
    kv: int,
    norm_before_residual: bool,
) -> torch.Tensor:
    """The EAGLE-3 step for one pair (a single position: attention is the value path) from raw tensors."""
    p = lambda k: state[k].float()  # noqa: E731
    g = p("fc.weight") @ torch.cat(features) + (p("fc.bias") if "fc.bias" in state else 0)
    hn = rms(g, p("layers.0.hidden_norm.weight"), eps)
    x = torch.cat([rms(embedding, p("layers.0.input_layernorm.weight"), eps), hn])
    v = (p("layers.0.self_attn.v_proj.weight") @ x).view(kv, -1)
    attn = torch.cat([v[i // (heads // kv)] for i in range(heads)])  # grouped-query heads share values
    h = (hn if norm_before_residual else g) + p("layers.0.self_attn.o_proj.weight") @ attn
    m = rms(h, p("layers.0.post_attention_layernorm.weight"), eps)
    h = h + p("layers.0.mlp.down_proj.weight") @ (
        F.silu(p("layers.0.mlp.gate_proj.weight") @ m) * (p("layers.0.mlp.up_proj.weight") @ m)
    )
    return p("lm_head.weight") @ rms(h, p("norm.weight"), eps)


@pytest.mark.parametrize("arm,nbr", [("eagle3_random", False), ("speculators_random", True)])
def test_first_draft_matches_hand_computation(heads, arm, nbr):
    """Every tensor is loaded where it belongs (a misplaced or skipped one changes these logits), the aux
    ids index HF's output_hidden_states, and d2t offsets become absolute target ids."""
    from safetensors.torch import load_file

    target, pool, dirs = heads
    d = pool[arm]
    state = {
        k.replace("midlayer.", "layers.0."): v
        for k, v in load_file(str(dirs[arm] / "model.safetensors")).items()
    }
    assert d.logits.d2t.tolist() == DRAFT_IDS
    prompt = target.tokenizer("hi")["input_ids"][:2]
    assert len(prompt) == 2
    query = DecodeContext()
    states = target.prefill(prompt, layers=d.state_layers(False)).states
    query.record_states(states, rows=1, start=0)
    d.sync(query, list(target.tokens))
    got = d.logits(d._hat)
    with torch.no_grad():
        hs = target.model(input_ids=torch.tensor([prompt[:1]]), output_hidden_states=True).hidden_states
    embed = state.get("embed_tokens.weight", target.model.get_input_embeddings().weight)
    cfg = target.config
    want = hand_first_logits(
        state,
        [hs[a][0, 0].float() for a in d.aux],
        embed[prompt[1]].float(),
        cfg.rms_norm_eps,
        cfg.num_attention_heads,
        cfg.num_key_value_heads,
        nbr,
    )
    torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)
    # and the logits are not the same as with the other residual choice (the flag is read)
    other = hand_first_logits(
        state,
        [hs[a][0, 0].float() for a in d.aux],
        embed[prompt[1]].float(),
        cfg.rms_norm_eps,
        cfg.num_attention_heads,
        cfg.num_key_value_heads,
        not nbr,
    )
    assert (other - want).abs().max() > 1e-2


def test_sampling_q_lives_in_the_full_vocabulary(heads, tiny_decode):
    target, pool, _ = heads
    prompt = target.tokenizer(PROMPTS[0])["input_ids"]
    tiny_decode(target, pool, "speculators", prompt, max_new_tokens=6)
    d = pool["speculators"]
    d.sync(d._query, list(target.tokens))
    draft = d.propose(
        list(target.tokens), 4, SamplingParams(temperature=1.0), torch.Generator().manual_seed(0)
    )
    assert draft.tokens and set(draft.tokens) <= set(DRAFT_IDS)
    outside = torch.ones(target.vocab_size, dtype=torch.bool)
    outside[DRAFT_IDS] = False
    assert float(draft.probs[:, outside].abs().max()) == 0.0
    torch.testing.assert_close(draft.probs.sum(-1), torch.ones(len(draft.tokens)))
    assert 0 < d.cost < 1


def test_default_aux_layers(tiny_llama_target, tmp_path):
    path = write_eagle3(tmp_path / "h", tiny_llama_target, aux=None, passthrough=True, seed=0)
    d = build(tiny_llama_target, "e", checkpoint=str(path))
    assert d.aux == [2, 2, 1]  # [2, L // 2, L - 3] for the 4-layer target
    assert d.state_layers(False) == (2, 1)
    d2 = build(tiny_llama_target, "e", checkpoint=str(path), aux_layers=[0, 1, 2])
    assert d2.state_layers(True) == (0, 1, 2)


def test_pool_config_from_conf(tiny_llama_target, heads):
    from omegaconf import OmegaConf

    cfg = OmegaConf.to_container(OmegaConf.load(ROOT / "conf/drafter/eagle3.yaml"))
    assert cfg["_target_"] == "specbench.drafters.eagle.eagle3.build"
    params = set(inspect.signature(build).parameters)
    assert (
        set(cfg) - {"_target_", "draft_length", "cost"} <= params
    )  # the pool's keys (PoolEntry) and the builder's
    cfg["checkpoint"] = str(heads[2]["eagle3"])
    pool = build_pool(tiny_llama_target, {"e3": cfg})
    assert isinstance(pool["e3"], Eagle3Drafter) and pool["e3"].aux == AUX_EAGLE3


def test_neither_layout_is_refused(tiny_llama_target, tmp_path):
    state = tensors(tiny_llama_target, AUX_EAGLE3, passthrough=True, seed=0)
    path = write(tmp_path / "h", {"model_type": "llama", **layer_config(tiny_llama_target)}, state)
    with pytest.raises(SpecbenchError, match="neither an EAGLE-3 head") as err:
        build(tiny_llama_target, "e", checkpoint=str(path))
    assert "speculators" in err.value.fix


def test_other_speculators_kind_is_refused(tiny_llama_target, tmp_path):
    path = write_speculators(tmp_path / "h", tiny_llama_target, kind="eagle", passthrough=True, seed=0)
    with pytest.raises(SpecbenchError, match="speculators 'eagle' checkpoint"):
        build(tiny_llama_target, "e", checkpoint=str(path))


def test_hidden_size_mismatch_is_refused(tiny_llama_target, tmp_path):
    path = write_eagle3(tmp_path / "h", tiny_llama_target, passthrough=True, seed=0, fc_in=3 * 32)
    with pytest.raises(SpecbenchError, match="hidden size is 64") as err:
        build(tiny_llama_target, "e", checkpoint=str(path))
    assert "fc (64, 96)" in err.value.problem


def test_aux_layers_out_of_range_are_refused(tiny_llama_target, tmp_path):
    path = write_eagle3(tmp_path / "h", tiny_llama_target, aux=[1, 2, 9], passthrough=True, seed=0)
    with pytest.raises(SpecbenchError, match=r"aux layer ids \[1, 2, 9\] are out of range"):
        build(tiny_llama_target, "e", checkpoint=str(path))


def test_missing_checkpoint_and_encoder_decoder_target(tiny_llama_target, tiny_t5_target, tmp_path):
    with pytest.raises(SpecbenchError, match="not found") as err:
        build(tiny_llama_target, "e", checkpoint=str(tmp_path / "nowhere"))
    assert "EAGLE-3" in err.value.fix and "makes EAGLE-1 heads" in err.value.fix  # issue 34: not "train one"
    with pytest.raises(SpecbenchError, match="no checkpoint"):
        build(tiny_llama_target, "e", checkpoint=None)
    with pytest.raises(SpecbenchError, match="decoder-only, Llama-style target"):
        build(tiny_t5_target, "e", checkpoint=str(tmp_path))
