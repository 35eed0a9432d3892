"""``hf``: any Hugging Face causal or seq2seq model that shares the target's tokenizer."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

from specbench.drafters.base import (
    Confidence,
    Dtype,
    MakeTarget,
    ModelDrafter,
    TreeDraft,
    param_count,
    with_tree,
)
from specbench.drafters.head_files import vocab_fingerprint
from specbench.errors import SpecbenchError
from specbench.files import files_fingerprint
from specbench.models.loading import LoadedModel, load_model, resolve_cached
from specbench.models.target import Target
from specbench.validate import text

MODEL_META = "specbench.json"  # written beside a fine-tuned drafter by `specbench train-drafter`


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
            f"{needed} and fine-tune), or use a self-drafter: quantized, early_exit or prompt_lookup",
        )


def check_compatible(target: Target, loaded: LoadedModel, name: str) -> None:
    """A drafter must share the target's vocabulary, cover it with its embedding, and be of the target's
    kind (decoder-only or encoder-decoder)."""
    check_same_vocabulary(target.tokenizer, loaded.tokenizer, name)
    check_embedding_rows(loaded.model, target, name)
    if loaded.is_encoder_decoder != target.is_encoder_decoder:
        kind = "encoder-decoder" if target.is_encoder_decoder else "decoder-only"
        raise SpecbenchError(
            f"drafter '{name}' ({loaded.name}) is not {kind} like the target",
            f"use a {kind} drafter for this target",
        )


def check_trained_for(path: Path, target: Target, name: str) -> None:
    """A drafter fine-tuned by ``train-drafter`` for another target (another vocabulary) is refused."""
    meta = json.loads((path / MODEL_META).read_text())
    if meta.get("vocab") and meta["vocab"] != vocab_fingerprint(target.tokenizer):
        raise SpecbenchError(
            f"drafter '{name}' ({path}) was fine-tuned for target '{meta.get('target')}', whose vocabulary differs "
            f"from this target's ('{target.loaded.name}')",
            f"use a drafter trained for {target.loaded.name} (specbench train-drafter target=...), or that target",
        )


def build(
    target: Target,
    name: str,
    model: Annotated[str, text()],
    dtype: Dtype = None,
    device: Annotated[str | None, text(null=True)] = None,
    confidence_threshold: Confidence = 0.0,
    make_target: MakeTarget = None,
    tree: TreeDraft = None,
) -> ModelDrafter:
    """``model``: a hub id, a local directory, ``embedded:<entry>``, or ``cache:<path>`` (under
    ``$SPECBENCH_CACHE``, where ``train-drafter`` writes; ``make_target`` names what builds it). ``tree``:
    ``{width, nodes}`` drafts a dynamic draft tree each round (decoder-only drafters; null: a chain)."""
    local = resolve_cached(model, make_target)
    if local is not None and (local / MODEL_META).exists():
        check_trained_for(local, target, name)
    loaded = load_model(
        str(local or model),
        dtype=dtype or str(target.model.dtype).removeprefix("torch."),
        device=device or str(target.device),
    )
    check_compatible(target, loaded, name)
    cost = param_count(loaded.model) / param_count(target.model)
    drafter = ModelDrafter(name, loaded.model, target.vocab_size, cost, confidence_threshold)
    # a local / cache: checkpoint by its files; a hub model by the snapshot it resolved to (a moved branch is another
    # model); resumes check it (run_records.Records)
    drafter.fingerprint = files_fingerprint(local) or hub_fingerprint(model, loaded.model)
    return with_tree(drafter, tree, name)


# its drafter drafts the rows of a batch in one forward (ModelDrafter.cohort; pipelines/batch_settings.py): decoder-only
# chains (a tree config is refused for batches)
build.batches = "chains"


def hub_fingerprint(model: str, module) -> str | None:
    """``<hub id>@<commit>`` of a model loaded from the hub (``config._commit_hash``, set by ``from_pretrained``);
    None for an embedded model (fixed by name) or one loaded without a commit."""
    commit = getattr(getattr(module, "config", None), "_commit_hash", None)
    return f"{model}@{commit}" if commit and not str(model).startswith("embedded:") else None
