"""Every drafter kind with a bfloat16 target (issue 19, item 1), decoder-only and T5 alike.

- each kind (the autoregressive arm, prompt_lookup, quantized dynamic_int8 and weight_int8,
  early_exit, eagle (decoder-only), hf) decodes through ``decode`` under a bf16 tiny target: the
  requested number of tokens (or up to EOS), every one a valid id; in float32 the same pools give
  exactly the autoregressive output (greedy);
- drafters follow the target's dtype unless their config sets one (eagle and hf ``dtype``);
- ``train-drafter target.dtype=bfloat16`` trains (eagle head and hf fine-tuning) in float32 on the
  bf16 teacher, records ``dtype: bfloat16`` in the checkpoint, and the checkpoint decodes;
- float16 on a CPU without fp16 matmul support is refused (capability probe mocked).
"""

from __future__ import annotations

import json

import pytest
import torch

from specbench.decoding.drafter import AUTOREGRESSIVE
from specbench.decoding.sampling import SamplingParams
from specbench.drafters import build_pool
from specbench.errors import SpecbenchError
from specbench.models import Target, load_model
from tests.conftest import TINY_FAMILIES, tiny_drafter_configs
from tests.integration.test_eagle import write_head
from tests.integration.test_train_drafter import SENTENCE, config

PROMPTS = ["The quick brown fox jumps over the lazy dog. The quick brown", "abc abc abc abc"]
MAX_NEW = 24
DTYPES = ("float32", "bfloat16")


def extra_configs(family: str, heads: dict) -> dict:
    """Drafters beyond the shared tiny pool: eagle heads (decoder-only) and dtype overrides."""
    spec = TINY_FAMILIES[family]
    out = {
        "hf_fp32": {
            "_target_": "specbench.drafters.hf.build",
            "model": spec["draft_model"],
            "dtype": "float32",
        }
    }
    if family == "tiny_llama":
        eagle = "specbench.drafters.eagle.build"
        out.update(
            {
                "eagle": {"_target_": eagle, "checkpoint": str(heads["full"])},
                "eagle_sub": {"_target_": eagle, "checkpoint": str(heads["sub"])},
                "eagle_fp32": {"_target_": eagle, "checkpoint": str(heads["sub"]), "dtype": "float32"},
            }
        )
    return out


@pytest.fixture(scope="module")
def heads(tiny_llama_target, tmp_path_factory):
    """Eagle heads saved in float32 (as train-drafter saves them), from the fp32 tiny Llama."""
    tmp = tmp_path_factory.mktemp("bf16_heads")
    return {
        "full": write_head(tmp, tiny_llama_target, "full"),
        "sub": write_head(tmp, tiny_llama_target, "sub", d2t=torch.arange(3, 203)),
    }


@pytest.fixture(
    scope="module", params=[(f, d) for f in TINY_FAMILIES for d in DTYPES], ids=lambda p: f"{p[0]}-{p[1]}"
)
def setup(request, heads):
    family, dtype = request.param
    target = Target(load_model(f"embedded:{family}", dtype=dtype, device="cpu"))
    pool = build_pool(target, {**tiny_drafter_configs(family), **extra_configs(family, heads)})
    return family, dtype, target, pool


def arms_of(pool) -> list[str]:
    return [a for a in pool if a != AUTOREGRESSIVE]


def check_valid(gen, target, max_new: int) -> None:
    eos = int(target.tokenizer.eos_token_id)
    assert all(isinstance(t, int) and 0 <= t < target.vocab_size for t in gen.tokens)
    if gen.stop == "eos":
        assert gen.tokens[-1] == eos and eos not in gen.tokens[:-1] and len(gen.tokens) <= max_new
    else:
        assert gen.stop == "length" and len(gen.tokens) == max_new
    assert gen.target_calls == len(gen.rounds)
    assert sum(r.emitted for r in gen.rounds) == len(gen.tokens)


def test_every_kind_decodes(setup, tiny_decode):
    """bf16: valid output of the asked length; fp32: exactly the autoregressive output."""
    family, dtype, target, pool = setup
    expected = {"early_exit", "hf", "hf_fp32", "prompt_lookup", "quantized_dynamic", "quantized_weight"}
    if family == "tiny_llama":
        expected |= {"eagle", "eagle_sub", "eagle_fp32"}
    assert set(arms_of(pool)) == expected
    for text in PROMPTS:
        ids = target.tokenizer(text)["input_ids"]
        ref = tiny_decode(target, pool, AUTOREGRESSIVE, ids, max_new_tokens=MAX_NEW, draft_length=1)
        check_valid(ref, target, MAX_NEW)
        for arm in arms_of(pool):
            for draft_length in (1, 4):
                gen = tiny_decode(target, pool, arm, ids, max_new_tokens=MAX_NEW, draft_length=draft_length)
                check_valid(gen, target, MAX_NEW)
                assert all(r.arm == arm and 0 <= r.accepted <= r.drafted <= draft_length for r in gen.rounds)
                if dtype == "float32":
                    assert gen.tokens == ref.tokens, (family, arm, draft_length, text)


