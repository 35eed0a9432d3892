"""Reading an EAGLE-3 checkpoint (``eagle3.py``'s loader): its config, its layout (SafeAILab/EAGLE and SpecForge, or
vLLM ``speculators``), its tensors under the head's own names, its draft vocabulary, and every check of its shapes
against the target, each refusal naming the checkpoint and what to use instead. ``eagle3.load_eagle3`` builds the
head from what these return.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import NamedTuple

import torch

from specbench.drafters.head_files import CONFIG_FILE, damaged, load_state, resolve_checkpoint
from specbench.errors import SpecbenchError
from specbench.models.target import Target

AUX_KEY = "eagle_aux_hidden_state_layer_ids"
LAYOUT_FIX = (
    "point the checkpoint at an EAGLE-3 head (SafeAILab/EAGLE or SpecForge: config.json with "
    "draft_vocab_size and midlayer.* tensors) or a vLLM speculators eagle3 head "
    "(speculators_model_type: eagle3); EAGLE-1 heads are the `eagle` drafter kind"
)


def read_config(path: Path) -> dict:
    file = path / CONFIG_FILE
    if not file.exists():
        raise SpecbenchError(f"draft head {path} has no {CONFIG_FILE}", LAYOUT_FIX)
    try:
        config = json.loads(file.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise damaged(file, exc) from exc
    if not isinstance(config, dict):
        raise damaged(file, ValueError(f"a JSON {type(config).__name__}, not an object"))
    return config


def layout_of(path: Path, config: dict, state: dict) -> tuple[str, dict]:
    """``("speculators" | "eagle3", the layer stack's config dict)``, or a clear error."""
    kind = config.get("speculators_model_type")
    if kind is not None:
        if kind != "eagle3":
            raise SpecbenchError(f"{path} is a speculators '{kind}' checkpoint, not eagle3", LAYOUT_FIX)
        layer = config.get("transformer_layer_config")
        if not isinstance(layer, dict):
            raise SpecbenchError(f"speculators checkpoint {path} has no transformer_layer_config", LAYOUT_FIX)
        return "speculators", layer
    architectures = " ".join(str(a) for a in config.get("architectures") or [])
    if (
        "draft_vocab_size" in config
        or "eagle3" in architectures.lower()
        or any(k.startswith("midlayer.") for k in state)
    ):
        return "eagle3", config
    raise SpecbenchError(
        f"{path} is neither an EAGLE-3 head (no draft_vocab_size / midlayer.* tensors) nor a "
        "speculators eagle3 head (no speculators_model_type)",
        LAYOUT_FIX,
    )


def aux_ids(config: dict, layer: dict) -> list[int] | None:
    for source in (config, config.get("eagle_config"), layer, layer.get("eagle_config")):
        if isinstance(source, dict) and source.get(AUX_KEY):
            return [int(i) for i in source[AUX_KEY]]
    return None


def draft_vocabulary(path: Path, state: dict, draft_vocab: int, vocab: int) -> torch.Tensor | None:
    """Absolute target ids of the draft rows (None: the draft vocabulary is the target's)."""
    offsets = state.get("d2t")
    if offsets is None:
        if draft_vocab < vocab:
            raise SpecbenchError(
                f"draft head {path} scores {draft_vocab} tokens but has no d2t mapping to the "
                f"target's {vocab}",
                "use a complete checkpoint (with its d2t tensor)",
            )
        return None
    offsets = offsets.long().flatten()
    if offsets.numel() != draft_vocab:
        raise SpecbenchError(
            f"draft head {path}: d2t has {offsets.numel()} entries for {draft_vocab} lm_head rows",
            "use a complete, consistent checkpoint",
        )
    ids = torch.arange(draft_vocab) + offsets
    if int(ids.min()) < 0 or int(ids.max()) >= vocab or ids.unique().numel() != draft_vocab:
        raise SpecbenchError(
            f"draft head {path}: d2t maps draft ids outside this target's vocabulary of {vocab} "
            "(or twice onto one id)",
            "use a head trained for this target's tokenizer",
        )
    t2d = state.get("t2d")
    if t2d is not None and t2d.numel() >= vocab:
        mask = t2d.bool().flatten()
        if int(mask.sum()) != draft_vocab or not bool(mask[ids].all()):
            raise SpecbenchError(f"draft head {path}: its d2t and t2d disagree", "use an intact checkpoint")
    if draft_vocab == vocab and bool((offsets == 0).all()):
        return None
    return ids


def checkpoint_path(checkpoint: str, make_target: str | None):
    """The checkpoint's directory; a missing one's fix names EAGLE-3 checkpoints, not train-drafter's heads."""
    try:
        return resolve_checkpoint(checkpoint, make_target)
    except SpecbenchError as exc:
        if make_target or "train-drafter" not in exc.fix:
            raise
        raise SpecbenchError(
            exc.problem,
            "point checkpoint at an EAGLE-3 head: a directory or hub id of an EAGLE-3 or "
            "speculators eagle3 checkpoint (specbench train-drafter makes EAGLE-1 heads, "
            "drafter=eagle)",
        ) from None


def read_state(path, config: dict):
    """The checkpoint's tensors under the head's own names (EAGLE-3's ``midlayer.*`` as ``layers.0.*``, the verifier's
    tensors dropped), its layer config and its decoder layer ids; refused without EAGLE-3 tensors."""
    state = load_state(path)
    layout, layer = layout_of(path, config, state)
    if layout == "eagle3":
        state = {
            ("layers.0." + k[len("midlayer.") :] if k.startswith("midlayer.") else k): v
            for k, v in state.items()
        }
    state = {k: v for k, v in state.items() if not k.startswith("verifier")}
    layer_ids = {int(k.split(".")[1]) for k in state if k.startswith("layers.") and k.split(".")[1].isdigit()}
    if "fc.weight" not in state or "lm_head.weight" not in state or 0 not in layer_ids:
        raise SpecbenchError(
            f"{path} lacks EAGLE-3 tensors (fc.weight, lm_head.weight, midlayer.* or layers.0.*)", LAYOUT_FIX
        )
    return state, layer, layer_ids


class Fit(NamedTuple):
    """What ``check_fit`` found: the layer config with its hidden size, the head's own embedding table (None: it
    reads the target's) and the size of its draft vocabulary (its LM head's rows)."""

    layer: dict
    embed: torch.Tensor | None
    draft_vocab: int


def check_fit(path, config: dict, layer: dict, state: dict, target: Target, aux: list[int]) -> Fit:
    """The head's shapes against ``target`` (feature width, hidden size, embedding, vocabularies): a ``Fit``, else
    a ``SpecbenchError``."""
    t_hidden = int(target.config.hidden_size)
    fc = state["fc.weight"]
    target_hidden = config.get("target_hidden_size") or layer.get("target_hidden_size")
    if (target_hidden is not None and int(target_hidden) != t_hidden) or fc.shape[1] != len(aux) * t_hidden:
        raise SpecbenchError(
            f"draft head {path} has fc {tuple(fc.shape)} for {len(aux)} aux layers: it needs "
            f"target features of width {fc.shape[1] // max(len(aux), 1)}, this target's hidden "
            f"size is {t_hidden}",
            "use a head trained for this target",
        )
    hidden = int(fc.shape[0])
    if int(layer.get("hidden_size", hidden)) != hidden:
        raise SpecbenchError(
            f"draft head {path}: config hidden_size {layer.get('hidden_size')} but fc gives {hidden}",
            "use an intact checkpoint",
        )
    layer["hidden_size"] = hidden
    embed = state.get("embed_tokens.weight")
    target_embed = target.model.get_input_embeddings().weight
    if embed is not None and (embed.shape[1] != hidden or embed.shape[0] < target.vocab_size):
        raise SpecbenchError(
            f"draft head {path} has embed_tokens {tuple(embed.shape)}, this target needs "
            f"({target_embed.shape[0]}, {hidden})",
            "use a head trained for this target",
        )
    if embed is None and hidden != target_embed.shape[1]:
        raise SpecbenchError(
            f"draft head {path} has hidden size {hidden}, the target's embeddings "
            f"{target_embed.shape[1]}, and the head has no embed_tokens of its own",
            "use a head trained for this target",
        )
    draft_vocab = int(state["lm_head.weight"].shape[0])
    if int(config.get("draft_vocab_size", draft_vocab)) != draft_vocab:
        raise SpecbenchError(
            f"draft head {path}: draft_vocab_size {config.get('draft_vocab_size')} but lm_head "
            f"has {draft_vocab} rows",
            "use an intact checkpoint",
        )
    head_vocab = layer.get("vocab_size") or config.get("vocab_size")
    if head_vocab is not None and int(head_vocab) != int(target.config.vocab_size) and embed is None:
        raise SpecbenchError(
            f"draft head {path} was trained for a vocabulary of {head_vocab} ids, this target "
            f"has {target.config.vocab_size}",
            "use a head trained for this target's tokenizer",
        )
    return Fit(layer, embed, draft_vocab)


def load_own(head: torch.nn.Module, state: dict, path) -> None:
    """The checkpoint's tensors into ``head``, refused unless they fit it exactly."""
    own = head.state_dict()
    state = {k: v for k, v in state.items() if k not in ("d2t", "t2d")}
    missing = [k for k in own if k not in state]
    unexpected = [k for k in state if k not in own]
    wrong = [k for k in own if k in state and tuple(state[k].shape) != tuple(own[k].shape)]
    if missing or unexpected or wrong:
        raise SpecbenchError(
            f"draft head {path} does not fit its config's EAGLE-3 layer (missing {missing[:3]}, "
            f"unexpected {unexpected[:3]}, wrong shape {wrong[:3]})",
            "use an intact EAGLE-3 checkpoint for a Llama-style head",
        )
    head.load_state_dict(state)
