"""Tiny randomly initialised Hugging Face models and a byte-level tokenizer, built in-process.

They are real transformers models (Llama, T5, Gemma-2 and Qwen2 classes) with a real
``PreTrainedTokenizerFast``, small enough for unit tests and needing no download. Weights are drawn
from a seeded generator so every build of the same entry is identical.

- ``build_tiny(name)``: the embedded entries (``embedded:tiny_llama``, ...), byte vocabulary.
- ``tiny_model(arch, ...)`` / ``write_tiny(directory, ...)``: any architecture class of ``ARCHS``
  at any vocabulary size, e.g. a 32000-token Llama standing in for Vicuna-7B (the paper-scale dry run
  writes such stand-ins with ``save_pretrained`` and loads them back through the local-directory path).
"""

from __future__ import annotations

from pathlib import Path

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from transformers import (
    Gemma2Config,
    Gemma2ForCausalLM,
    LlamaConfig,
    LlamaForCausalLM,
    PreTrainedTokenizerFast,
    Qwen2Config,
    Qwen2ForCausalLM,
    T5Config,
    T5ForConditionalGeneration,
)

SPECIALS = ["<pad>", "</s>", "<unk>"]


def byte_tokenizer(
    vocab_size: int | None = None, bos_token: str | None = None, chat_template: str | None = None
) -> PreTrainedTokenizerFast:
    """A byte-level BPE tokenizer with no merges: 3 special tokens (+ ``bos_token``) + 256 byte tokens,
    padded with unused ``<extra_i>`` tokens up to ``vocab_size`` entries when given."""
    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    tokens = SPECIALS + ([bos_token] if bos_token else []) + alphabet
    if vocab_size is not None:
        if vocab_size < len(tokens):
            raise ValueError(
                f"a byte tokenizer needs at least {len(tokens)} tokens, got vocab_size={vocab_size}"
            )
        tokens += [f"<extra_{i}>" for i in range(vocab_size - len(tokens))]
    vocab = {tok: i for i, tok in enumerate(tokens)}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    out = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        pad_token="<pad>",
        eos_token="</s>",
        unk_token="<unk>",
        **({"bos_token": bos_token} if bos_token else {}),
    )
    if chat_template:
        out.chat_template = chat_template
    return out


def _init_weights(model: torch.nn.Module, seed: int, std: float) -> None:
    """Re-draw every parameter from N(0, std) (norm weights stay 1) with an explicit generator."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "norm" in name and param.dim() == 1:
                param.fill_(1.0)
            else:
                param.copy_(torch.randn(param.shape, generator=gen) * std)


def _decoder_only(config_cls, model_cls, **fixed):
    def build(vocab: int, layers: int, hidden: int, ids: dict, tie: bool):
        config = config_cls(
            vocab_size=vocab,
            hidden_size=hidden,
            intermediate_size=2 * hidden,
            num_hidden_layers=layers,
            num_attention_heads=4,
            num_key_value_heads=2,
            max_position_embeddings=2048,
            tie_word_embeddings=tie,
            **ids,
            **fixed,
        )
        return model_cls(config)

    return build


def _t5(gated: bool = False):
    def build(vocab: int, layers: int, hidden: int, ids: dict, tie: bool):
        config = T5Config(
            vocab_size=vocab,
            d_model=hidden,
            d_kv=hidden // 4,
            d_ff=2 * hidden,
            num_layers=layers,
            num_decoder_layers=layers,
            num_heads=4,
            relative_attention_num_buckets=8,
            eos_token_id=ids["eos_token_id"],
            pad_token_id=ids["pad_token_id"],
            decoder_start_token_id=ids["pad_token_id"],
            tie_word_embeddings=tie,
            **({"feed_forward_proj": "gated-gelu"} if gated else {}),
        )
        return T5ForConditionalGeneration(config)

    return build


# Architecture classes: builder and initial weight scale. A large init spreads the logits, so argmax ties
# (which make fp32 greedy decoding fragile for any implementation) are rare.
ARCHS: dict[str, tuple] = {
    "llama": (_decoder_only(LlamaConfig, LlamaForCausalLM), 0.5),
    "qwen2": (_decoder_only(Qwen2Config, Qwen2ForCausalLM), 0.5),
    "gemma2": (_decoder_only(Gemma2Config, Gemma2ForCausalLM, head_dim=8), 0.5),
    "t5": (_t5(), 0.3),
    "t5_v1_1": (_t5(gated=True), 0.3),  # the T5 v1.1 / Flan-T5 layout: gated-GELU feed-forward, untied head
}


def tiny_model(
    arch: str, tokenizer, layers: int, hidden: int, seed: int, vocab_size: int | None = None, tie: bool = True
):
    """A random ``arch`` model (fp32, eval mode) for ``tokenizer``; ``vocab_size``: the embedding rows
    (default: the tokenizer's size; T5 pads its 32100 tokens to 32128 rows, Qwen2 pads too)."""
    if arch not in ARCHS:
        raise ValueError(f"unknown tiny architecture '{arch}' (known: {', '.join(ARCHS)})")
    build, std = ARCHS[arch]
    ids = {
        "bos_token_id": tokenizer.bos_token_id,
        "eos_token_id": tokenizer.eos_token_id,
        "pad_token_id": tokenizer.pad_token_id,
    }
    model = build(vocab_size or len(tokenizer), layers, hidden, ids, tie)
    _init_weights(model, seed, std=std)
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    return model.eval()


def write_tiny(
    directory: str | Path,
    arch: str,
    tokenizer,
    layers: int = 2,
    hidden: int = 32,
    seed: int = 0,
    vocab_size: int | None = None,
    tie: bool = True,
) -> Path:
    """``tiny_model(...)`` and ``tokenizer`` saved with ``save_pretrained`` in ``directory`` (loadable as a
    local model directory, like a hub download)."""
    directory = Path(directory)
    tiny_model(arch, tokenizer, layers, hidden, seed, vocab_size, tie).save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return directory


# The embedded entries: (architecture, size knobs, seed). The drafters are smaller models with other
# weights and the same tokenizer, so they exercise the `hf` drafter kind.
TINY_SPECS: dict[str, dict] = {
    "tiny_llama": {"arch": "llama", "layers": 4, "hidden": 64, "seed": 1},
    "tiny_llama_draft": {"arch": "llama", "layers": 1, "hidden": 32, "seed": 2},
    "tiny_t5": {"arch": "t5", "layers": 2, "hidden": 64, "seed": 3},
    "tiny_t5_draft": {"arch": "t5", "layers": 1, "hidden": 32, "seed": 4},
}


def build_tiny(name: str):
    """Return ``(model, tokenizer)`` for one of ``TINY_SPECS`` (fp32, CPU, eval mode)."""
    spec = TINY_SPECS[name]
    tok = byte_tokenizer()
    return tiny_model(spec["arch"], tok, spec["layers"], spec["hidden"], spec["seed"]), tok
