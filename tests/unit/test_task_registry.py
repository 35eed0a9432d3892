"""One task registry: a task registered once in ``tasks/registry.py`` is seen by every consumer (its metric in
``metrics.score``, its template, the cascades' quality map, Huang et al.'s Table 1 columns)."""

import pytest
from omegaconf import OmegaConf

from specbench.configs import conf_dir
from specbench.tasks import metrics, prompts
from specbench.tasks.formats import Query
from specbench.tasks.registry import TASKS, Task, template_of

REFERENCE = "The cat sat on the mat. #### 42"


def test_every_task_with_a_quality_column_has_a_metric_that_writes_it():
    assert {"translation", "summarization", "math", "qa", "chat", "code"} <= set(TASKS)
    for task in TASKS.values():
        assert task.template, task.name
        if task.metric is None:
            assert task.quality is None and task.table1 is None, task.name
            continue
        scores = metrics.METRICS[task.metric](REFERENCE, REFERENCE)
        assert task.quality in scores and task.quality_label, task.name
        assert task.table1 is None or task.table1 in scores, task.name
        assert set(scores) | {"output_words"} == set(metrics.score(task.name, "x", REFERENCE)), task.name
        assert set(metrics.score(task.name, "x", None)) == {"output_words"}


def test_the_consumers_maps_are_derived_from_the_registry():
    from specbench.pipelines import cascade_curves as cascades
    from specbench.reproduction import huang

    assert {t.name: (t.quality, t.tolerance) for t in TASKS.values() if t.quality} == cascades.QUALITY
    assert {t.name: t.table1 for t in TASKS.values() if t.table1} == huang.TABLE1_QUALITY
    for name in cascades.QUALITY:
        assert f"{TASKS[name].quality_label} ({name})" in cascades.notes(cascades.QUALITY)
    # the values every record and table so far was written with
    assert cascades.QUALITY == {
        "translation": ("bleu", 1.0),
        "summarization": ("rouge2", 1.0),
        "math": ("accuracy", 0.01),
    }
    assert huang.TABLE1_QUALITY == {"translation": "bleu", "summarization": "rougeL"}


def test_a_task_registered_once_is_seen_by_every_consumer(monkeypatch):
    """A new task with its own template key and an existing metric: scored, templated and in both quality maps."""
    from specbench.tasks.registry import quality_columns, table1_columns

    new = Task(
        "poetry",
        template="verse",
        metric="bleu",
        quality="bleu",
        tolerance=2.0,
        quality_label="corpus BLEU",
        table1="bleu",
    )
    monkeypatch.setitem(TASKS, "poetry", new)
    assert set(metrics.score("poetry", "a b c", "a b c")) == {"bleu", "output_words"}
    assert template_of("poetry") == "verse"
    q = Query(id="p1", task="poetry", fields={"turn": "roses"})
    assert prompts.render(q, {"verse": "Write: {turn}", "default": "{turn}"}) == "Write: roses"
    assert quality_columns()["poetry"] == ("bleu", 2.0)
    assert table1_columns()["poetry"] == "bleu"


def test_every_template_set_has_a_template_for_every_registered_task():
    sets = OmegaConf.to_container(OmegaConf.load(f"{conf_dir()}/templates/default.yaml"))
    for name, templates in sets.items():
        missing = [t.name for t in TASKS.values() if t.template not in templates]
        assert not missing, f"template set {name} lacks {missing}"


def test_a_quality_column_needs_a_metric():
    with pytest.raises(ValueError, match="without a metric"):
        Task("broken", quality="bleu")


def test_a_run_may_judge_a_task_on_another_column_of_its_metric():
    from specbench.errors import SpecbenchError
    from specbench.pipelines import cascade_curves as cascades
    from specbench.tasks.registry import quality_columns

    chosen = quality_columns({"summarization": "rouge1"})
    assert chosen["summarization"] == ("rouge1", 1.0) and chosen["translation"] == ("bleu", 1.0)
    assert "mean ROUGE-1 F x 100 (summarization)" in cascades.notes(chosen)
    with pytest.raises(SpecbenchError, match=r"quality_metric.summarization=rouge3: expected one of rouge1"):
        quality_columns({"summarization": "rouge3"})
    with pytest.raises(SpecbenchError, match="no quality metric for task 'chat'"):
        quality_columns({"chat": "rouge1"})
    records = [
        {
            "query_id": "q",
            "task": "summarization",
            "method": m,
            "quality": {"rouge1": 40.0, "rouge2": 10.0},
            "output_ids": [1, 2],
            "new_tokens": 2,
            "seconds": 1.0,
            "target_calls": 2,
            "accepted": 0,
            "rejected": 0,
            "drafted": 0,
        }
        for m in ("autoregressive", "sd")
    ]
    assert cascades.curves(records, [], chosen).quality.tolist() == [40.0, 40.0]
    assert cascades.curves(records, []).quality.tolist() == [10.0, 10.0]
