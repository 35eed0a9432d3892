"""Shared fixtures.

Tiny models (section "tiny models"): session-scoped targets and drafter pools built from the
embedded random models, so no test downloads anything. Targets are stateful (KV cache, committed
tokens) but every user (``decode``, ``Target.prefill``) starts by resetting that state, so one
instance per session is safe as long as tests do not keep references across each other.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import pytest
import torch

# ---------------------------------------------------------------------------------------------
# the cache: tests never write into the user's $SPECBENCH_CACHE
# ---------------------------------------------------------------------------------------------


@pytest.fixture(scope="session", autouse=True)
def private_cache(tmp_path_factory):
    """A per-session ``$SPECBENCH_CACHE`` (shared target answers, drafters named by cache:), holding a
    link to the user's converted embedded model so the slow tests need not convert it again."""
    from specbench.models.store import cache_dir

    real = cache_dir()
    private = tmp_path_factory.mktemp("specbench_cache")
    for name in ("smollm2-135m-instruct",):
        if (real / name).is_dir():
            (private / name).symlink_to(real / name, target_is_directory=True)
    old = os.environ.get("SPECBENCH_CACHE")
    os.environ["SPECBENCH_CACHE"] = str(private)
    yield private
    if old is None:
        os.environ.pop("SPECBENCH_CACHE", None)
    else:
        os.environ["SPECBENCH_CACHE"] = old


# ---------------------------------------------------------------------------------------------
# tiny models
# ---------------------------------------------------------------------------------------------

# family -> config field holding the decoder layer count, embedded drafter model of the same family, and
# the early-exit head path (final norm module, scale before the LM head), as in conf/target/<family>.yaml
TINY_FAMILIES: dict[str, dict[str, str]] = {
    "tiny_llama": {
        "layers_key": "num_hidden_layers",
        "draft_model": "embedded:tiny_llama_draft",
        "final_norm": "model.norm",
        "head_scale": 1.0,
    },
    "tiny_t5": {
        "layers_key": "num_decoder_layers",
        "draft_model": "embedded:tiny_t5_draft",
        "final_norm": "decoder.final_layer_norm",
        "head_scale": 0.125,
    },
}

# Every drafter kind of the toolkit (pool key -> kind); the autoregressive arm is always added by build_pool.
TINY_DRAFTER_KINDS = ("quantized_dynamic", "quantized_weight", "prompt_lookup", "early_exit", "hf")


def tiny_drafter_configs(family: str, kinds=TINY_DRAFTER_KINDS) -> dict[str, dict]:
    """Pool config ``{name: {_target_: ..., ...}}`` for a tiny target family."""
    spec = TINY_FAMILIES[family]
    every = {
        "quantized_dynamic": {"_target_": "specbench.drafters.quantized.build"},
        "quantized_weight": {"_target_": "specbench.drafters.quantized.build", "scheme": "weight_int8"},
        "prompt_lookup": {"_target_": "specbench.drafters.prompt_lookup.build"},
        "early_exit": {
            "_target_": "specbench.drafters.early_exit.build",
            "layers": 1,
            "layers_key": spec["layers_key"],
            "final_norm": spec["final_norm"],
            "head_scale": spec["head_scale"],
        },
        "hf": {"_target_": "specbench.drafters.hf.build", "model": spec["draft_model"]},
    }
    return {k: dict(every[k]) for k in kinds}


def build_tiny_pool(target, family: str, kinds=TINY_DRAFTER_KINDS):
    """``build_pool`` over :func:`tiny_drafter_configs` (includes the ``autoregressive`` arm)."""
    from specbench.drafters import build_pool

    return build_pool(target, tiny_drafter_configs(family, kinds))


def load_tiny_target(family: str):
    from specbench.models import Target, load_model

    return Target(load_model(f"embedded:{family}", device="cpu"))


@dataclass
class TinySetup:
    family: str
    target: object  # specbench.models.Target
    pool: dict  # name -> Drafter, with "autoregressive"

    @property
    def tokenizer(self):
        return self.target.tokenizer

    @property
    def model(self):
        return self.target.model

    @property
    def eos_id(self) -> int:
        return int(self.target.tokenizer.eos_token_id)


