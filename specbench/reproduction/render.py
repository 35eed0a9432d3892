"""``specbench report ROOT``: every exhibit whose runs exist under ROOT, written as Markdown + CSV
(+ PNG for figures) in ``ROOT/report/<paper>/``, and one index ``ROOT/report/REPORT.md`` with each
exhibit's pattern verdicts and the exhibits not run yet. Which exhibits a root holds is its layout
(``cpu`` or ``paper``), recorded by ``specbench reproduce`` in ``ROOT/reproduce.json``."""

from __future__ import annotations

import json
import logging
import shutil
from dataclasses import dataclass
from pathlib import Path

from specbench.errors import SpecbenchError
from specbench.files import atomic_write_text
from specbench.pipelines.tables import print_table, to_markdown
from specbench.reproduction import heads as shipped_heads
from specbench.reproduction import intervals as CI
from specbench.reproduction import premises, statements
from specbench.reproduction import published as published_values
from specbench.reproduction import verdicts as V
from specbench.reproduction.catalog import builders
from specbench.reproduction.exhibit import PROJECT, SEED, Exhibit, Layout, mark_unfinished
from specbench.reproduction.inputs import NotRun
from specbench.reproduction.layouts import LAYOUTS
from specbench.reproduction.runs import ROOT_RECORD

log = logging.getLogger(__name__)


LAYOUT_FILE = ROOT_RECORD


def recorded(root: Path) -> dict:
    """What ``specbench reproduce`` recorded under ``root`` (its ``scale`` and ``layout``); empty when nothing."""
    record = Path(root) / LAYOUT_FILE
    if not record.exists():
        return {}
    try:
        found = json.loads(record.read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError):
        found = None
    if not isinstance(found, dict):
        scale = scale_of_steps(Path(root))
        layout = LAYOUTS_OF.get(scale, scale)
        raise SpecbenchError(
            f"{record} is damaged (not the JSON object `specbench reproduce` writes)",
            (
                f'write it again: {{"scale": "{scale}", "layout": "{layout}"}} (the scale its steps were run at), '
                if scale
                else 'write it again with the scale its steps were run at: {"scale": "cpu", "layout": "cpu"} '
                '(or "tiny" with layout "cpu", or "paper" for both), '
            )
            + "or pass --layout to `specbench report`",
        )
    return found


LAYOUTS_OF = {
    "tiny": "cpu",
    "cpu": "cpu",
    "paper": "paper",
}  # each scale's report layout (conf/scale/<scale>.yaml)


def scale_of_steps(root: Path) -> str | None:
    """The scale a root's steps were run at, read off their recorded overrides (a ``.done`` or ``.step.json``): the
    scale whose own overrides for that step's command they hold (tiny's name its tiny target; paper steps read a
    paper experiment), cpu when none does; None without a recorded step."""
    from omegaconf import OmegaConf

    from specbench.configs import conf_dir

    own = {  # each scale's own overrides by command (conf/scale/<scale>.yaml), read as the plan reads them
        name: OmegaConf.to_container(OmegaConf.load(Path(conf_dir()) / "scale" / f"{name}.yaml")).get(
            "overrides"
        )
        or {}
        for name in ("tiny", "paper")
    }
    for path in sorted([*Path(root).rglob(".done"), *Path(root).rglob(".step.json")]):
        try:
            step = json.loads(path.read_text(encoding="utf-8"))
            overrides, command = {str(o) for o in step.get("overrides") or []}, str(step.get("command"))
        except (ValueError, OSError, AttributeError):
            continue
        for name, by_command in own.items():
            mine = {str(o) for o in by_command.get(command) or ()}
            if mine and mine <= overrides:
                return name
        return "paper" if any("vicuna" in o or "t5_" in o for o in overrides) else "cpu"
    return None


