"""``specbench reproduce``: every reproduction of a scale, end to end, into one root, then the report.

Each step is one of our commands with an experiment config and a fixed run directory under the
root (``<paper>/...``). Every step's config is composed and validated before anything is written. A
step records its resolved settings when it starts (``.step.json``) and, when it finishes, in ``.done``
(with its seconds, its record count and the fingerprints of the upstream steps it read); both record the
fingerprints of the shipped heads its settings read (``package:<name>``, :mod:`.heads`). A rerun skips a
finished step whose settings, heads and upstream runs are unchanged (logged as a warning); one whose
settings differ, whose shipped heads were rebuilt, or whose upstream step ran again, is refused naming
what differs, or with ``redo`` deleted and run again. An interrupted step resumes through its command's own resume (eval,
collect and cascades skip finished generations), except an eval whose selectors carry statistics
across queries (``carry_over``): its records are deleted and the step starts again. Scales (``--scale``; the
deprecated ``--profile`` is the same option):

- ``cpu``: the CPU-scale plan on the embedded SmolLM2 with the specialist pool (``make reproduce-cpu``);
- ``tiny``: the same plan on the tiny random Llama with a few tokens per query (a dry run: everything
  but the weights, in a couple of minutes);
- ``paper``: the paper-scale experiments (GPU, hub; ``make reproduce-paper``), in the same directory
  layout where the papers overlap (``huang/...``, ``metasd/eval``, ``metasd/stream``) plus their own
  (``spec_bench/eval``, ``metasd/eagle``, ``metasd/multilingual/<language>``, ``cascades/<experiment>``).

The root records its scale and that scale's report layout (``reproduce.json``, under its older key ``profile``
so roots written before keep working), so ``specbench report ROOT`` builds that layout's exhibits.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Annotated

from hydra import compose
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.errors import OverrideParseException
from omegaconf import OmegaConf

from specbench import provenance
from specbench.configs import EXPERIMENT, composing, conf_dir, hydra_error, hydra_overrides
from specbench.errors import SpecbenchError
from specbench.files import atomic_write_text
from specbench.reproduction.catalog import plan_at
from specbench.reproduction.inputs import count_lines
from specbench.reproduction.runs import (
    CONFIG,
    DONE,
    EXAMPLES,
    RECORD_FILES,
    ROOT_RECORD,
    ROUNDS,
    SPEC_BENCH,
    STARTED,
    Step,
)
from specbench.validate import Rule, each, list_of, section, text, validate

log = logging.getLogger(__name__)


SETTING = Rule(lambda v: isinstance(v, (bool, int, float, str)), "a number, a string, true or false")


@dataclass(frozen=True)
class Scale:
    """A scale of ``specbench reproduce --scale`` (an option of the config group conf/scale/): the run scale whose plan
    it runs, which is also its report layout (runs.RUN_SCALES, layouts.LAYOUTS), its own overrides by command or run
    directory, per-drafter settings for each step whose pool has that drafter, and the papers kept apart from its
    plan (run only when ``--paper`` names them: their own make target, so the plan keeps to its time)."""

    layout: Annotated[str, text()]
    # by command or run directory
    overrides: Annotated[dict[str, tuple[str, ...]], each(list_of(text()), null=True)] = field(
        default_factory=dict
    )
    # drafter name -> {key: value}
    drafters: Annotated[dict[str, dict[str, object]], each(each(SETTING), null=True)] = field(
        default_factory=dict
    )
    # papers whose steps run only when --paper names them
    apart: Annotated[tuple[str, ...], list_of(text())] = ()

    def plan(self) -> tuple[Step, ...]:
        """Every run the exhibits of ``layout`` read, upstream runs first (``catalog.plan_at``)."""
        return plan_at(self.layout)

    def drafter_overrides(self) -> list[str]:
        """``drafters`` as overrides (``pool.drafters.<name>.<key>=<value>``), for the steps whose pool has the
        drafter."""
        return [
            f"pool.drafters.{name}.{key}={json.dumps(value)}"
            for name, keys in self.drafters.items()
            for key, value in keys.items()
        ]


SCALE_GROUP = "scale"


def load_scales(directory: Path | None = None) -> dict[str, Scale]:
    """The scales of ``specbench reproduce --scale``, each an option of conf/scale/ (``directory``: another folder of
    them): its layout, its overrides by command or run directory (``tiny``'s stand-ins for the dry run) and its
    per-drafter settings, by name, each file checked against ``Scale``'s declared fields."""
    folder = Path(directory) if directory is not None else Path(conf_dir(), SCALE_GROUP)
    scales = {}
    for path in sorted(folder.glob("*.yaml")):
        loaded = OmegaConf.load(path)
        try:
            validate(OmegaConf.create({"scale": loaded}), section("scale", Scale))
            if "layout" not in loaded:
                raise SpecbenchError("it names no layout", "set layout: cpu or paper (the plan it runs)")
        except SpecbenchError as exc:
            raise SpecbenchError(f"scale {path}: {exc.problem}", exc.fix) from None
        spec = OmegaConf.to_container(loaded, resolve=True)
        scales[path.stem] = Scale(
            str(spec["layout"]),
            {str(k): tuple(str(o) for o in v) for k, v in (spec.get("overrides") or {}).items()},
            {str(d): dict(keys) for d, keys in (spec.get("drafters") or {}).items()},
            tuple(str(p) for p in spec.get("apart") or ()),
        )
    return scales


SCALES = load_scales()
# Spec-Bench's question.jsonl (`make reproduce-paper` downloads it)
QUESTIONS = "data/spec_bench/question.jsonl"


def overrides_of(
    step: Step, root: Path, scale: Scale, extra: list[str], questions: str = QUESTIONS
) -> list[str]:
    """The step's overrides, the scale's, then ``extra`` (on the decoding commands: train-policy only reads rows)."""
    own = [o.format(root=root, questions=questions) for o in step.overrides]
    return [
        *own,
        *scale.overrides.get(step.command, ()),
        *scale.overrides.get(step.run, ()),
        *(extra if step.decodes else ()),
    ]


def drafter_of(override: str) -> str | None:
    """The drafter a per-drafter override (``pool.drafters.<name>.<key>=...``, read by Hydra's own override
    grammar) sets, else None (and None for one that does not parse: composing the step reports it)."""
    try:
        key = OverridesParser.create().parse_overrides([override])[0].key_or_group
    except OverrideParseException:
        return None
    parts = key.split(".")
    return parts[2] if len(parts) > 3 and parts[:2] == ["pool", "drafters"] else None


def root_relative(value, root: Path):
    """``value`` (a step's settings) with every path under ``root`` written ``{root}/...``, however the root is
    spelled (as typed, absolute, relative to the working directory): a root given another way, moved or copied
    keeps its steps (issue 34: each spelling counted as other settings, and the fix offered, --redo, deleted them)."""
    root = Path(root)
    spellings = sorted(
        {str(root), str(root.resolve()), os.path.relpath(root.resolve())}, key=len, reverse=True
    )

    def fix(v):
        if isinstance(v, str):
            for sp in spellings:
                if v == sp or v.startswith(sp.rstrip("/") + "/"):
                    return "{root}" + v[len(sp.rstrip("/")) :]
            return v
        if isinstance(v, dict):
            return {k: fix(x) for k, x in v.items()}
        if isinstance(v, list):
            return [fix(x) for x in v]
        return v

    return fix(value)


def pipeline(command: str):
    from specbench.pipelines import cascades, collect, evaluate, train_policy

    return {
        "eval": evaluate.run,
        "collect": collect.run,
        "train_policy": train_policy.run,
        "cascades": cascades.run,
    }[command]


def upstream_of(step: Step, steps: tuple[Step, ...]) -> list[Step]:
    """The earlier steps of the plan whose run directory ``step`` reads (``Step.reads``)."""
    before = steps[: steps.index(step)] if step in steps else steps
    return [s for s in before if s.run in step.reads]


def read_marker(path: Path) -> dict | None:
    """A step's ``.done`` (or ``.step.json``) record; ``{}`` for an older ``.done`` that holds only its seconds."""
    if not path.exists():
        return None
    try:
        record = json.loads(path.read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError):
        return {}
    return record if isinstance(record, dict) else {}


def fingerprint(out: Path) -> str | None:
    """The fingerprint of a finished step: a hash of its ``.done`` (its settings, upstream steps and finish time)."""
    path = out / DONE
    return hashlib.sha256(path.read_bytes()).hexdigest()[:16] if path.exists() else None


def count_records(out: Path, command: str) -> int:
    """How many records (``RECORD_FILES``: generations, collected queries) the step's directory holds."""
    records = RECORD_FILES.get(command)
    return count_lines(out / records.name) if records else 0


def carry_over_methods(cfg) -> set[str]:
    """The eval methods of ``cfg`` whose selector carries statistics across queries (``carry_over``): such a
    method cannot resume half way (``evaluate.check_resumable``)."""

    from specbench.pipelines.methods import load_selector_config

    names = set()
    extra = cfg.get("selector_overrides") or {}
    for spec in cfg.get("methods") or []:
        spec = str(spec)
        if spec.startswith("selector:"):
            scfg = load_selector_config(spec.split(":", 1)[1], cfg)
            scfg = OmegaConf.merge(scfg, extra) if extra else scfg
        elif spec == "selector" and cfg.get("selector") is not None:
            scfg = cfg.selector
        else:
            continue
        if scfg.get("carry_over", False):
            names.add(str(scfg.get("name") or str(scfg.get("_target_", "")).rsplit(".", 1)[-1].lower()))
    return names


def restart_if_unresumable(step: Step, cfg, out: Path) -> None:
    """An eval step stopped half way whose carry-over selectors have records cannot resume (their state
    after the finished queries is not in the records): delete the step's records so it starts again."""
    from specbench.records import read_jsonl

    examples = out / EXAMPLES
    if (
        step.command != "eval"
        or (out / DONE).exists()
        or not examples.is_file()
        or not examples.stat().st_size
    ):
        return
    carry = carry_over_methods(cfg)
    if not carry:
        return
    try:
        methods = {r.get("method") for r in read_jsonl(examples) if isinstance(r, dict)}
    except SpecbenchError:  # a damaged record: the restart drops it too
        methods = carry
    if not methods & carry:
        return
    from specbench.reproduction.inputs import planned

    want = planned(out, "eval")
    if (
        want is not None and count_records(out, "eval") >= want
    ):  # every generation is there: nothing to resume
        return
    log.warning(
        "%s stopped half way, and its selectors %s carry statistics across queries (carry_over), so it "
        "cannot resume: deleting its records (examples.jsonl, rounds.jsonl) in %s and running the step again",
        step.run,
        ", ".join(sorted(methods & carry)),
        out,
    )
    for name in (EXAMPLES, ROUNDS):
        (out / name).unlink(missing_ok=True)


def compose_step(step: Step, overrides: list[str], adapt: Callable[[Step, object], None] | None):
    """The step's composed config (Hydra's errors as error/fix lines), adapted, then validated."""
    from hydra.errors import ConfigCompositionException, OverrideParseException

    from specbench.pipelines.keys import check

    try:
        with composing():
            cfg = compose(config_name=step.command, overrides=hydra_overrides(overrides))
    except (ConfigCompositionException, OverrideParseException) as exc:
        err = hydra_error(exc, step.command)
        raise SpecbenchError(
            f"step {step.run} (specbench {step.command.replace('_', '-')}): {err.problem}", err.fix
        ) from None
    if adapt is not None:
        adapt(step, cfg)
    try:
        check(cfg, step.command)
    except SpecbenchError as exc:
        raise SpecbenchError(
            f"step {step.run} (specbench {step.command.replace('_', '-')}): {exc.problem}", exc.fix
        ) from None
    return cfg


def run(
    root: str | Path,
    scale: str = "cpu",
    papers: list[str] | None = None,
    extra: list[str] | None = None,
    questions: str = QUESTIONS,
    adapt: Callable[[Step, object], None] | None = None,
    redo: bool = False,
) -> Path:
    """Run every step of ``scale`` (cpu | tiny | paper: ``SCALES``) not done yet (in order), then write the
    report; return the report directory. ``adapt(step, cfg)``, when given, may change each composed config
    before it runs (the paper-scale dry run swaps in tiny stand-in models).

    Every step's config is composed and validated before anything is written. A finished step is
    skipped only when its settings and its upstream steps' runs are the ones its ``.done`` records;
    otherwise the call is refused, naming what differs, or with ``redo`` that step (and the steps
    that read it) is deleted and run again."""
    from specbench.pipelines.session.run_dir import lock_run_dir
    from specbench.reproduction import render

    root = Path(root)
    sc, steps, chosen = choose_steps(root, scale, papers, extra, questions)
    planned = plan_steps(chosen, root, sc, extra, questions, adapt)
    # One reproduce per root: a second one is refused, naming the holder (the lock lasts the process).
    lock_run_dir(
        root,
        "reproduce",
        fix="wait for that reproduce to finish (or stop it), or write these runs "
        "elsewhere: --root <another directory>",
        elsewhere="--root <another directory>",
    )
    stale = stale_steps(planned, steps, root)
    if stale and not redo:
        raise SpecbenchError(
            f"{len(stale)} step(s) under {root} were run with other settings than this call's, so their records "
            "(and the report built on them) would not be this call's: "
            + "; ".join(f"{run} ({', '.join(why)})" for run, why in stale.items()),
            "pass --redo to delete those steps' records and run them again (the steps that read them follow), "
            "rerun with the settings they were run with, move those directories away, or use another --root",
        )
    (root / ROOT_RECORD).write_text(
        json.dumps({"scale": scale, "layout": sc.layout}) + "\n", encoding="utf-8"
    )
    run_steps(planned, stale, steps, root)
    return render.write(root, allow_empty=True)  # a restricted plan may complete no exhibit yet


def choose_steps(root: Path, scale: str, papers, extra, questions: str):
    """``(scale, every step of it, the steps this call runs)``, after the checks that need no config: the scale, no
    experiment override, known papers, the Spec-Bench question file, the root's own scale."""
    from specbench.reproduction import render

    if scale not in SCALES:
        raise SpecbenchError(f"unknown reproduce scale '{scale}'", f"use one of: {', '.join(SCALES)}")
    sc = SCALES[scale]
    given = [o for o in extra or [] if EXPERIMENT.match(str(o))]
    if given:  # every step runs its own experiment: one given here would replace them all
        raise SpecbenchError(
            f"{given[0]}: every reproduce step runs its own experiment (conf/experiment/reproduce_*.yaml, "
            "cascades_cpu_local), which this override would replace",
            "drop it; to run one experiment alone, use its command: specbench eval experiment=NAME "
            "(or collect / cascades), or limit reproduce to one paper with --paper",
        )
    steps = sc.plan()
    known = {s.paper for s in steps}
    unknown = sorted(set(papers or []) - known)
    if unknown:
        raise SpecbenchError(
            f"unknown paper(s) {', '.join(unknown)}", f"use some of: {', '.join(sorted(known))}"
        )
    strays = sorted(set(sc.apart) - known)
    if strays:
        raise SpecbenchError(
            f"scale {scale} keeps apart unknown paper(s) {', '.join(strays)}",
            f"in conf/scale/{scale}.yaml, name some of: {', '.join(sorted(known))}",
        )
    chosen = (
        [s for s in steps if s.paper in papers] if papers else [s for s in steps if s.paper not in sc.apart]
    )
    if not papers and sc.apart:
        log.warning(
            "not in this plan (kept apart for its time): %s; run each with --paper into this root (the report "
            "reads it)",
            ", ".join(sc.apart),
        )
    if any(SPEC_BENCH in s.overrides for s in chosen) and not Path(questions).is_file():
        raise SpecbenchError(
            f"no Spec-Bench question file {questions}",
            "download it (`make data/spec_bench/question.jsonl`, from github.com/hemingkx/Spec-Bench) "
            "or pass --questions <question.jsonl>",
        )
    if render.recorded_scale(root) not in (scale, None):
        raise SpecbenchError(
            f"{root} holds the runs of another scale ({root / ROOT_RECORD})",
            "use another --root for this scale, or delete that root to start over",
        )
    return sc, steps, chosen


def plan_steps(chosen, root: Path, sc, extra, questions: str, adapt) -> list[tuple]:
    """Each chosen step's overrides, composed and validated config, root-relative settings and heads, before anything
    is written or loaded; a per-drafter override (``pool.drafters.<name>.<key>=...``) goes to the steps whose pool has
    that drafter, and one that no step's pool has is refused."""
    from specbench.pipelines.session.run_dir import compared_settings
    from specbench.reproduction import heads

    planned = []
    drafter = {str(o): drafter_of(str(o)) for o in extra or []}  # pool.drafters.<name>.<key>=... -> <name>
    per_drafter = [o for o, name in drafter.items() if name is not None]
    general = [o for o, name in drafter.items() if name is None]
    # the scale's per-drafter settings, before the call's (which win); a plan of some papers may hold none of them
    own = sc.drafter_overrides()
    drafter.update({o: drafter_of(o) for o in own})
    per_drafter = [*own, *per_drafter]
    used: set[str] = set()
    for step in chosen:
        overrides = overrides_of(step, root, sc, general, questions)
        cfg = compose_step(step, overrides, adapt)
        pool = OmegaConf.select(cfg, "pool.drafters", default=None) or {}
        mine = [o for o in per_drafter if drafter[o] in pool] if step.decodes else []
        if mine:  # only the steps whose pool has the drafter (issue 34: one spelling, applied where it means something)
            used.update(mine)
            overrides = [*overrides, *("++" + o.lstrip("+") for o in mine)]
            cfg = compose_step(step, overrides, adapt)
        now = root_relative(compared_settings(cfg), root)
        planned.append((step, overrides, cfg, now, heads.heads_of(now)))

    unused = [o for o in per_drafter if o not in used and o not in own]
    if unused:
        names = sorted(
            {
                d
                for step, _, cfg, _, _ in planned
                for d in (OmegaConf.select(cfg, "pool.drafters", default=None) or {})
            }
        )
        raise SpecbenchError(
            f"{unused[0]}: no step of this plan has drafter '{drafter[unused[0]]}' in its pool",
            f"name one of the plan's drafters: {', '.join(names) or 'none'}",
        )
    return planned


def stale_steps(planned: list[tuple], steps, root: Path) -> dict[str, list[str]]:
    """Which finished (or started) steps are not this call's: their settings, heads or upstream runs differ, or the
    directory holds a run made outside reproduce; ``{run: [reasons]}``."""
    from specbench.pipelines.session.run_dir import compared_settings, differences
    from specbench.reproduction import heads

    current: dict[str, str | None] = {}  # run -> fingerprint of its .done, None when it runs in this call
    stale: dict[str, list[str]] = {}
    for step, _, _, now, weights in planned:
        out = root / step.run
        done, started = read_marker(out / DONE), read_marker(out / STARTED)
        if not (started and "settings" in started and count_records(out, step.command)):
            started = None  # a step stopped before its first record: nothing of it to keep, it reruns
        why: list[str] = []
        if (
            done is None
            and not (out / STARTED).exists()
            and (count_records(out, step.command) or (out / CONFIG).exists())
        ):
            why = [
                "the directory holds records of a run made outside reproduce"
            ]  # issue 34: --redo takes it over
        elif done is not None and "settings" not in done:
            why = [f"its {DONE} records no settings (an older specbench wrote it)"]
        elif done is not None or started is not None:
            mark = done if done is not None else started
            # compared as the settings are compared now (a selector's older config name, its option's)
            before = compared_settings(root_relative(mark["settings"], root))
            why = differences(before, now) + heads.reasons(mark.get("heads"), weights)
            for up in upstream_of(step, steps):
                have = current[up.run] if up.run in current else fingerprint(root / up.run)
                if done is not None and have is None:
                    why.append(f"its upstream step {up.run} runs again")
                elif done is not None and (mark.get("upstream") or {}).get(up.run) != have:
                    why.append(f"its upstream step {up.run} was run again since")
        if why:
            stale[step.run] = why
        current[step.run] = fingerprint(out) if done is not None and not why else None
    return stale


def run_steps(planned: list[tuple], stale: dict[str, list[str]], steps, root: Path) -> None:
    """Run the planned steps in order: a stale one's records deleted first (``--redo``), a done one skipped; each
    writes its ``.step.json`` when it starts and its ``.done`` when it finishes."""
    started_at = time.perf_counter()
    for i, (step, overrides, cfg, now, weights) in enumerate(planned, 1):
        out = root / step.run
        if step.run in stale:
            log.warning(
                "[%d/%d] %s: --redo: deleting its records in %s and running it again (%s)",
                i,
                len(planned),
                step.run,
                out,
                "; ".join(stale[step.run]),
            )
            shutil.rmtree(out, ignore_errors=True)
        elif (out / DONE).exists():
            log.warning(
                "[%d/%d] %s: done before with the same settings, skipped (%s)", i, len(planned), step.run, out
            )
            continue
        print(
            f"\n[{i}/{len(planned)}] specbench {step.command.replace('_', '-')} {' '.join(overrides)}  -> {out}",
            flush=True,
        )
        restart_if_unresumable(step, cfg, out)
        upstream = {up.run: fingerprint(root / up.run) for up in upstream_of(step, steps)}
        marker = {
            "command": step.command,
            "overrides": overrides,
            "settings": now,
            "heads": weights,
            "upstream": upstream,
        }
        out.mkdir(parents=True, exist_ok=True)
        _write_json(out / STARTED, {**marker, "started": _now(), "provenance": provenance.collect()})
        t0 = time.perf_counter()
        pipeline(step.command)(cfg, out)
        done = {
            **marker,
            "seconds": round(time.perf_counter() - t0, 1),
            "finished": _now(),
            "records": count_records(out, step.command),
            "provenance": provenance.collect(),
        }
        _write_json(out / DONE, done)
    print(
        f"\nreproduce: {len(planned)} steps, {time.perf_counter() - started_at:.0f} s in this call",
        flush=True,
    )


def _write_json(path: Path, record: dict) -> None:
    """Through the one atomic writer: a marker is never torn."""
    atomic_write_text(path, json.dumps(record, indent=1) + "\n")


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="microseconds")
