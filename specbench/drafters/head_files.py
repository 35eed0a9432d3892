"""A draft head's files: its checkpoint directory (``model.safetensors`` or the original ``pytorch_model.bin``,
and ``config.json`` with specbench's recipe under ``specbench``), where a checkpoint name points (a local
directory, ``package:<name>``, ``cache:<path>`` or a hub id), and the tokenizer fingerprint that ties a head to
its target's vocabulary. Shared by the EAGLE heads (``eagle/``: both layouts) and the small drafter."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import torch

from specbench.drafters import shipped
from specbench.errors import SpecbenchError
from specbench.files import atomic_write_text, save_tensors
from specbench.models.loading import resolve_cached
from specbench.records import CONFIG_FILE, WEIGHTS_FILE


def vocab_fingerprint(tokenizer) -> str:
    """A short hash of the tokenizer's (token, id) pairs: equal fingerprints, same ids."""
    items = sorted(tokenizer.get_vocab().items(), key=lambda kv: kv[1])
    return hashlib.sha256(json.dumps(items, ensure_ascii=False).encode()).hexdigest()[:16]


DAMAGED_FIX = (
    "replace the checkpoint with an intact copy: train it again (`specbench train-drafter`, into a "
    "new directory or after deleting this one) or download the head again"
)


def load_state(path: Path) -> dict[str, torch.Tensor]:
    """The head's tensors from a checkpoint directory (safetensors, or the original ``pytorch_model.bin``);
    a file that cannot be read (truncated, damaged, not a checkpoint) is an error naming it."""
    if (path / WEIGHTS_FILE).exists():
        from safetensors import SafetensorError
        from safetensors.torch import load_file

        try:
            return load_file(str(path / WEIGHTS_FILE))
        except (SafetensorError, OSError, ValueError, RuntimeError) as exc:
            raise damaged(path / WEIGHTS_FILE, exc) from exc
    if (path / "pytorch_model.bin").exists():
        try:
            return torch.load(path / "pytorch_model.bin", map_location="cpu", weights_only=True)
        except Exception as exc:  # noqa: BLE001 - a damaged pickle can fail with any error type (AssertionError too)
            raise damaged(path / "pytorch_model.bin", exc) from exc
    raise SpecbenchError(
        f"{path} holds no head weights ({WEIGHTS_FILE} or pytorch_model.bin)",
        "point the drafter's checkpoint at a directory written by `specbench train-drafter` "
        "or an EAGLE-1 head",
    )


def damaged(file: Path, exc: Exception) -> SpecbenchError:
    reason = str(exc).splitlines()[0] if str(exc) else ""
    reason = reason.split(". ")[0]  # torch's messages run on with advice that does not apply here
    return SpecbenchError(
        f"draft head file {file} cannot be read ({type(exc).__name__}: {reason[:200]})", DAMAGED_FIX
    )


def resolve_checkpoint(checkpoint: str, make_target: str | None = None) -> Path:
    """A local directory, ``package:<name>`` (a head shipped with specbench: ``drafters/shipped.py``),
    ``cache:<path>`` (under ``$SPECBENCH_CACHE``, where ``train-drafter`` writes), or a hub id downloaded
    once (users with hub access)."""
    if str(checkpoint).startswith(shipped.PREFIX):
        return shipped.resolve_package(str(checkpoint), make_target)
    local = resolve_cached(checkpoint, make_target)
    if local is not None:
        return local
    path = Path(str(checkpoint)).expanduser()
    hub_id = str(checkpoint).count("/") == 1 and not str(checkpoint).startswith((".", "/", "~"))  # owner/name
    if hub_id and not path.exists():
        try:
            from huggingface_hub import snapshot_download

            return Path(snapshot_download(str(checkpoint)))
        except Exception as exc:  # noqa: BLE001 - offline, unknown repo, no access: one clear message
            raise SpecbenchError(
                f"could not fetch the draft head '{checkpoint}' from the hub ({type(exc).__name__})",
                "pass a local directory, or check the hub id and your network",
            ) from exc
    fix = f"build it with `{make_target}`" if make_target else "train one with `specbench train-drafter`"
    missing = f"no directory {path}" + (f" (its parent {path.parent} exists)" if path.parent.is_dir() else "")
    raise SpecbenchError(
        f"draft head checkpoint {checkpoint} not found: {missing}, and it is not a hub id (owner/name)",
        f"check the path, or {fix}",
    )


def read_meta(path: Path) -> dict:
    """A head directory's ``config.json`` (``{}`` when it has none); a damaged one is an error naming it."""
    if not (path / CONFIG_FILE).exists():
        return {}
    try:
        meta = json.loads((path / CONFIG_FILE).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise damaged(path / CONFIG_FILE, exc) from exc
    if not isinstance(meta, dict):
        raise damaged(path / CONFIG_FILE, ValueError(f"a JSON {type(meta).__name__}, not an object"))
    return meta


def save_head(head: torch.nn.Module, d2t: torch.Tensor | None, path: Path, meta: dict) -> None:
    """An ``EagleHead``'s own tensors (and ``d2t``) as ``model.safetensors``, its layer config with ``meta`` under
    ``specbench`` as ``config.json``."""
    path.mkdir(parents=True, exist_ok=True)
    tensors = {k: v.detach().contiguous().cpu() for k, v in head.state_dict().items()}
    if d2t is not None:
        tensors["d2t"] = d2t.detach().cpu().to(torch.int64)
    save_tensors(tensors, path / WEIGHTS_FILE)
    config = head._stack[0].config.to_dict()
    config["specbench"] = meta
    atomic_write_text(path / CONFIG_FILE, json.dumps(config, indent=1, default=str))