def recorded_scale(root: Path) -> str | None:
    """The scale ``specbench reproduce`` recorded under ``root`` (roots of earlier versions keep it as ``profile``)."""
    found = recorded(root)
    return found.get("scale", found.get("profile"))


def layout_of(root: Path, name: str | None = None) -> Layout:
    """``name``, else the layout ``specbench reproduce`` recorded under ``root``, else the CPU one."""
    name = name or recorded(root).get("layout") or "cpu"
    if name not in LAYOUTS:
        raise SpecbenchError(f"unknown report layout '{name}'", f"use one of: {', '.join(LAYOUTS)}")
    return LAYOUTS[name]


def build(
    root: Path,
    published=None,
    layout: Layout | None = None,
    extra: list[Exhibit] = (),
    sources: premises.Sources | None = None,
) -> tuple[list[Exhibit], list[str]]:
    """The exhibits that can be built from ``root`` (then ``extra``: exhibits of runs outside the plan, such as the
    long-horizon replays), corrected together with each part's premise measured on ``sources`` (default: ``root``
    alone), and a line per one that cannot be built (what is missing)."""
    published = published_values.load() if published is None else published
    done, missing = [], []
    for builder in builders(layout or layout_of(root)):
        try:
            done.append(mark_unfinished(builder(root, published), root))
        except NotRun as exc:
            missing.append(missing_line(Path(root), str(exc)))
    return correct([*done, *extra], sources or premises.Sources(Path(root)), missing), missing


DAMAGED = "damaged: "


def missing_line(root: Path, rel: str) -> str:
    """What an exhibit lacks: a file its step has not written yet (``rel``), or, when that step finished (its
    ``.done`` is there), a file lost since (``damaged: ...``)."""
    from specbench.reproduction.runs import DONE

    step = next((p for p in (Path(root) / rel).parents if (p / DONE).is_file()), None)
    if step is None:
        return rel
    return f"{DAMAGED}{rel} is missing, though its step {step.relative_to(root)} finished"


def premise_measurer(sources: premises.Sources):
    """``(premise key, part key) -> premises.Measured``, each measured once."""
    found: dict[tuple[str, str], premises.Measured] = {}

    def measure(key: str, part: str) -> premises.Measured:
        if (key, part) not in found:
            found[(key, part)] = premises.PREMISES[key](sources, part)
        return found[(key, part)]

    measure.found = found
    return measure


def correct(
    exhibits: list[Exhibit], sources: premises.Sources | None = None, missing: list[str] = ()
) -> list[Exhibit]:
    """``exhibits`` and the statements exhibits (:func:`statements.judge`): every verdict of an exhibit is a part
    of one statement, each statement judged once over its parts (a part whose premise fails on ``sources`` set
    aside as not testable here), Holm's family-wise correction run over the statements of each family (the seeds',
    this project's own: ``exhibit.FAMILIES``), for a held and a not-held conclusion alike: one that does not pass
    it reads ``inconclusive``. The parts stay at their own level."""
    measure = premise_measurer(sources) if sources is not None else None
    judged = statements.judge(exhibits, premise_of=measure, missing=missing)
    for ex in judged:
        ex.premises = dict(measure.found) if measure is not None else {}
    return [*exhibits, *judged]


def exhibit_markdown(ex: Exhibit, figure: str | None) -> str:
    parts = [f"## {ex.title}", "", to_markdown(ex.table), ""]
    if figure:
        parts += [f"![{ex.title}]({figure})", ""]
    parts += [f"- {v.line()}" for v in ex.verdicts]
    parts += ["", ex.notes, "", "Runs: " + ", ".join(f"`{r}`" for r in ex.runs), ""]
    return "\n".join(parts)


