"""Every experiment config composes with the commands it is meant for (no model is loaded, nothing
is downloaded): paper-scale configs are for users with GPUs and hub access, so this is the check
that they stay runnable as the code changes."""

from __future__ import annotations

from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from specbench.configs import conf_dir

EXPERIMENTS = sorted(p.stem for p in (Path(conf_dir()) / "experiment").glob("*.yaml"))
COMMANDS = {"metasd": ["eval"], "huang": ["collect", "eval"]}


def commands_for(name: str) -> list[str]:
    return next((cmds for prefix, cmds in COMMANDS.items() if name.startswith(prefix)), ["eval"])


@pytest.mark.parametrize("name", EXPERIMENTS)
def test_experiment_composes(name):
    for command in commands_for(name):
        with initialize_config_dir(config_dir=conf_dir(), version_base=None):
            cfg = compose(config_name=command, overrides=[f"+experiment={name}"])
        # resolve everything but the values a user must supply (???)
        container = OmegaConf.to_container(cfg, resolve=False)
        assert container["target"]["model"]
        assert cfg.pool.drafters is not None or name.endswith("none")
        for key, drafter in (cfg.pool.drafters or {}).items():
            assert "_target_" in drafter, f"{name}: drafter {key} has no _target_"
        if command == "eval":
            assert "autoregressive" in list(cfg.methods)
