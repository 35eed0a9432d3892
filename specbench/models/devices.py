"""Devices and dtypes: ``auto`` resolved (CUDA when present; bfloat16 where the hardware computes it natively),
dtype names made canonical, and dtypes a device cannot compute in refused."""

from __future__ import annotations

from pathlib import Path

import torch
import transformers
from packaging.version import Version

from specbench.errors import SpecbenchError

# transformers renamed from_pretrained's torch_dtype to dtype in 4.56.
DTYPE_KW = "dtype" if Version(transformers.__version__) >= Version("4.56") else "torch_dtype"

DTYPES = {
    "float32": torch.float32,
    "fp32": torch.float32,
    "bfloat16": torch.bfloat16,
    "bf16": torch.bfloat16,
    "float16": torch.float16,
    "fp16": torch.float16,
}


def resolve_device(device: str | None) -> torch.device:
    """``auto`` -> CUDA when present, else CPU. Asking for CUDA without one is an error."""
    device = device or "auto"
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dev = torch.device(device)
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise SpecbenchError(
            f"device '{device}' was asked for but torch sees no CUDA device",
            "use target.device=cpu (or auto), or install a CUDA build of torch",
        )
    return dev


AUTO = "auto"
# CPU flags (as /proc/cpuinfo names them) whose instructions compute bf16 matmuls natively.
CPU_BF16_FLAGS = ("avx512_bf16", "amx_bf16")


def cpu_bf16_flags() -> tuple[frozenset[str], str]:
    """``(flags, source)``: which of :data:`CPU_BF16_FLAGS` this CPU has, and how that was found out:
    torch's own CPU probes where this torch has them (``torch.cpu._is_avx512_bf16_supported`` and
    ``_is_amx_tile_supported``, torch >= 2.1), else the flags line of ``/proc/cpuinfo`` (Linux)."""
    probes = {
        "avx512_bf16": getattr(torch.cpu, "_is_avx512_bf16_supported", None),
        "amx_bf16": getattr(torch.cpu, "_is_amx_tile_supported", None),
    }
    if all(callable(f) for f in probes.values()):
        try:
            return frozenset(k for k, f in probes.items() if f()), "torch.cpu capability probes"
        except RuntimeError:
            pass
    try:
        text = Path("/proc/cpuinfo").read_text(errors="replace")
    except OSError:
        return frozenset(), "no CPU flags readable (not Linux): assumed none"
    flags = next(
        (line.split(":", 1)[1].split() for line in text.splitlines() if line.startswith("flags")), []
    )
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
    flags = next(
        (line.split(":", 1)[1].split() for line in text.splitlines() if line.startswith("flags")), []
    )
    return any(f in flags for f in CPU_FP16_FLAGS)


def check_dtype_supported(dtype: torch.dtype, device: torch.device) -> None:
    """Refuse a dtype the device cannot compute in: float16 on a CPU without fp16 matmul instructions
    (emulated, many times slower than float32), bfloat16 on a CUDA device without bf16."""
    device = torch.device(device)
    if dtype == torch.float16 and device.type == "cpu" and not cpu_fp16_supported():
        raise SpecbenchError(
            "dtype float16 was asked for on a CPU without fp16 matmul support (neither AMX-FP16 nor AVX512-FP16)",
            "use target.dtype=bfloat16 (or float32, or auto) on this CPU, or run on a GPU (target.device=cuda)",
        )
    if dtype == torch.bfloat16 and device.type == "cuda" and not torch.cuda.is_bf16_supported():
        raise SpecbenchError(
            f"dtype bfloat16 was asked for on CUDA device {device}, which does not support it",
            "use target.dtype=float16 (or float32, or auto) on this GPU",
        )