@dataclass(frozen=True)
class Outside:
    """The runs outside the plan a report reads beside its root: the long-horizon replays of the seed trace
    (``make trace-seed`` or ``trace-mixed``), the prompt-level comparison (``make routing-seed``) and replays over
    other arms shown as a robustness row (not judged). ``specbench report --long-horizon`` takes each: a directory,
    ``routing=DIR`` or ``robustness=DIR``."""

    long_horizon: Path | None = None
    routing: Path | None = None
    robustness: Path | None = None

    KINDS = ("routing", "robustness")

    @classmethod
    def parse(cls, values) -> Outside:
        """From ``--long-horizon`` values: ``DIR`` (the long-horizon replays), ``routing=DIR``, ``robustness=DIR``."""
        found: dict[str, Path] = {}
        for value in values or ():
            kind, sep, path = str(value).partition("=")
            kind, path = (kind, path) if sep and kind in cls.KINDS else ("long_horizon", str(value))
            if kind in found:
                raise SpecbenchError(
                    f"--long-horizon names {kind.replace('_', ' ')} twice ({found[kind]} and {path})",
                    "pass one directory of each kind: DIR, routing=DIR, robustness=DIR",
                )
            found[kind] = Path(path)
        return cls(**found)

    def exhibits(self) -> list[Exhibit]:
        return _extras(self.long_horizon, self.routing, self.robustness)

    def sources(self, root: Path) -> premises.Sources:
        return premises.Sources(Path(root), self.long_horizon, self.routing)


def write(
    root: Path,
    out: Path | None = None,
    layout: str | None = None,
    allow_empty: bool = False,
    long_horizon: Path | Outside | None = None,
    against: Path | None = None,
    one_commit: bool = False,
) -> Path:
    """The report of ``root`` into ``out`` (default ``ROOT/report``); a root that holds no exhibit's runs is an error,
    unless ``allow_empty`` (a reproduce restricted to steps that complete no exhibit yet): then the index lists only
    what is not run yet. ``long_horizon``: the replays of ``make trace-seed`` (a directory), or every run outside
    the plan (an ``Outside``), judged with the rest. ``against``: a second root of the same plan: every verdict that
    reads otherwise there is marked unstable (never counted held) and ``STABILITY.md`` lists both runs' verdicts
    (:mod:`.stability`). The index names the commits the runs came from (mixing said in so many words);
    ``one_commit`` refuses a root whose runs came from several commits or uncommitted code."""
    from specbench import provenance as code

    root = _root(root)
    out = Path(out) if out else root / "report"
    lay = layout_of(root, layout)
    commits = code.commits_under(root)
    if one_commit:
        code.check_one_commit(commits, root)
    outside = long_horizon if isinstance(long_horizon, Outside) else Outside(_path(long_horizon))
    exhibits, missing = build(root, layout=lay, extra=outside.exhibits(), sources=outside.sources(root))
    premise_lines = check_premises(root, exhibits)
    stable = None if against is None else _stability(exhibits, root, Path(against), lay, outside)
    for ex in exhibits:  # the statements tables agree with their verdicts after the stability marking
        statements.refresh_table(ex)
    statements.annotate(exhibits)  # each part names its statement's final mark
    if not exhibits and not allow_empty:
        make = "make reproduce-paper" if lay.name == "paper" else "make reproduce-cpu"
        raise SpecbenchError(
            f"no reproduced exhibit under {root} ({lay.name} layout; missing: {', '.join(missing[:3])} ...)",
            f"run `{make}` first, or pass the root it wrote to",
        )
    provenance = provenance_text(root, exhibits, commits, against if stable else None)
    index = report_index(root, exhibits, missing, provenance, lay.scale, out, outside.long_horizon)
    index += premises_section(exhibits, premise_lines)
    out.mkdir(parents=True, exist_ok=True)
    atomic_write_text(out / "REPORT.md", "\n".join(index))
    if stable is not None:
        from specbench.reproduction.stability import STABILITY

        atomic_write_text(out / STABILITY, stable)
    atomic_write_text(out / SUMMARY, summary_markdown(exhibits, missing, provenance))
    print_summary(exhibits, out)
    return out


