"""``hf``: any Hugging Face causal or seq2seq model that shares the target's tokenizer."""

from __future__ import annotations

from specbench.drafters.base import ModelDrafter, param_count
from specbench.errors import SpecbenchError
from specbench.models.loading import load_model
from specbench.models.target import Target


def check_same_vocabulary(target_tok, drafter_tok, drafter_name: str) -> None:
    """Speculative decoding compares token ids: both tokenizers must map strings to the same ids."""
    tv, dv = target_tok.get_vocab(), drafter_tok.get_vocab()
    differ = [t for t, i in dv.items() if tv.get(t) != i]
    if differ:
        raise SpecbenchError(
            f"drafter '{drafter_name}' does not share the target's vocabulary: {len(differ)} of its "
            f"{len(dv)} tokens have other ids or are missing in the target's (e.g. {differ[:3]})",
            "pick a drafter trained with the target's tokenizer (T5-small for T5-large, a 68M Llama for "
            "Vicuna), or use a self-drafter: quantized, early_exit or prompt_lookup",
        )


def check_embedding_rows(model, target: Target, drafter_name: str) -> None:
    """The drafter reads every token the target commits: its embedding needs a row for each id the
    target's tokenizer has (else decoding dies at the first id past its table)."""
    rows = model.get_input_embeddings().num_embeddings
    needed = len(target.tokenizer)
    if rows < needed:
        raise SpecbenchError(
            f"drafter '{drafter_name}' has {rows} embedding rows, fewer than the {needed} tokens of the target's "
            f"tokenizer (token ids {rows}..{needed - 1} would index past its embedding)",
            "pick a drafter whose embedding covers the target's vocabulary (resize_token_embeddings to at least "
            f"{needed} and fine-tune), or use a self-drafter: quantized, early_exit or prompt_lookup")


def build(target: Target, name: str, model: str, dtype: str | None = None, device: str | None = None,
          cost: float | None = None,
          confidence_threshold: float = 0.0) -> ModelDrafter:
    loaded = load_model(model, dtype=dtype or str(target.model.dtype).removeprefix("torch."),
                        device=device or str(target.device))
    check_same_vocabulary(target.tokenizer, loaded.tokenizer, name)
    check_embedding_rows(loaded.model, target, name)
    if loaded.is_encoder_decoder != target.is_encoder_decoder:
        kind = "encoder-decoder" if target.is_encoder_decoder else "decoder-only"
        raise SpecbenchError(f"drafter '{name}' ({model}) is not {kind} like the target",
                             f"use a {kind} drafter for this target")
    if cost is None:
        cost = param_count(loaded.model) / param_count(target.model)
    return ModelDrafter(name, loaded.model, target.vocab_size, cost, confidence_threshold)
