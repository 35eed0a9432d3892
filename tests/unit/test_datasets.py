"""Dataset loaders on fixture files written here and on the real files in ../shared/data."""

import json
from pathlib import Path

import pandas as pd
import pytest
from omegaconf import OmegaConf

from specbench.errors import SpecbenchError
from specbench.tasks import load_dataset_config, render
from specbench.tasks.datasets import load_source

CONF = Path(__file__).resolve().parents[2] / "conf"
SHARED = Path(__file__).resolve().parents[3] / "shared" / "data"
needs_shared = pytest.mark.skipif(not SHARED.is_dir(), reason="../shared/data is not present (a user's fresh clone)")


def dataset_cfg(name: str, **overrides):
    cfg = OmegaConf.create({"dataset": OmegaConf.load(CONF / "dataset" / f"{name}.yaml")})
    for key, value in overrides.items():
        OmegaConf.update(cfg, f"dataset.{key}", value, force_add=True)
    return cfg.dataset


def write_jsonl(path: Path, rows) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_fixture_formats(tmp_path):
    g = write_jsonl(tmp_path / "g.jsonl", [{"question": "1+1?", "answer": "2\n#### 2"}] * 3)
    x = write_jsonl(tmp_path / "x.jsonl", [{"document": "Long text.", "summary": "Short.", "id": "a1"}])
    i = tmp_path / "i.json"
    i.write_text(json.dumps([{"translation": {"de": "Hallo Welt", "en": "Hello world"}}]))
    m = write_jsonl(tmp_path / "m.jsonl", [{"question_id": 7, "category": "math", "turns": ["A?", "B?"],
                                            "reference": ["a", "b"]}])
    assert load_source("g", {"format": "gsm8k", "path": str(g)})[0].reference.endswith("#### 2")
    assert load_source("x", {"format": "xsum", "path": str(x)})[0].id == "a1"
    q = load_source("i", {"format": "iwslt", "path": str(i)})[0]
    assert (q.fields["source"], q.reference, q.task) == ("Hallo Welt", "Hello world", "translation")
    rev = load_source("i", {"format": "iwslt", "path": str(i), "source_lang": "en", "target_lang": "de"})[0]
    assert (rev.fields["source"], rev.reference) == ("Hello world", "Hallo Welt")
    mq = load_source("m", {"format": "mt_bench", "path": str(m)})[0]
    assert mq.turns == ["A?", "B?"] and mq.category == "math" and mq.task == "chat"


def test_parquet(tmp_path):
    path = tmp_path / "q.parquet"
    pd.DataFrame([{"question_id": 1, "category": "qa", "turns": ["Hi?"]}]).to_parquet(path)
    q = load_source("p", {"format": "mt_bench", "path": str(path), "task_from_category": True})[0]
    assert q.turns == ["Hi?"] and q.task == "qa"


def test_limit_seed_and_interleave(tmp_path):
    g = write_jsonl(tmp_path / "g.jsonl", [{"question": f"q{i}", "answer": f"#### {i}"} for i in range(20)])
    x = write_jsonl(tmp_path / "x.jsonl", [{"document": f"d{i}", "summary": "s", "id": f"x{i}"} for i in range(20)])
    cfg = dataset_cfg("mixed", limit=5)
    cfg.sources = {"gsm8k": {"format": "gsm8k", "task": "math", "path": str(g)},
                   "xsum": {"format": "xsum", "task": "summarization", "path": str(x)}}
    a, b = load_dataset_config(cfg), load_dataset_config(cfg)
    assert [q.id for q in a] == [q.id for q in b]  # seeded
    assert sum(q.task == "math" for q in a) == 5 and sum(q.task == "summarization" for q in a) == 5
    tasks = [q.task for q in a]
    assert tasks != sorted(tasks) and tasks != sorted(tasks, reverse=True)  # interleaved
    other = OmegaConf.merge(cfg, {"seed": 1})
    assert [q.id for q in load_dataset_config(other)] != [q.id for q in a]


def test_offset_gives_disjoint_held_out_slices(tmp_path):
    g = write_jsonl(tmp_path / "g.jsonl", [{"question": f"q{i}", "answer": f"#### {i}"} for i in range(20)])
    first = load_dataset_config(dataset_cfg("gsm8k", path=str(g), limit=6, shuffle=True))
    second = load_dataset_config(dataset_cfg("gsm8k", path=str(g), limit=6, shuffle=True, offset=6))
    everything = load_dataset_config(dataset_cfg("gsm8k", path=str(g), shuffle=True))
    assert [q.id for q in first + second] == [q.id for q in everything[:12]]
    assert not {q.id for q in first} & {q.id for q in second}
    with pytest.raises(SpecbenchError, match="dataset.offset must be >= 0"):
        load_dataset_config(dataset_cfg("gsm8k", path=str(g), offset=-1))