def provenance_text(root: Path, exhibits: list[Exhibit], commits: dict, against: Path | None) -> str:
    """The index's provenance paragraphs: the plan's commits, every source outside it and the report's own code, the
    second run, and the heads the steps read."""
    from specbench import provenance as code

    again = f"Stability: every verdict against a second run of the plan ({against}): [STABILITY.md](STABILITY.md)."
    lines = (
        code.code_line(commits),
        source_lines(root, exhibits, against),
        again if against is not None else "",
        shipped_heads.provenance_line(root),
    )
    return "\n\n".join(line for line in lines if line)


def print_summary(exhibits: list[Exhibit], out: Path) -> None:
    """The command's closing table: each exhibit's marks, and how many statements hold."""
    judged = [ex for ex in exhibits if statements.is_statements(ex)] or exhibits
    held = sum(v.held is True for ex in judged for v in ex.verdicts)
    total = sum(len(ex.verdicts) for ex in judged)
    partial = sum(any(v.unfinished for v in ex.verdicts) for ex in exhibits)
    note = f", {partial} exhibits on unfinished runs (not judged)" if partial else ""
    print_table(
        "\n".join(f"- {ex.key}: " + "; ".join(v.mark for v in ex.verdicts) for ex in exhibits),
        title=f"report: {len(exhibits)} exhibits, {held} of {total} {'statements' if judged is not exhibits else 'verdicts'} "
        f"held{note} ({out / 'REPORT.md'})",
    )


def _root(root) -> Path:
    root = Path(root)
    if not root.is_dir():
        raise SpecbenchError(
            f"the reproduce root {root} does not exist"
            if not root.exists()
            else f"{root} is not a directory",
            "run `make reproduce-cpu` (or specbench reproduce) first, or pass the root its runs were written to",
        )
    return root


def _stability(exhibits: list[Exhibit], root: Path, against: Path, lay: Layout, outside: Outside) -> str:
    """Mark (in place) the verdicts of ``exhibits`` that read otherwise on ``against``'s runs; the stability page.
    The runs outside the plan (the replays, the prompt-level comparison: one run of them) join both runs'
    statements alike, so their verdicts are the same data read twice (listed apart: they cannot flip)."""
    from specbench.provenance import commits_under
    from specbench.reproduction import stability

    other = _root(against)
    check_against(root, other, lay)
    extras = outside.exhibits()
    there, _ = build(other, layout=lay, extra=extras, sources=outside.sources(other))
    check_premises(other, there)
    shared = {ex.key for ex in extras}
    found = stability.mark_unstable(exhibits, there, str(against))
    return stability.page(found, str(root), str(against), shared=shared, commits=commits_under(other))


def check_against(root: Path, other: Path, lay: Layout) -> None:
    """Refuse a second root that is the first, a copy of it (the same records), damaged, or of another scale or
    layout: a stability check must compare two runs of the same plan."""
    from specbench.reproduction import stability

    stability.check_roots(Path(root), Path(other), lay.name, recorded)


def _path(p) -> Path | None:
    return None if p is None else Path(p)


def _extras(long_horizon=None, routing=None, robustness=None) -> list[Exhibit]:
    """The exhibits of runs outside the plan: the long-horizon replays of the seed trace, the prompt-level
    comparison, and the six-head replays (a robustness row: shown, not judged)."""
    from specbench.reproduction import long_horizon as replays
    from specbench.reproduction import routing as routed

    found = []
    if long_horizon is not None:
        found.append(replays.exhibit(Path(long_horizon)))
    if routing is not None:
        found.append(routed.exhibit(Path(routing)))
    if robustness is not None:
        ex = replays.exhibit(Path(robustness))
        ex.key, ex.judged = "metasd/long_horizon_six", False
        ex.title = f"{ex.title}: the six heads as arms (the generalist among them), a robustness row"
        found.append(ex)
    return found


def _long_horizon(path) -> list[Exhibit]:
    """The long-horizon replays' exhibit, when a directory is given."""
    return _extras(long_horizon=path)


