"""The experiments of ``conf/experiment`` and the commands (root configs) each is written for, by name
prefix: shared by the config tests and the paper-scale dry run."""

from __future__ import annotations

from pathlib import Path

from specbench.configs import conf_dir

COMMANDS = {"cascades": ["cascades"], "huang": ["collect", "eval"], "metasd": ["eval"], "specialists": ["eval"],
            "spec_bench": ["eval"], "drafter": ["train_drafter"]}


def experiments() -> list[str]:
    return sorted(p.stem for p in (Path(conf_dir()) / "experiment").glob("*.yaml"))


def commands_for(name: str) -> list[str]:
    cmds = next((cmds for prefix, cmds in COMMANDS.items() if name.startswith(prefix)), None)
    assert cmds, f"experiment {name}: add its name prefix and commands to COMMANDS in tests/experiments.py"
    return cmds
