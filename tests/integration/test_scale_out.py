"""Scale-out on Hydra's submitit launcher (the `slurm` extra): two collect shards launched as separate
jobs by ``hydra/launcher=submitit_local`` (the same launcher code path as ``submitit_slurm`` on a
cluster, local processes instead of SLURM jobs) merge into exactly the rows of one unsharded run."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir

from specbench.configs import conf_dir
from specbench.pipelines import collect, collected

pytest.importorskip(
    "hydra_plugins.hydra_submitit_launcher",
    reason="hydra-submitit-launcher is not installed (pip install 'specbench[slurm]')",
)

ROOT = Path(__file__).resolve().parents[2]
TINY = [
    "target=tiny_llama",
    "pool=tiny",
    "dataset.limit=1",
    "decoding.max_new_tokens=6",
    "warmup.max_new_tokens=0",
    "collect.max_new_tokens=6",
    "threads=1",
]


def deterministic(row: dict) -> dict:
    """A row without what depends on timing or on which shard wrote it."""
    return {
        "query_id": row["query_id"],
        "fingerprint": row["fingerprint"],
        "index": row["index"],
        "target": row["target"]["tokens"],
        "embedding": [round(x, 5) for x in row["embedding"]],
        "arms": {
            a: {k: rec.get(k) for k in ("standalone", "alignment", "cost_params", "text", "new_tokens")}
            for a, rec in row["arms"].items()
        },
    }


def test_two_submitit_shards_merge_into_one_unsharded_run(tmp_path):
    sweep = tmp_path / "sweep"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    res = subprocess.run(
        [
            sys.executable,
            "-m",
            "specbench.cli",
            "collect",
            "-m",
            "collect.shard=0,1",
            "collect.num_shards=2",
            "hydra/launcher=submitit_local",
            "hydra.launcher.timeout_min=10",
            f"hydra.sweep.dir={sweep}",
            *TINY,
        ],
        capture_output=True,
        text=True,
        timeout=900,
        cwd=tmp_path,
        env=env,
    )
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-3000:]
    assert (sweep / "0" / "rows-00000-of-00002.jsonl").exists() and (
        sweep / "1" / "rows-00001-of-00002.jsonl"
    ).exists()
    assert list((sweep / ".submitit").iterdir()), "the jobs did not go through submitit"
    merged = collected.merge([str(sweep / "0"), str(sweep / "1")], tmp_path / "merged")

    with initialize_config_dir(config_dir=conf_dir(), version_base=None):
        cfg = compose(config_name="collect", overrides=TINY)
    collect.run(cfg, tmp_path / "one")
    one = collected.read_rows([tmp_path / "one"])
    both = collected.read_rows([merged.parent])
    assert len(one) == 4
    assert [deterministic(r) for r in both] == [deterministic(r) for r in one]
