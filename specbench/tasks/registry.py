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

from dataclasses import dataclass

__all__ = ["TASKS", "Task", "quality_columns", "table1_columns", "template_of"]


@dataclass(frozen=True)
class Task:
    """One task: ``name`` (a query's ``kind``), ``template`` (its key in a template set; default: the name),
    ``metric`` (a name in ``metrics.METRICS``, scored when the record has a reference; None: ``output_words`` and
    exact match only), ``quality`` (the metric's column the cascades judge on), ``tolerance`` (the quality loss
    their closing note tolerates against lossless SD), ``quality_label`` (how the cascades' notes name the
    quality column), ``table1`` (Huang et al. Table 1's quality column; None: not in that table)."""

    name: str
    template: str = ""
    metric: str | None = None
    quality: str | None = None
    tolerance: float = 0.0
    quality_label: str = ""
    table1: str | None = None

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


def quality_columns() -> dict[str, tuple[str, float]]:
    """task -> (quality column, tolerated loss), for every task with a quality column, in registry order."""
    return {t.name: (t.quality, t.tolerance) for t in TASKS.values() if t.quality}


def table1_columns() -> dict[str, str]:
    """task -> Huang et al. Table 1's quality column, for the tasks in that table."""
    return {t.name: t.table1 for t in TASKS.values() if t.table1}