def check_premises(root: Path, exhibits: list[Exhibit]) -> dict[str, str]:
    """Every premise a judged part used, checked against the commits of the runs it judges
    (:func:`premises.check_declared`: a premise newer than a run is refused); each premise's line for the page."""
    used: dict[str, list[tuple[str | None, bool | None]]] = {}
    for ex in exhibits:
        if statements.is_statements(ex) or not ex.judged:
            continue
        runs = run_commits(root, ex)
        measured = {part: m for ex2 in exhibits for (k, part), m in (ex2.premises or {}).items()}
        for v in ex.verdicts:
            s = statements.statement_of(v)
            key = s.premise_of(v.key) if s is not None and s.judged else None
            # a premise that could not be measured decided nothing (its part is not judged): nothing to order
            if key is not None and getattr(measured.get(v.key), "holds", None) is not None:
                used.setdefault(key, []).extend(runs)
    return premises.check_declared(used) if used else {}


def exhibit_sources(root: Path, ex: Exhibit) -> list[Path]:
    """The run directories an exhibit's numbers come from: its runs under the root, and for the replays their
    trace, live check and streams (recorded in their ``replayed.json``)."""
    found = []
    for run in ex.runs:
        path = Path(run) if Path(run).is_absolute() or Path(run).exists() else Path(root) / run
        found.append(path)
        record = path / "replayed.json"
        if record.is_file():
            try:
                data = json.loads(record.read_text(encoding="utf-8"))
            except ValueError:
                continue
            for k in ("trace", "live"):
                if data.get(k):
                    found.append(Path(data[k]))
            for trace, collect in (data.get("streams") or {}).values():
                found += [Path(trace), Path(collect)]
    return found


def run_commits(root: Path, ex: Exhibit) -> list[tuple[str | None, bool | None]]:
    """(commit, dirty) of every code version that ran the exhibit's sources (:func:`exhibit_sources`)."""
    from specbench import provenance as code

    out = []
    for path in exhibit_sources(root, ex):
        out += [(e.get("commit"), e.get("dirty")) for e in code.read(path)] or [(None, None)]
    return out


def source_lines(root: Path, exhibits: list[Exhibit], against: Path | None) -> str:
    """The report's provenance of every source outside the plan's runs (the trace, its replays, the live clock
    check, the prompt-level streams), of the second run, and of the code that built the report."""
    from specbench import provenance as code

    lines = []
    outside = [ex for ex in exhibits if not statements.is_statements(ex) and any(Path(r).is_absolute() or not (Path(root) / r).exists() for r in ex.runs)]  # fmt: skip
    for ex in outside:
        for path in exhibit_sources(root, ex):
            entries = code.read(path) if path.is_dir() else []
            versions = ", ".join(
                dict.fromkeys(f"`{code.label(e.get('commit'), e.get('dirty'))}`" for e in entries)
            )
            lines.append(f"`{path}` ({ex.key}): {versions or 'no recorded commit'}")
    if against is not None:
        found = code.commits_under(against)
        lines.append(
            f"the second run `{against}`: "
            + "; ".join(f"`{k}` ({len(v)} runs)" for k, v in found.items())
            + (" (**Mixed code**)" if len(found) > 1 else "")
        )
    me = code.code_state()
    lines.append(f"this report was built by code at `{code.label(me.get('commit'), me.get('dirty'))}`")
    return "Sources outside the plan, and the report's own code: " + "; ".join(lines) + "."


