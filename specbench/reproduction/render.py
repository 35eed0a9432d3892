"""``specbench report ROOT``: every exhibit whose runs exist under ROOT, written as Markdown + CSV
(+ PNG for figures) in ``ROOT/report/<paper>/``, and one index ``ROOT/report/REPORT.md`` with each
exhibit's pattern verdicts and the exhibits not run yet."""

from __future__ import annotations

import logging
import shutil
from pathlib import Path

from specbench.errors import SpecbenchError
from specbench.pipelines.report import print_table, to_markdown
from specbench.reproduction import published as published_values
from specbench.reproduction.exhibits import BUILDERS, Exhibit, NotRun

log = logging.getLogger(__name__)


def build(root: Path, published=None) -> tuple[list[Exhibit], list[str]]:
    """The exhibits that can be built from ``root``, and a line per one that cannot (what is missing)."""
    published = published_values.load() if published is None else published
    done, missing = [], []
    for builder in BUILDERS:
        try:
            done.append(builder(root, published))
        except NotRun as exc:
            missing.append(str(exc))
    return done, missing


def exhibit_markdown(ex: Exhibit, figure: str | None) -> str:
    parts = [f"## {ex.title}", "", to_markdown(ex.table), ""]
    if figure:
        parts += [f"![{ex.title}]({figure})", ""]
    parts += [f"- {v.line()}" for v in ex.verdicts]
    parts += ["", ex.notes, "", "Runs: " + ", ".join(f"`{r}`" for r in ex.runs), ""]
    return "\n".join(parts)


def write(root: Path, out: Path | None = None) -> Path:
    root = Path(root)
    if not root.is_dir():
        raise SpecbenchError(f"no run directory {root}", "run `make reproduce-cpu` (or specbench reproduce) first, "
                                                         "or pass the root its runs were written to")
    out = Path(out) if out else root / "report"
    exhibits, missing = build(root)
    if not exhibits:
        raise SpecbenchError(f"no reproduced exhibit under {root} (missing: {', '.join(missing[:3])} ...)",
                             "run `make reproduce-cpu` first, or pass the root it wrote to")
    index = ["# Reproduction report", "",
             f"Built by `specbench report {root}` from the run directories under it. Each section: our numbers in the "
             "paper's layout, the published numbers beside them where the paper gives them (`published.yaml`, "
             "with sources), and the paper's claim checked on our numbers.", ""]
    for ex in exhibits:
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
        md = exhibit_markdown(ex, figure)
        (out / paper / f"{name}.md").write_text(md, encoding="utf-8")
        index += [f"### [{ex.title}]({paper}/{name}.md)", "", *[f"- {v.line()}" for v in ex.verdicts], ""]
    if missing:
        index += ["## Not run yet", "", *[f"- needs `{m}`" for m in missing], ""]
    (out / "REPORT.md").write_text("\n".join(index), encoding="utf-8")
    held = sum(v.held is True for ex in exhibits for v in ex.verdicts)
    total = sum(len(ex.verdicts) for ex in exhibits)
    print_table("\n".join(f"- {ex.key}: " + "; ".join(v.mark for v in ex.verdicts) for ex in exhibits),
                title=f"report: {len(exhibits)} exhibits, {held} of {total} verdicts held ({out / 'REPORT.md'})")
    return out


def publish(report_dir: Path, dest: Path) -> Path:
    """Copy a report (Markdown, CSV, PNG) into ``dest`` (e.g. docs/reproduction, which the README links)."""
    dest = Path(dest)
    if dest.exists():
        shutil.rmtree(dest)
    shutil.copytree(report_dir, dest)
    return dest
