"""Where the Hydra configs live (the repository's top-level ``conf/``)."""

from __future__ import annotations

import os
from pathlib import Path

from specbench.errors import SpecbenchError


def conf_dir() -> str:
    path = Path(os.environ.get("SPECBENCH_CONF", Path(__file__).resolve().parent.parent / "conf"))
    if not (path / "eval.yaml").exists():
        raise SpecbenchError(f"config directory {path} not found",
                             "install specbench from its repository with `pip install -e .`, or set SPECBENCH_CONF")
    return str(path)


def group_options(group: str) -> list[str]:
    return sorted(p.stem for p in (Path(conf_dir()) / group).glob("*.yaml"))
