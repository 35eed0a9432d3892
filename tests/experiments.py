"""The experiments of ``conf/experiment`` and the commands (root configs) each is written for, by name
prefix: shared by the config tests and the paper-scale dry run."""

from __future__ import annotations

import functools
from pathlib import Path

from hydra import compose, initialize_config_dir

from specbench.configs import conf_dir

COMMANDS = {
    "cascades": ["cascades"],
    "huang_fig3": ["trace", "collect"],
    "huang": ["collect", "eval"],
    "metasd": ["eval"],
    "specialists": ["eval"],
    "reproduce_huang": ["collect", "eval"],
    "reproduce_metasd": ["eval"],
    "spec_bench": ["eval"],
    "drafter": ["train_drafter"],
    "draft_confidence": ["eval"],
    "demo": ["eval"],
    "trees": ["eval"],
    "trace_seed": ["trace", "collect"],  # collect: its prompts' embeddings (make routing-seed)
    "trace": ["trace"],
    "routing": ["trace", "collect"],
    "replay": ["eval"],
    "aa": ["eval"],
    "budget": ["eval"],
    "batch": ["eval"],
}


def experiments() -> list[str]:
    return sorted(p.stem for p in (Path(conf_dir()) / "experiment").glob("*.yaml"))


def commands_for(name: str) -> list[str]:
    cmds = next((cmds for prefix, cmds in COMMANDS.items() if name.startswith(prefix)), None)
    assert cmds, f"experiment {name}: add its name prefix and commands to COMMANDS in tests/experiments.py"
    return cmds


@functools.cache
def paper_scale(name: str) -> bool:
    """An experiment is paper scale when its target is not an embedded model (it needs a GPU and the hub)."""
    with initialize_config_dir(config_dir=conf_dir(), version_base=None):
        cfg = compose(config_name=commands_for(name)[0], overrides=[f"experiment={name}"])
    return not str(cfg.target.model).startswith("embedded:")