@pytest.fixture(scope="session", autouse=True)
def torch_single_thread():
    """Run torch on one intra-op thread (override with SPECBENCH_TEST_THREADS).

    The tiny models do tiny matmuls, and on a small shared CPU box OpenMP's spin-waiting makes
    multi-threaded torch up to 100x slower when other processes compete for the cores.
    """
    previous = torch.get_num_threads()
    torch.set_num_threads(int(os.environ.get("SPECBENCH_TEST_THREADS", "1")))
    yield
    torch.set_num_threads(previous)


@pytest.fixture(scope="session")
def tiny_llama_target():
    return load_tiny_target("tiny_llama")


@pytest.fixture(scope="session")
def tiny_t5_target():
    return load_tiny_target("tiny_t5")


@pytest.fixture(scope="session")
def tiny_llama_pool(tiny_llama_target):
    return build_tiny_pool(tiny_llama_target, "tiny_llama")


@pytest.fixture(scope="session")
def tiny_t5_pool(tiny_t5_target):
    return build_tiny_pool(tiny_t5_target, "tiny_t5")


@pytest.fixture(scope="session", params=list(TINY_FAMILIES))
def tiny_setup(request) -> TinySetup:
    """Parametrized over the tiny families: target plus a pool with every drafter kind."""
    family = request.param
    return TinySetup(
        family=family,
        target=request.getfixturevalue(f"{family}_target"),
        pool=request.getfixturevalue(f"{family}_pool"),
    )


def run_tiny_decode(
    target,
    pool,
    arm_or_selector,
    prompt_ids,
    *,
    max_new_tokens=40,
    draft_length=4,
    eos_ids=None,
    sampling=None,
    rng=None,
    cascade=None,
):
    """``specbench.decoding.loop.decode`` with test defaults (greedy, seeded rng, target's EOS).

    ``arm_or_selector`` is a pool key (a ``Fixed`` selector is built) or a ``Selector``; ``cascade`` a
    speculative-cascade rule (``None``: lossless).
    """
    from specbench.decoding.loop import DecodeSpec, Limits, decode
    from specbench.decoding.sampling import SamplingParams
    from specbench.selection import Fixed
    from specbench.timing import Clock

    selector = Fixed(list(pool), arm_or_selector) if isinstance(arm_or_selector, str) else arm_or_selector
    if eos_ids is None:
        eos_ids = frozenset({int(target.tokenizer.eos_token_id)})
    spec = DecodeSpec(
        sampling if sampling is not None else SamplingParams(),
        Limits(max_new_tokens=max_new_tokens, draft_length=draft_length),
        frozenset(eos_ids),
        Clock(),
        cascade,
    )
    return decode(
        target,
        pool,
        selector,
        list(prompt_ids),
        spec,
        rng if rng is not None else torch.Generator().manual_seed(0),
    )


@pytest.fixture(scope="session")
def tiny_decode():
    """The :func:`run_tiny_decode` helper, as a fixture (tests need not import conftest)."""
    return run_tiny_decode


def write_tiny_shipped(target, directory) -> None:
    """The drafters the reproduction pools read as ``package:<name>``, built for the tiny Llama into ``directory``
    (pointed at by ``$SPECBENCH_HEADS``): an untrained eagle head per specialist and the small drafter (1 layer)."""
    import torch

    from specbench.drafters import small
    from specbench.drafters.eagle import EagleHead
    from specbench.drafters.head_files import save_head, vocab_fingerprint

    meta = {"target": "embedded:tiny_llama", "vocab": vocab_fingerprint(target.tokenizer)}
    for i, task in enumerate(["math", "summarization", "translation", "chat", "code", "general"]):
        torch.manual_seed(i)
        save_head(
            EagleHead(target.model, layers=1), None, directory / f"eagle_{task}", {"kind": "eagle", **meta}
        )
    small.save(
        small.SmallLM(target, 1, torch.arange(0, target.vocab_size, 2)), directory / "small_general", meta
    )