def premises_section(exhibits: list[Exhibit], lines: dict[str, str]) -> list[str]:
    """REPORT.md's premises: each premise the judged parts name, its rule and seed sentence, its declaration's
    commit against its runs', and its measured value for every part."""
    measured: dict[tuple[str, str], premises.Measured] = {}
    for ex in exhibits:
        measured.update(getattr(ex, "premises", {}) or {})
    if not measured:
        return []
    out = ["## Premises", "", "Each judged part's premise (premises.py), measured here; a part whose premise fails is "
           "not testable here and enters neither side of its statement.", ""]  # fmt: skip
    for key in dict.fromkeys(k for k, _ in measured):
        p = premises.PREMISES[key]
        out += [f"### {key}: {p.text}", "", f"- the seed: {p.seed}", f"- rule: {p.rule}"]
        if key in lines:
            out.append(f"- {lines[key]}")
        out += [f"- {part}: {m.line()}" for (k, part), m in measured.items() if k == key]
        out.append("")
    return out


def report_index(
    root: Path, exhibits, missing, provenance: str, scale: str, out: Path, long_horizon: Path | None
) -> list[str]:
    """REPORT.md's lines: the header and counts, each exhibit (writing its files under ``out``: the seeds' claims
    first, then this project's own under their heading), then what is not run yet."""
    reproduced = reproduced_line(exhibits)
    index = [
        f"# Reproduction report ({scale})",
        "",
        f"Built by `specbench report {root}` from the run directories under it. Each section: our numbers in the "
        "paper's layout, the published numbers beside them where the paper gives them (`published.yaml`, "
        "with sources), and the paper's claim checked on our numbers.",
        "",
        *([reproduced, ""] if reproduced else []),
        counts_line(exhibits),
        "",
    ]
    if provenance:
        index += [provenance, ""]
    aa = aa_table(exhibits)
    first = sorted(
        exhibits, key=lambda ex: not statements.is_statements(ex)
    )  # each family's statements first
    for ex in [ex for ex in first if ex.family == SEED]:
        index += write_exhibit(ex, out, long_horizon, aa)
    own = [ex for ex in first if ex.family == PROJECT]
    if own:
        index += [
            "## This project's own claims (not the seeds')",
            "",
            "Claims the three papers do not make (full information for heads, the switching penalty), judged the "
            "same way and corrected by Holm as a family of their own, so the seeds' family-wise error covers the "
            "seeds' claims only.",
            "",
        ]
        for ex in own:
            index += write_exhibit(ex, out, long_horizon, aa)
    damaged = [m for m in missing if m.startswith(DAMAGED)]
    not_run = [m for m in missing if not m.startswith(DAMAGED)]
    if damaged:
        index += ["## Damaged", "", *[f"- {m.removeprefix(DAMAGED)}" for m in damaged], ""]
    if not_run:
        index += ["## Not run yet", "", *[f"- needs `{m}`" for m in not_run], ""]
    return index


def aa_table(exhibits: list[Exhibit]):
    """The A/A exhibit's table (None when the report has none)."""
    from specbench.reproduction.noise import KEY

    aa = next((ex for ex in exhibits if ex.key == KEY), None)
    return None if aa is None or aa.table.empty else aa.table


def write_exhibit(ex, out: Path, long_horizon: Path | None, aa=None) -> list[str]:
    """One exhibit's files (its table as CSV, its figure, its page; the replays' full page beside the long-horizon
    exhibit) under ``out/<paper>/``; its lines of the index (with the A/A false-hold rate at its verdicts' n when
    the report has an A/A table ``aa``)."""
    from specbench.reproduction.noise import rate_line

    paper, name = ex.key.split("/", 1)
    (out / paper).mkdir(parents=True, exist_ok=True)
    ex.table.to_csv(out / paper / f"{name}.csv", index=False)
    figure = None
    if ex.plot is not None:
        try:
            ex.plot(out / paper / f"{name}.png")
            figure = f"{name}.png"
        except ImportError:
            log.warning("matplotlib is not installed: %s.png skipped", name)
    if ex.key == "metasd/long_horizon" and long_horizon is not None:  # the replays' full page beside it
        from specbench.reproduction.long_horizon import agreeing

        (out / paper / "replay").mkdir(exist_ok=True)
        page, png = Path(long_horizon) / "long_horizon.md", Path(long_horizon) / "convergence.png"
        if page.is_file():  # its verdict lines the report's own
            atomic_write_text(
                out / paper / "replay" / page.name, agreeing(page.read_text("utf-8"), ex.verdicts)
            )
        if png.is_file():
            shutil.copyfile(png, out / paper / "replay" / png.name)
    atomic_write_text(out / paper / f"{name}.md", exhibit_markdown(ex, figure))
    rates = rate_line(ex.verdicts, aa) if aa is not None else ""
    return [
        f"### [{ex.title}]({paper}/{name}.md)",
        "",
        *[f"- {v.line()}" for v in ex.verdicts],
        *(["", rates] if rates else []),
        "",
    ]