def test_categories_filter_and_unknown(tmp_path):
    m = write_jsonl(tmp_path / "m.jsonl", [{"question_id": i, "category": c, "turns": ["x"]}
                                           for i, c in enumerate(["math", "writing", "math"])])
    cfg = dataset_cfg("spec_bench", path=str(m), categories=["math"])
    qs = load_dataset_config(cfg)
    assert [q.task for q in qs] == ["math", "math"]  # Spec-Bench: each category is its own task
    with pytest.raises(SpecbenchError, match="known categories: math, writing"):
        load_dataset_config(dataset_cfg("spec_bench", path=str(m), categories=["poetry"]))


@pytest.mark.parametrize("rows, match", [
    ([{"question": "q"}], r"g\.jsonl:1: record has no field 'answer'"),
    ([{"question": "q", "answer": "a"}, {"answer": "a"}], r"g\.jsonl:2: record has no field 'question'"),
])
def test_malformed_record_names_file_line_field(tmp_path, rows, match):
    g = write_jsonl(tmp_path / "g.jsonl", rows)
    with pytest.raises(SpecbenchError, match=match):
        load_dataset_config(dataset_cfg("gsm8k", path=str(g)))


def test_bad_json_line(tmp_path):
    g = tmp_path / "g.jsonl"
    g.write_text('{"question": "q", "answer": "a"}\n{not json\n')
    with pytest.raises(SpecbenchError, match=r"g\.jsonl:2: not valid JSON"):
        load_dataset_config(dataset_cfg("gsm8k", path=str(g)))


def test_missing_file_and_empty(tmp_path):
    with pytest.raises(SpecbenchError, match="does not exist"):
        load_dataset_config(dataset_cfg("gsm8k", path=str(tmp_path / "nope.jsonl")))
    (tmp_path / "e.jsonl").write_text("")
    with pytest.raises(SpecbenchError, match="empty"):
        load_dataset_config(dataset_cfg("gsm8k", path=str(tmp_path / "e.jsonl")))


def test_unreachable_hub_says_how_to_pass_a_file(monkeypatch):
    import datasets

    def offline(*args, **kwargs):
        raise ConnectionError("no network")

    monkeypatch.setattr(datasets, "load_dataset", offline)
    with pytest.raises(SpecbenchError, match="could not load the dataset 'openai/gsm8k'") as info:
        load_dataset_config(dataset_cfg("gsm8k"))
    assert "dataset.path=" in info.value.fix


def test_unknown_format(tmp_path):
    with pytest.raises(SpecbenchError, match="unknown format 'csv'"):
        load_source("s", {"format": "csv", "path": "x"})


def test_templates_render_fields_and_shots():
    templates = OmegaConf.to_container(OmegaConf.load(CONF / "templates" / "default.yaml"))["instruct"]
    from specbench.tasks import Query

    q = Query(id="1", task="math", fields={"question": "What is 2+2?"}, reference="#### 4")
    shot = Query(id="s", task="math", fields={"question": "1+1?"}, reference="2 #### 2")
    text = render(q, templates, shots=[shot])
    assert text.startswith("Question: 1+1?\nAnswer: 2 #### 2\n\n") and "What is 2+2?" in text
    unknown = Query(id="2", task="rag", fields={"turn": "Why?"}, turns=["Why?"])
    assert render(unknown, templates) == "Why?"  # the default template


@needs_shared
@pytest.mark.parametrize("name, path, n, task", [
    ("gsm8k", "gsm8k/test.jsonl", 1319, "math"),
    ("xsum", "xsum/xsum-1000.jsonl", 1000, "summarization"),
    ("iwslt2017", "iwslt2017_de_en/validation.json", 888, "translation"),
    ("mt_bench", "mt_bench/question.jsonl", 80, "chat"),
])
def test_real_files(name, path, n, task):
    qs = load_dataset_config(dataset_cfg(name, path=str(SHARED / path)))
    assert len(qs) == n and {q.task for q in qs} == {task}
    assert all(q.reference for q in qs) or task == "chat"
    if name == "mt_bench":
        assert all(len(q.turns) == 2 for q in qs)
        assert len({q.category for q in qs}) == 8


@needs_shared
def test_real_mt_bench_categories_and_mixed_local():
    qs = load_dataset_config(dataset_cfg("mt_bench", path=str(SHARED / "mt_bench/question.jsonl"),
                                         categories=["math", "coding"]))
    assert len(qs) == 20
    cfg = dataset_cfg("mixed", limit=3, sources={
        "iwslt2017": {"path": str(SHARED / "iwslt2017_de_en/validation.json")},
        "xsum": {"path": str(SHARED / "xsum/xsum-1000.jsonl")},
        "gsm8k": {"path": str(SHARED / "gsm8k/test.jsonl")},
        "mt_bench": {"path": str(SHARED / "mt_bench/question.jsonl")}})
    qs = load_dataset_config(cfg)
    assert sorted(q.task for q in qs) == sorted(["translation", "summarization", "math", "chat"] * 3)
