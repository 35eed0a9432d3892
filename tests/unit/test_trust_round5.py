"""Issue 71, trust round 5: fix lines whose way works, paths that do not exist said so, report options given to
reproduce named as the report's. Each case raises a clear error (``error:`` and ``fix:``, exit 2 from a script) or
behaves correctly, and where the fix can be followed here, the test follows it. No model is loaded."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from typer.testing import CliRunner

from specbench.errors import SpecbenchError


def test_a_damaged_reproduce_json_is_told_the_scale_its_steps_ran_at_and_the_fix_works(tmp_path):
    """A tiny root's damaged reproduce.json was told to write "scale": "cpu", which was then refused as another scale:
    the fix names the scale the steps were run at (tiny), and writing it lets the root be read again."""
    from specbench.reproduction import plan, render

    root = tmp_path / "root"
    step = root / "huang" / "collect"
    step.mkdir(parents=True)
    tiny = list(plan.SCALES["tiny"].overrides["collect"])
    (step / ".done").write_text(
        json.dumps({"command": "collect", "overrides": ["experiment=reproduce_huang", *tiny]})
    )
    (root / "reproduce.json").write_text("{torn")
    with pytest.raises(SpecbenchError, match="is damaged") as err:
        render.recorded(root)
    fix = err.value.fix
    assert '"scale": "tiny"' in fix and '"layout": "cpu"' in fix
    (root / "reproduce.json").write_text(fix.split("write it again: ", 1)[1].split(" (the scale", 1)[0])
    assert render.recorded_scale(root) == "tiny"
    plan.choose_steps(root, "tiny", None, [], plan.QUESTIONS)  # the tiny plan takes the root again
    (step / ".done").write_text(
        json.dumps({"command": "collect", "overrides": ["experiment=reproduce_huang"]})
    )
    (root / "reproduce.json").write_text("[]")
    with pytest.raises(SpecbenchError, match="is damaged") as err:
        render.recorded(root)
    assert '"scale": "cpu"' in err.value.fix


def test_a_report_option_given_to_reproduce_is_named_as_the_reports():
    from specbench.cli import app

    result = CliRunner().invoke(
        app, ["reproduce", "--root", "/nonexistent/r", "--long-horizon", "outputs/lh"]
    )
    assert result.exit_code == 2
    assert "--long-horizon is an option of `specbench report`" in result.output
    assert "specbench report ROOT --long-horizon" in result.output


def test_a_damaged_measured_cost_is_called_damaged_naming_its_key():
    """It was reported as "no measured cost of drafter 'quantized' (its drafters: quantized, ...)", which contradicts
    itself; a missing drafter still reads as missing."""
    from specbench import profiling

    target = SimpleNamespace(
        model=torch.nn.Linear(1, 1), loaded=SimpleNamespace(name="t"), device=torch.device("cpu")
    )
    base = {**profiling.identity(target), "_file": "p/profile.json"}
    with pytest.raises(
        SpecbenchError, match=r"p/profile.json is damaged: drafters.quantized.c_draft is 'abc'"
    ):
        profiling.measured_cost({**base, "drafters": {"quantized": {"c_draft": "abc"}}}, "quantized", target)
    with pytest.raises(
        SpecbenchError, match=r"has no measured cost of drafter 'small' \(its drafters: quantized\)"
    ):
        profiling.measured_cost({**base, "drafters": {"quantized": {"c_draft": 0.1}}}, "small", target)
    assert (
        profiling.measured_cost({**base, "drafters": {"quantized": {"c_draft": 0.1}}}, "quantized", target)
        == 0.1
    )


SCRIPTS = {
    "budget_decisions": ["{missing}"],
    "cost_model": ["{missing}"],
    "multi_drafter": ["{missing}"],
    "batch_throughput": ["{missing}", "--out", "{out}"],
    "long_horizon": ["{missing}", "{out}"],
    "aa_calibration": ["{missing}"],
    "routing": ["{out}", "--policy", "p", "--arms", "a,b", "--stream", "clean={missing}:{missing}"],
    "times": ["page", "{missing}", "{out}"],
}


@pytest.mark.parametrize("name", sorted(SCRIPTS))
def test_every_script_says_a_missing_path_does_not_exist(name, tmp_path, monkeypatch, capsys):
    """`python -m specbench.reproduction.budget_decisions <missing dir>` said "holds no round a budget built": every
    script says "does not exist" for a path that does not exist, with error:/fix: lines and exit code 2."""
    import importlib
    import runpy
    import sys

    missing, out = str(tmp_path / "nowhere"), str(tmp_path / "out")
    argv = [a.format(missing=missing, out=out) for a in SCRIPTS[name]]
    module = f"specbench.reproduction.{name}"
    main = getattr(importlib.import_module(module), "main", None)
    with pytest.raises(SystemExit) as exit_:
        if main is not None:
            main(argv)
        else:
            monkeypatch.setattr(sys, "argv", [module, *argv])
            runpy.run_module(module, run_name="__main__")
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert "does not exist" in err and err.startswith("error: ") and "\nfix: " in err, err
    assert not Path(out).exists() or name in ("times",)


def test_the_one_commit_fix_names_the_directories_and_the_command_that_reruns_them(tmp_path):
    from specbench import provenance

    found = {"aaaaaaaaaa": ["huang/eval"], "bbbbbbbbbb (uncommitted changes)": ["metasd/eval"]}
    with pytest.raises(SpecbenchError, match="did not all come from one clean commit") as err:
        provenance.check_one_commit(found, tmp_path)
    fix = err.value.fix
    assert "rm -r" in fix and str(tmp_path / "huang/eval") in fix and str(tmp_path / "metasd/eval") in fix
    assert f"specbench reproduce --root {tmp_path} --redo" in fix