def test_sampling_and_switching_decode(setup, tiny_decode):
    """Sampling (probabilities from every kind) and switching arms every round (catch-up prefills)."""
    from specbench.selection.base import Selector

    family, dtype, target, pool = setup
    arms = [AUTOREGRESSIVE, *arms_of(pool)]

    class Cycle(Selector):
        def __init__(self):
            super().__init__(list(pool))
            self.i = 0

        def select(self):
            self.i += 1
            return arms[self.i % len(arms)]

    ids = target.tokenizer(PROMPTS[0])["input_ids"]
    sampling = SamplingParams(temperature=1.0, top_k=8)
    for arm in arms:
        gen = tiny_decode(
            target,
            pool,
            arm,
            ids,
            max_new_tokens=12,
            draft_length=3,
            sampling=sampling,
            rng=torch.Generator().manual_seed(1),
        )
        check_valid(gen, target, 12)
    ref = tiny_decode(target, pool, AUTOREGRESSIVE, ids, max_new_tokens=MAX_NEW)
    gen = tiny_decode(target, pool, Cycle(), ids, max_new_tokens=MAX_NEW, draft_length=3)
    check_valid(gen, target, MAX_NEW)
    assert gen.switches > 0
    if dtype == "float32":
        assert gen.tokens == ref.tokens


def test_side_observations_in_the_target_dtype(setup, tiny_decode):
    """Full information: the early exit reads its Block Divergence off the bf16 target's own states."""
    from tests.integration.test_full_information import Recorder

    family, dtype, target, pool = setup
    rec = Recorder(list(pool), "quantized_dynamic")
    gen = tiny_decode(
        target, pool, rec, target.tokenizer(PROMPTS[0])["input_ids"], max_new_tokens=16, draft_length=3
    )
    check_valid(gen, target, 16)
    drafting = sum(1 for r in gen.rounds if r.drafted > 0)
    from specbench.drafters.eagle import EagleDrafter
    from specbench.drafters.early_exit import EarlyExitDrafter

    # early exits and draft heads are observed unplayed (the played arm is int8: never observed)
    observable = [name for name, d in pool.items() if isinstance(d, (EarlyExitDrafter, EagleDrafter))]
    assert "early_exit" in observable
    assert sorted(a for a, _ in rec.side) == sorted(observable * drafting)
    assert all(0.0 <= bd <= 1.0 + 1e-6 for _, bd in rec.side)


def test_drafters_follow_the_target_dtype(setup):
    family, dtype, target, pool = setup
    want = getattr(torch, dtype)
    assert pool["hf"].lm.model.dtype == want and pool["hf_fp32"].lm.model.dtype == torch.float32
    assert pool["early_exit"].lm.model.dtype == want
    if family == "tiny_llama":
        assert pool["eagle"].head.fc.weight.dtype == want
        assert pool["eagle_fp32"].head.fc.weight.dtype == torch.float32
    # weight_int8 computes in the target's dtype; dynamic_int8 in float32 + int8, reading the target's own
    # embedding table (no float32 copy of it)
    assert pool["quantized_weight"].lm.model.get_input_embeddings().weight.dtype == want
    emb = pool["quantized_dynamic"].lm.model.get_input_embeddings()
    if dtype != "float32":
        assert emb.weight.data_ptr() == target.model.get_input_embeddings().weight.data_ptr()
    # the cost is a bytes ratio against the target's own bytes (2 per weight in bf16): below 1
    for arm in ("quantized_dynamic", "quantized_weight"):
        assert 0.0 < pool[arm].cost < 1.0, (arm, pool[arm].cost)


def test_dynamic_int8_is_still_cpu_only():
    from specbench.drafters import quantized

    off_cpu = torch.nn.Linear(4, 4, device="meta")  # any non-CPU device (CUDA on a GPU machine)
    with pytest.raises(SpecbenchError, match="CPU only") as err:
        quantized.quantize(off_cpu, "dynamic_int8")
    assert "weight_int8" in err.value.fix


# ---- train-drafter with a bf16 target ---------------------------------------------------------------


@pytest.fixture(scope="module")
def toy(tmp_path_factory):
    path = tmp_path_factory.mktemp("bf16_toy") / "toy.jsonl"
    path.write_text(
        "".join(
            json.dumps({"question": f"Case {i}. {SENTENCE}", "answer": "#### 17"}) + "\n" for i in range(40)
        )
    )
    return path


@pytest.fixture(scope="module")
def bf16_llama():
    return Target(load_model("embedded:tiny_llama", dtype="bfloat16", device="cpu"))


