"""Tiny randomly initialised Hugging Face models and a byte-level tokenizer, built in-process.

They are real transformers models (Llama and T5 classes) with a real ``PreTrainedTokenizerFast``,
small enough for unit tests and needing no download. Weights are drawn from a seeded generator so
every build of the same entry is identical.
"""

from __future__ import annotations

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast, T5Config, T5ForConditionalGeneration

SPECIALS = ["<pad>", "</s>", "<unk>"]


def byte_tokenizer() -> PreTrainedTokenizerFast:
    """A byte-level BPE tokenizer with no merges: 3 special tokens + 256 byte tokens."""
    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    vocab = {tok: i for i, tok in enumerate(SPECIALS + alphabet)}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    return PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", eos_token="</s>", unk_token="<unk>")


def _init_weights(model: torch.nn.Module, seed: int, std: float) -> None:
    """Re-draw every parameter from N(0, std) (norm weights stay 1) with an explicit generator."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "norm" in name and param.dim() == 1:
                param.fill_(1.0)
            else:
                param.copy_(torch.randn(param.shape, generator=gen) * std)


# Each entry: (architecture, size knobs, seed). The drafters are smaller models with other weights
# and the same tokenizer, so they exercise the `hf` drafter kind.
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
    vocab = len(tok)
    h = spec["hidden"]
    if spec["arch"] == "llama":
        config = LlamaConfig(
            vocab_size=vocab, hidden_size=h, intermediate_size=2 * h, num_hidden_layers=spec["layers"],
            num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=2048,
            bos_token_id=None, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id,
            tie_word_embeddings=True,
        )
        model = LlamaForCausalLM(config)
    else:
        config = T5Config(
            vocab_size=vocab, d_model=h, d_kv=h // 4, d_ff=2 * h, num_layers=spec["layers"],
            num_decoder_layers=spec["layers"], num_heads=4, relative_attention_num_buckets=8,
            eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id,
            decoder_start_token_id=tok.pad_token_id, tie_word_embeddings=True,
        )
        model = T5ForConditionalGeneration(config)
    # A large init spreads the logits, so argmax ties (which make fp32 greedy decoding fragile
    # for any implementation) are rare.
    _init_weights(model, spec["seed"], std=0.5 if spec["arch"] == "llama" else 0.3)
    model.generation_config.eos_token_id = tok.eos_token_id
    model.generation_config.pad_token_id = tok.pad_token_id
    return model.eval(), tok
