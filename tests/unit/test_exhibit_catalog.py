"""The exhibits are declared once each (``ExhibitSpec``): the plans and the report are derived from them, so
adding an exhibit is one object. No run directory is written twice, and every published value has an owner."""

from __future__ import annotations

import re

import pandas as pd

from specbench.reproduction import catalog, plan, render, runs
from specbench.reproduction import verdicts as V
from specbench.reproduction.exhibit import Exhibit, ExhibitSpec
from specbench.reproduction.published import load
from specbench.reproduction.runs import Run, under_root
from tests.unit.test_reproduction import write_examples


def test_adding_an_exhibit_is_one_object(tmp_path, monkeypatch):
    """A new exhibit with a run of its own that reads an existing run: the CPU plan gains its step after that
    run, and the report its page with its verdict; nothing else is edited."""
    mine = Run(
        "extra/eval",
        "eval",
        {"cpu": ("experiment=reproduce_metasd", f"+note={under_root(runs.METASD_EVAL)}")},
        reads=(runs.METASD_EVAL,),
    )

    def build(root, published, layout):
        ex = pd.read_json(root / mine.dir / "examples.jsonl", lines=True)
        p = {m: ex[ex.method == m] for m in ("autoregressive", "fixed:a")}
        verdict = V.faster(
            "a is faster than autoregressive decoding",
            (list(p["fixed:a"].seconds), list(p["fixed:a"].new_tokens)),
            (list(p["autoregressive"].seconds), list(p["autoregressive"].new_tokens)),
        )
        return Exhibit(
            "An extra exhibit", ex.groupby("method").seconds.sum().reset_index(), [verdict], "notes"
        )

    spec = ExhibitSpec("extra/table", build, (mine,))
    monkeypatch.setattr(catalog, "EXHIBITS", (*catalog.EXHIBITS, spec))

    steps = plan.SCALES["cpu"].plan()
    order = [s.run for s in steps]
    assert order[-1] == mine.dir and order.index(runs.METASD_EVAL.dir) < order.index(mine.dir)
    assert mine.dir not in [s.run for s in plan.SCALES["paper"].plan()]  # no paper-scale overrides: not there

    root = tmp_path / "root"
    write_examples(root / mine.dir, {"math": {"fixed:a": 1.5}})
    out = render.write(root)
    page = (out / "extra" / "table.md").read_text()
    assert "**held**: a is faster than autoregressive decoding" in page and "`extra/eval`" in page
    assert "An extra exhibit" in (out / "REPORT.md").read_text()


def test_the_plans_are_the_exhibits_runs_and_each_run_directory_is_declared_once():
    dirs = [r.dir for r in catalog.RUNS]
    assert len(dirs) == len(set(dirs))
    for scale in runs.RUN_SCALES:
        steps = catalog.plan_at(scale)
        needed = {r.dir for spec in catalog.specs_at(scale) for r in spec.runs}
        assert {s.run for s in steps} >= needed
        for i, step in enumerate(steps):  # every upstream run a step reads runs before it
            for up in plan.upstream_of(step, steps):
                assert steps.index(up) < i, (step.run, up.run)
    # every run is read by some exhibit at every scale it runs at
    for r in catalog.RUNS:
        for scale in r.at:
            assert any(r in spec.runs for spec in catalog.specs_at(scale)) or any(
                r in other.reads_at(scale) for other in catalog.RUNS
            ), (r.dir, scale)


def test_each_run_declares_the_runs_its_overrides_read():
    """``Run.reads`` is the runs whose directories its overrides name (``{root}/<dir>``), at every scale it runs at;
    a run is declared after the runs it reads, so the plan's order (declaration order) runs them first."""
    for r in catalog.RUNS:
        for scale, overrides in r.at.items():
            named = {
                o.dir
                for o in catalog.RUNS
                if any(re.search(rf"\{{root\}}/{re.escape(o.dir)}(/|$)", x) for x in overrides)
            }
            assert named == {u.dir for u in r.reads_at(scale)}, (r.dir, scale)
        assert all(u.order < r.order for u in r.reads), r.dir


def test_the_plan_order_is_the_declaration_order():
    """``RUNS``, derived from the exhibits, lists every run in the order ``runs.py`` declares them (upstream first)."""
    assert [r.dir for r in catalog.RUNS] == [
        "spec_bench/eval",
        "huang/collect",
        "huang/policy",
        "huang/eval",
        "huang/math/collect",
        "huang/math/policy",
        "huang/math/policy_speed",
        "huang/math/eval",
        "huang/depth/collect",
        "huang/depth/without_ar",
        "huang/depth/with_ar",
        "huang/depth/eval_without_ar",
        "huang/depth/eval_with_ar",
        "huang/depth/without_ar_speed",
        "huang/depth/with_ar_speed",
        "huang/depth/alpha",
        "huang/depth/alpha_speed",
        "metasd/eval",
        "metasd/eagle",
        "metasd/seed_live",
        "metasd/trees",
        "metasd/stream",
        *(f"metasd/multilingual/{lang}" for lang in ("ja", "ru", "de", "fr", "zh")),
        "cascades/greedy",
        "cascades/summarization",
        "cascades/sampling",
        *(f"cascades/{name}" for name in ("t5_wmt", "t5_xsum", "t5_cnndm", "gemma_gsm8k", "gemma27b_gsm8k")),
    ]


def test_every_published_value_belongs_to_an_exhibit():
    owned = {key for spec in catalog.EXHIBITS for key in spec.published}
    assert {f"{p.paper}/{p.exhibit}" for p in load()} <= owned
