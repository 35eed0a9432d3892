"""The task registry: what is per task, in one place.

A task is what a record format defines (``tasks/formats.py``: a query's ``kind``) and, by default, a query's
label in the tables. Its ``Task`` names its prompt template (the key of a template set in ``conf/templates``),
its quality metric (a name in ``tasks/metrics.py``: ``METRICS``), the column that metric writes which the
cascades judge quality on (and the loss they tolerate against lossless SD), and the column Huang et al.'s
Table 1 reports. Every consumer reads ``TASKS``: ``metrics.score`` (the per-example quality of a record),
``prompts.render`` (the template), ``pipelines/cascades.py`` (``QUALITY``) and ``reproduction/huang.py``
(``TABLE1_QUALITY``). Adding a task: a ``Task`` here, a parser in ``formats.py`` (with a metric: its function in
``metrics.METRICS``), and a template in each set of ``conf/templates/default.yaml``.

Pure data: nothing here imports a metric library, so the maps derived from it are cheap to import.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from specbench.errors import SpecbenchError

__all__ = ["TASKS", "Task", "quality_columns", "quality_label", "table1_columns", "template_of"]


@dataclass(frozen=True)
class Task:
    """One task: ``name`` (a query's ``kind``), ``template`` (its key in a template set; default: the name),
    ``metric`` (a name in ``metrics.METRICS``, scored when the record has a reference; None: ``output_words`` and
    exact match only), ``quality`` (the metric's column the cascades judge on by default), ``tolerance`` (the
    quality loss their closing note tolerates against lossless SD), ``quality_label`` (how the cascades' notes name
    the quality column), ``table1`` (Huang et al. Table 1's quality column; None: not in that table), ``columns``
    (every per-query column the metric writes, each a quality a run may choose instead: ``quality_columns``)."""

    name: str
    template: str = ""
    metric: str | None = None
    quality: str | None = None
    tolerance: float = 0.0
    quality_label: str = ""
    table1: str | None = None
    columns: tuple[str, ...] = ()

    def __post_init__(self):
        if not self.template:
            object.__setattr__(self, "template", self.name)
        if self.quality and not self.metric:
            raise ValueError(f"task '{self.name}': quality column '{self.quality}' without a metric")


TASKS: dict[str, Task] = {
    t.name: t
    for t in (
        Task(
            "translation",
            metric="bleu",
            quality="bleu",
            tolerance=1.0,
            quality_label="corpus BLEU",
            table1="bleu",
        ),
        Task(
            "summarization",
            metric="rouge",
            quality="rouge2",
            tolerance=1.0,
            quality_label="mean ROUGE-2 F x 100",
            table1="rougeL",
            columns=("rouge1", "rouge2", "rougeL"),
        ),
        Task("math", metric="gsm8k", quality="accuracy", tolerance=0.01, quality_label="GSM8K accuracy"),
        Task("qa"),
        Task("chat"),
        Task("code"),
    )
}


def template_of(kind: str) -> str:
    """The template key of a query's ``kind`` (a kind the registry does not know uses its own name)."""
    task = TASKS.get(kind)
    return task.template if task else kind


def quality_columns(chosen: Mapping[str, str] | None = None) -> dict[str, tuple[str, float]]:
    """task -> (quality column, tolerated loss), for every task with a quality column, in registry order; a task
    of ``chosen`` (a cascades run's ``quality_metric``) is judged on the column named there instead, one of its
    ``Task.columns``."""
    out = {t.name: (t.quality, t.tolerance) for t in TASKS.values() if t.quality}
    for task, column in (chosen or {}).items():
        allowed = (TASKS[task].columns or (TASKS[task].quality,)) if task in out else ()
        if column not in allowed:
            raise SpecbenchError(
                f"quality_metric.{task}={column}: "
                + (
                    f"expected one of {', '.join(allowed)}"
                    if allowed
                    else f"no quality metric for task '{task}'"
                ),
                f"set quality_metric.{task} to one of: {', '.join(allowed)}"
                if allowed
                else f"drop quality_metric.{task} (tasks with one: {', '.join(out)})",
            )
        out[task] = (column, out[task][1])
    return out


def quality_label(task: str, column: str) -> str:
    """How a page names ``task``'s quality ``column``: its ``Task.quality_label`` for the default one."""
    t = TASKS[task]
    if column == t.quality:
        return t.quality_label
    return {"rouge1": "mean ROUGE-1 F x 100", "rougeL": "mean ROUGE-L F x 100"}.get(column, column)


def table1_columns() -> dict[str, str]:
    """task -> Huang et al. Table 1's quality column, for the tasks in that table."""
    return {t.name: t.table1 for t in TASKS.values() if t.table1}
