"""``small``: a standalone small drafter made from the target (a trained early exit on a draft sub-vocabulary).

The model: the target's token embedding (shared, frozen), its own ``L`` decoder layers of the target's family
(initialised from the target's first ``L`` layers, then distilled), its own final norm, and the target's LM head
restricted to a draft sub-vocabulary (the ``N`` most frequent tokens of its training answers, as the EAGLE heads
do). It generates alone, from token ids, with its own KV cache: no target features. That is what the black-box
pools of speculative cascades, Huang et al. and MetaSD assume (T5-small for T5-large, a 68M Llama for Vicuna-7B),
and what a cheap, weaker drafter means here: a few layers and a small head cost a fraction of a target step, and
its own answers are worse than the target's.

Its only trained tensors are the layers, the norm and the sub-vocabulary ids (``model.safetensors`` +
``config.json``, the draft heads' checkpoint format): ``specbench train-drafter drafter.kind=small`` writes one,
``make small-drafter`` trains and ships ``package:small_general``. Verification stays against the full
vocabulary (in sampling mode its ``q`` is zero outside the sub-vocabulary), so decoding with it is lossless.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path

import torch
from torch import nn

from specbench.drafters import shipped
from specbench.drafters.base import (
    Checkpoint,
    Confidence,
    Dtype,
    LayersKey,
    MakeTarget,
    ModelDrafter,
    TreeDraft,
    with_tree,
)
from specbench.drafters.eagle.head import HeadLogits
from specbench.drafters.early_exit import truncated_model
from specbench.drafters.head_files import (
    CONFIG_FILE,
    WEIGHTS_FILE,
    load_state,
    read_meta,
    resolve_checkpoint,
    vocab_fingerprint,
)
from specbench.errors import SpecbenchError
from specbench.files import atomic_write_text, files_fingerprint, save_tensors
from specbench.models.cache import cache_argument
from specbench.models.target import Target

KIND = "small"
OWN = ("layers.", "norm.")  # the trained tensors' key prefixes (the rest is the target's)


class SmallLM(nn.Module):
    """embedding (the target's) -> ``layers`` decoder layers -> final norm -> the target's LM-head rows of ``d2t``.

    A Hugging Face-style causal LM for ``CachedLM`` and the fine-tuning losses: ``forward(input_ids, attention_mask,
    past_key_values, use_cache, logits_to_keep)`` returns float32 logits over the full vocabulary, ``-inf`` outside
    the sub-vocabulary. ``dtype``: its layers' and head's (None: the target's).
    """

    def __init__(
        self,
        target: Target,
        layers: int,
        d2t: torch.Tensor | None,
        layers_key: str = "num_hidden_layers",
        dtype: torch.dtype | None = None,
    ):
        super().__init__()
        if target.is_encoder_decoder:
            raise SpecbenchError(
                "the small drafter is built from a decoder-only target's layers",
                "use an hf drafter (e.g. t5-small) with an encoder-decoder target",
            )
        small = truncated_model(
            target.model,
            int(layers),
            layers_key,  # bound to the target's tensors
            "the small drafter's layers (drafter.layers)",
        )
        stack = small.base_model
        stack.layers = copy.deepcopy(stack.layers)  # own copies: the embedding and rotary stay shared
        stack.norm = copy.deepcopy(stack.norm)
        if dtype is not None:
            stack.layers.to(dtype)
            stack.norm.to(dtype)
        self.stack = stack
        self.config = stack.config
        self.head = HeadLogits(target, d2t, dtype=dtype or stack.norm.weight.dtype)
        self.d2t = d2t
        self.vocab_size = target.vocab_size
        self._cache_kw = cache_argument(stack)
        self._dtype = stack.norm.weight.dtype
        for p in stack.embed_tokens.parameters():
            p.requires_grad_(False)

    def own_state(self) -> dict[str, torch.Tensor]:
        """The trained tensors (layers and norm), keyed ``layers.<i>...`` / ``norm...``."""
        return {k: v for k, v in self.stack.state_dict().items() if k.startswith(OWN)}

    def load_own(self, state: dict[str, torch.Tensor], where: Path) -> None:
        mine = self.own_state()
        missing = sorted(set(mine) - set(state))
        unexpected = sorted(k for k in state if k not in mine and k != "d2t")
        if missing or unexpected:
            raise SpecbenchError(
                f"{where} does not fit a {len(self.stack.layers)}-layer small drafter of this target "
                f"(missing {missing[:3]}, unexpected {unexpected[:3]})",
                "use a checkpoint trained for this target (specbench train-drafter drafter.kind=small)",
            )
        self.stack.load_state_dict({**self.stack.state_dict(), **{k: state[k].to(self._dtype) for k in mine}})

    def get_output_embeddings(self) -> nn.Module:
        """The target's LM head (whose rows it scores): its width is the vocabulary its logits cover."""
        return self.head.lm_head

    def get_input_embeddings(self) -> nn.Module:
        return self.stack.embed_tokens

    def own_parameters(self) -> list[nn.Parameter]:
        return [p for n, p in self.stack.named_parameters() if n.startswith(OWN)]

    def forward(
        self,
        input_ids=None,
        attention_mask=None,
        cache=None,
        past_key_values=None,
        use_cache=False,
        logits_to_keep=0,
        full=True,
        **kwargs,
    ):
        """``cache`` (transformers 5) or ``past_key_values`` (4.x): the KV cache, handed to the layers under
        their own keyword; the output holds it under both names (``CachedLM`` reads ``cache``). ``full=False``:
        logits over the sub-vocabulary only (``[..., N]``, training: no ``V``-wide rows)."""
        kv = cache if cache is not None else past_key_values
        out = self.stack(
            input_ids=input_ids,
            attention_mask=attention_mask,
            use_cache=use_cache,
            **({self._cache_kw: kv} if kv is not None else {}),
            **kwargs,
        )
        h = out.last_hidden_state
        if logits_to_keep:
            h = h[:, -int(logits_to_keep) :]
        logits = self.head(h)
        if full:
            logits = self.head.to_full(logits, float("-inf"))
        kv = out[self._cache_kw] if use_cache else None
        return SmallOutput(logits=logits, cache=kv, past_key_values=kv)


class SmallOutput(dict):
    """``out.logits`` and ``out["cache"]`` alike (what ``CachedLM`` and the fine-tuning losses read)."""

    __getattr__ = dict.__getitem__


def cost_of(model: SmallLM, target: Target) -> float:
    """Parameters touched per draft token (its layers, its norm and the LM-head rows it scores) / the target's."""
    own = sum(p.numel() for p in model.own_parameters())
    rows = model.head.weight.numel() if model.head.weight is not None else model.head.lm_head.weight.numel()
    return (own + rows) / sum(p.numel() for p in target.model.parameters())


def save(model: SmallLM, path: Path, meta: dict) -> None:
    """The trained tensors (+ ``d2t``) as ``model.safetensors``; ``config.json``: the kind, the layer count, the
    target's vocabulary and ``meta`` under ``specbench``."""
    path.mkdir(parents=True, exist_ok=True)
    tensors = {k: v.detach().contiguous().cpu() for k, v in model.own_state().items()}
    if model.d2t is not None:
        tensors["d2t"] = model.d2t.detach().cpu().to(torch.int64)
    save_tensors(tensors, path / WEIGHTS_FILE)
    config = {"specbench": {"kind": KIND, "layers": len(model.stack.layers), **meta}}
    atomic_write_text(path / CONFIG_FILE, json.dumps(config, indent=1, default=str))


def load(
    checkpoint: str,
    target: Target,
    make_target: str | None = None,
    layers_key: str = "num_hidden_layers",
    dtype: torch.dtype | None = None,
) -> tuple[SmallLM, Path]:
    path = resolve_checkpoint(checkpoint, make_target)
    meta = read_meta(path).get("specbench") or {}
    if meta.get("kind") != KIND or not meta.get("layers"):
        raise SpecbenchError(
            f"{path} is not a small-drafter checkpoint (its config.json names kind {meta.get('kind')!r})",
            "point drafter.checkpoint at a directory written by `specbench train-drafter drafter.kind=small`",
        )
    if meta.get("vocab") and meta["vocab"] != vocab_fingerprint(target.tokenizer):
        raise SpecbenchError(
            f"small drafter {path} was trained for target '{meta.get('target')}', whose vocabulary "
            f"differs from this target's",
            shipped.other_target_fix(
                str(checkpoint), target.loaded.name, "use a small drafter trained for this target"
            ),
        )
    state = load_state(path)
    d2t = state.get("d2t")
    model = SmallLM(
        target, int(meta["layers"]), None if d2t is None else d2t.long().to(target.device), layers_key, dtype
    )
    model.load_own(state, path)
    return model.eval(), path


def build(
    target: Target,
    name: str,
    checkpoint: Checkpoint = None,
    make_target: MakeTarget = None,
    layers_key: LayersKey = "num_hidden_layers",
    confidence_threshold: Confidence = 0.0,
    dtype: Dtype = None,
    tree: TreeDraft = None,
) -> ModelDrafter:
    """A ``ModelDrafter`` over the small model of ``checkpoint`` (``package:<name>``, ``cache:<path>``, a directory);
    ``tree``: ``{width, nodes}`` drafts a dynamic draft tree each round (null: a chain)."""
    if not checkpoint:
        raise SpecbenchError(
            f"drafter '{name}' (small) has no checkpoint",
            f"set its checkpoint, or build one with `{make_target or 'make small-drafter'}`",
        )
    from specbench.models.devices import resolve_dtype

    model, path = load(
        checkpoint, target, make_target, layers_key, resolve_dtype(dtype, target.device) if dtype else None
    )
    drafter = ModelDrafter(
        name,
        model,
        target.vocab_size,
        cost_of(model, target),
        confidence_threshold,
    )
    drafter.fingerprint = files_fingerprint(path)  # resumes check it (run_records.Records)
    return with_tree(drafter, tree, name)


# its drafter drafts the rows of a batch in one forward (ModelDrafter.cohort; pipelines/batch_settings.py): chains
build.batches = "chains"