SUMMARY = "SUMMARY.md"  # the compact index the README includes: one row per exhibit, its verdicts counted


def _count(marks: list[str]) -> str:
    """``H held, K not held, I inconclusive, U not judged[, N unstable][, T not testable here]``."""
    text = (
        f"{marks.count('held')} held, {marks.count('not held')} not held, {marks.count('inconclusive')} inconclusive, "
        f"{marks.count('not judged')} not judged"
    )
    if "unstable" in marks:
        text += f", {marks.count('unstable')} unstable (marked otherwise in a second run of the plan)"
    if V.NOT_TESTABLE in marks:
        text += f", {marks.count(V.NOT_TESTABLE)} not testable here (their premise fails: the setup cannot show them)"
    return text


def counts_line(exhibits: list[Exhibit]) -> str:
    """``N statements: H held, K not held, I inconclusive, U not judged, ...`` over the statements exhibits of
    ``exhibits`` (``N verdicts`` over every verdict when there are none), and how they are judged."""
    stated = [ex for ex in exhibits if statements.is_statements(ex)]
    judged = stated or exhibits
    marks = [v.mark for ex in judged for v in ex.verdicts]
    seeds = [v for ex in judged if ex.family == SEED for v in ex.verdicts]
    tested = sum(v.p is not None for v in seeds)
    own = sum(v.p is not None for ex in judged if ex.family == PROJECT for v in ex.verdicts)
    parts = sum(len(ex.verdicts) for ex in exhibits if not statements.is_statements(ex) and ex.judged)
    scoped = [s for ex in stated for s in ex.scoped]
    what = (
        f"statements (each judged once over its parts, {parts} exhibit verdicts in all)"
        if stated
        else "verdicts"
    )
    return (
        f"{len(marks)} {what}: {_count(marks)}"
        + (
            f"; {len(scoped)} more listed, not judged at this scale ("
            + ", ".join(f"{s.key}: {s.scope.split(':', 1)[0]}" for s in scoped)
            + ")"
            if scoped
            else ""
        )
        + ". Each is judged on "
        f"per-query paired data with a 95% {CI.INTERVAL_TEXT}: held only when the interval excludes the null, not "
        f"held when it excludes the claim, inconclusive when it straddles it, not judged below {CI.MIN_N} paired "
        f"queries or without per-query data, not testable here when the premise its setup presupposes fails "
        f"(measured, and declared before its runs). Held and not-held verdicts also pass Holm's step-down correction "
        f"across the seeds' {tested} tested claims (family-wise error 5%; without it about "
        f"{V.expected_false_holds(seeds):.1f} false holds would be expected if no claim were true)"
        + (f"; this project's own {own} tested claims are corrected as a family of their own" if own else "")
        + "."
        + noise_line(exhibits)
    )


# an exhibit key's first part -> the seed paper it reproduces
PAPERS = {
    "huang": "Huang et al.",
    "metasd": "MetaSD",
    "cascades": "speculative cascades",
    "spec_bench": "Spec-Bench",
}


