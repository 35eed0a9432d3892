"""``target.dtype: auto``: bfloat16 where the hardware computes it natively, float32 elsewhere.

Only the capability queries are mocked (the CPU flags, torch.cuda.is_bf16_supported); the resolution,
the aliases and what the run's config records are the product's own code.
"""

from __future__ import annotations

import pytest
import torch
from omegaconf import OmegaConf

from specbench.errors import SpecbenchError
from specbench.models import devices
from specbench.pipelines.session.run_dir import start_run
from specbench.pipelines.session.settings import resolve_target_dtype


@pytest.mark.parametrize(
    "flags, expected",
    [
        (frozenset({"avx512_bf16"}), "bfloat16"),
        (frozenset({"amx_bf16"}), "bfloat16"),
        (frozenset({"avx512_bf16", "amx_bf16"}), "bfloat16"),
        (frozenset(), "float32"),
    ],
)
def test_cpu_auto_follows_the_bf16_flags(monkeypatch, flags, expected):
    monkeypatch.setattr(devices, "cpu_bf16_flags", lambda: (flags, "mocked"))
    name, why = devices.auto_dtype(torch.device("cpu"))
    assert name == expected
    assert "mocked" in why and (all(f in why for f in flags) if flags else "neither" in why)
    assert devices.resolve_dtype("auto", "cpu") == devices.DTYPES[expected]


@pytest.mark.parametrize("supported, expected", [(True, "bfloat16"), (False, "float32")])
def test_cuda_auto_follows_torch_cuda(monkeypatch, supported, expected):
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: supported)
    assert devices.auto_dtype(torch.device("cuda"))[0] == expected


def test_other_devices_and_explicit_dtypes():
    assert devices.auto_dtype(torch.device("meta"))[0] == "float32"
    assert devices.dtype_name("bf16") == "bfloat16"
    assert devices.dtype_name("fp32") == "float32"
    assert devices.dtype_name(None) == "float32"
    with pytest.raises(SpecbenchError, match="unknown dtype 'int3'"):
        devices.dtype_name("int3")


def test_cpu_flags_are_read_by_torch_or_from_cpuinfo(monkeypatch):
    flags, source = devices.cpu_bf16_flags()
    assert flags <= set(devices.CPU_BF16_FLAGS) and source
    # without torch's probes: the flags line of /proc/cpuinfo (or none where it cannot be read)
    monkeypatch.delattr(torch.cpu, "_is_avx512_bf16_supported", raising=False)
    flags2, source2 = devices.cpu_bf16_flags()
    assert "cpuinfo" in source2 or "not Linux" in source2
    assert flags2 <= set(devices.CPU_BF16_FLAGS)


def test_the_run_config_records_the_resolved_dtype(monkeypatch, tmp_path):
    monkeypatch.setattr(devices, "cpu_bf16_flags", lambda: (frozenset({"amx_bf16"}), "mocked"))
    cfg = OmegaConf.create({"target": {"model": "embedded:tiny_llama", "dtype": "auto", "device": "cpu"}})
    start_run(cfg, tmp_path)
    assert OmegaConf.load(tmp_path / "config.yaml").target.dtype == "bfloat16"
    monkeypatch.setattr(devices, "cpu_bf16_flags", lambda: (frozenset(), "mocked"))
    cfg = OmegaConf.create({"target": {"model": "m", "dtype": "auto", "device": "cpu"}})
    resolve_target_dtype(cfg)
    assert cfg.target.dtype == "float32"