def test_train_eagle_head_on_a_bf16_target(toy, tmp_path, bf16_llama, tiny_decode):
    from safetensors.torch import load_file

    from specbench.drafters.eagle import build

    out = tmp_path / "head"
    train_drafter_run(config(toy, out, "target.dtype=bfloat16", "train.epochs=1"), tmp_path / "run")
    meta = json.loads((out / "config.json").read_text())["specbench"]
    assert meta["dtype"] == "bfloat16" and meta["epochs"] == 1 and meta["kind"] == "eagle"
    assert json.loads((out / "signature.json").read_text())["dtype"] == "bfloat16"
    assert all(
        v.dtype == torch.float32 for k, v in load_file(str(out / "model.safetensors")).items() if k != "d2t"
    )
    drafter = build(bf16_llama, "head", checkpoint=str(out))
    assert drafter.head.fc.weight.dtype == torch.bfloat16
    pool = {**build_pool(bf16_llama, {}), "head": drafter}
    ids = bf16_llama.tokenizer(f"Case 99. {SENTENCE}")["input_ids"]
    check_valid(tiny_decode(bf16_llama, pool, "head", ids, max_new_tokens=16), bf16_llama, 16)


@pytest.mark.parametrize("family", ["llama", "t5"])
def test_fine_tune_hf_drafter_on_a_bf16_target(toy, tmp_path, family, tiny_decode):
    from specbench.drafters.hf import build

    out = tmp_path / "ft"
    train_drafter_run(
        config(
            toy,
            out,
            f"target=tiny_{family}",
            "target.dtype=bfloat16",
            "drafter.kind=hf",
            f"drafter.model=embedded:tiny_{family}_draft",
            "drafter.vocab=null",
            "train.epochs=1",
            "train.lr=0.01",
        ),
        tmp_path / "run",
    )
    meta = json.loads((out / "specbench.json").read_text())
    assert meta["dtype"] == "bfloat16" and meta["kind"] == "hf" and meta["epochs"] == 1
    assert json.loads((out / "config.json").read_text()).get("dtype") in ("float32", None)  # trained in fp32
    target = Target(load_model(f"embedded:tiny_{family}", dtype="bfloat16", device="cpu"))
    drafter = build(target, "ft", model=str(out))
    assert drafter.lm.model.dtype == torch.bfloat16  # follows the target's dtype
    pool = {**build_pool(target, {}), "ft": drafter}
    ids = target.tokenizer(f"Case 99. {SENTENCE}")["input_ids"]
    check_valid(tiny_decode(target, pool, "ft", ids, max_new_tokens=16), target, 16)


def test_bf16_training_resumes_to_the_same_weights(toy, tmp_path):
    from safetensors.torch import load_file

    whole, parts = tmp_path / "whole", tmp_path / "parts"
    bf16 = ("target.dtype=bfloat16",)
    train_drafter_run(config(toy, whole, *bf16, "train.epochs=2"), tmp_path / "r1")
    train_drafter_run(config(toy, parts, *bf16, "train.epochs=1"), tmp_path / "r2")
    train_drafter_run(config(toy, parts, *bf16, "train.epochs=2"), tmp_path / "r3")
    a, b = load_file(str(whole / "model.safetensors")), load_file(str(parts / "model.safetensors"))
    assert a.keys() == b.keys()
    for k in a:
        torch.testing.assert_close(a[k], b[k], atol=0, rtol=0)


def test_another_teacher_dtype_is_not_resumed(toy, tmp_path):
    """A checkpoint trained on a float32 teacher is not continued on a bf16 one; a signature written
    before the dtype was recorded (no ``dtype`` key) still matches on the rest."""
    from specbench.pipelines.train_drafter import same_signature, signature

    out = tmp_path / "head"
    sig = signature(config(toy, out, "target.dtype=bfloat16"))
    assert sig["dtype"] == "bfloat16"
    assert same_signature({k: v for k, v in sig.items() if k != "dtype"}, sig)
    assert not same_signature({**sig, "dtype": "float32"}, sig)
    out.mkdir()
    (out / "signature.json").write_text(json.dumps({**sig, "dtype": "float32"}))
    with pytest.raises(SpecbenchError, match="another config"):
        train_drafter_run(config(toy, out, "target.dtype=bfloat16"), tmp_path / "run")


def train_drafter_run(cfg, out):
    from specbench.pipelines import train_drafter

    return train_drafter.run(cfg, out)


# ---- unsupported dtype / device combinations ---------------------------------------------------------


def test_fp16_on_a_cpu_without_fp16_is_refused(monkeypatch):
    from specbench.models import devices

    monkeypatch.setattr(devices, "cpu_fp16_supported", lambda: False)
    with pytest.raises(SpecbenchError) as err:
        load_model("embedded:tiny_llama", dtype="float16", device="cpu")
    assert "float16" in err.value.problem and "bfloat16" in err.value.fix
    devices.check_dtype_supported(torch.bfloat16, torch.device("cpu"))  # bf16 and fp32 are fine
    devices.check_dtype_supported(torch.float32, torch.device("cpu"))

    monkeypatch.setattr(devices, "cpu_fp16_supported", lambda: True)
    assert load_model("embedded:tiny_llama", dtype="float16", device="cpu").model.dtype == torch.float16


def test_cpu_fp16_probe(monkeypatch):
    from specbench.models import devices

    monkeypatch.setattr(torch.cpu, "_is_amx_fp16_supported", lambda: True, raising=False)
    assert devices.cpu_fp16_supported()