def reproduced_line(exhibits: list[Exhibit]) -> str:
    """One sentence saying what reproduces here: how many of the seeds' claims hold, per paper, and what the rest
    are (generated from the verdicts, so the README never says "reproduces" without its count)."""
    per: dict[str, list[str]] = {}
    stated = [ex for ex in exhibits if statements.is_statements(ex)]
    for ex in stated:  # per statement, filed under its paper (its key's first part)
        if ex.family == SEED:
            for key, v in zip(list(ex.table.statement)[: len(ex.verdicts)], ex.verdicts, strict=True):
                paper = str(key).split("/", 1)[0]
                per.setdefault(PAPERS.get(paper, paper), []).append(v.mark)
    for ex in [] if stated else exhibits:
        if ex.family == SEED and ex.verdicts:
            paper = ex.key.split("/", 1)[0]
            per.setdefault(PAPERS.get(paper, paper), []).extend(v.mark for v in ex.verdicts)
    marks = [m for ms in per.values() for m in ms]
    if not marks:
        return ""
    parts = ", ".join(f"{paper} {ms.count('held')} of {len(ms)}" for paper, ms in per.items())
    rest = [f"{marks.count(m)} {m}" for m in V.MARKS[1:] if marks.count(m)]
    scoped = [s for ex in stated if ex.family == SEED for s in ex.scoped]
    if scoped:
        rest.append(f"{len(scoped)} listed for paper scale or theory (not judged here)")
    held = marks.count("held")
    others = (
        f"; the others are {', '.join(rest)} at this scale, with their numbers on their pages" if rest else ""
    )
    return (
        f"What reproduces here: {held} of the seeds' {len(marks)} {'statements' if stated else 'claims'} "
        f"{'holds' if held == 1 else 'hold'} on "
        f"these runs ({parts}){others}."
    )


def noise_line(exhibits: list[Exhibit]) -> str:
    """How many held speed verdicts the A/A noise floor could explain (when the report has an A/A exhibit)."""
    from specbench.reproduction.noise import KEY, explained

    table = aa_table(exhibits)
    if table is None:
        return ""
    inside, held = explained([v for ex in exhibits for v in ex.verdicts], table)
    return (
        f" A/A runs ([noise floor]({KEY}.md)): {inside} of the {held} held timed speed verdicts have an effect "
        "inside the range two runs of one method show at their n."
    )


def summary_markdown(exhibits: list[Exhibit], missing: list[str], provenance: str | None = None) -> str:
    """One table row per exhibit (its title linked to its page, its verdicts counted by mark), under the counts
    (and the line saying which steps ran with other heads than the shipped ones, when some did)."""
    rows = [
        "| exhibit | held | not held | inconclusive | not judged | unstable | not testable here |",
        "|---|---|---|---|---|---|---|",
    ]
    for ex in exhibits:
        paper, name = ex.key.split("/", 1)
        marks = [v.mark for v in ex.verdicts]
        shown = "" if ex.judged else " (shown, not judged)"
        rows.append(
            f"| [{ex.title}]({paper}/{name}.md){shown} | {marks.count('held')} | {marks.count('not held')} | "
            f"{marks.count('inconclusive')} | {marks.count('not judged')} | {marks.count('unstable')} | "
            f"{marks.count(V.NOT_TESTABLE)} |"
        )
    reproduced = reproduced_line(exhibits)
    lines = [
        *([reproduced, ""] if reproduced else []),
        counts_line(exhibits) + " The full report: [REPORT.md](REPORT.md).",
        "",
        *([provenance, ""] if provenance else []),
        *rows,
        "",
    ]
    damaged = [m.removeprefix(DAMAGED) for m in missing if m.startswith(DAMAGED)]
    not_run = [m for m in missing if not m.startswith(DAMAGED)]
    if damaged:
        lines += [f"Damaged: {'; '.join(damaged)}.", ""]
    if not_run:
        lines += [f"Not run yet: {', '.join(f'`{m}`' for m in not_run)}.", ""]
    return "\n".join(lines)
