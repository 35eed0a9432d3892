"""The paper-scale experiments, dry-run on CPU: everything but the weights.

Each experiment whose target is a hub model is composed for every command it is written for; each hub
model (and each drafter that ``train-drafter`` builds into the cache) is replaced by a tiny random model
of the same architecture class and vocabulary size, written with ``save_pretrained`` and loaded back
through the local-directory path (a 32000-token Llama for Vicuna-7B and the 68M drafters, T5 and T5 v1.1
for T5 and Flan-T5, Gemma-2 at 256000 tokens, Qwen2, a 16-layer Llama-3 for LayerSkip, an EAGLE-1 head
in the published ``pytorch_model.bin`` layout); each dataset source reads a small file in its own record
format (a Spec-Bench question.jsonl for Spec-Bench). Then one query with a few tokens goes through every
method of the experiment: eval's methods, every cascade rule and alpha, collect -> train-policy -> eval
with the policy for the context-aware experiments, and train-drafter for the drafter recipes. Prompts,
chat templates, tokenizer-vocabulary checks, layer paths, dataset formats and splits, the selectors and
the output files are all exercised; a new hub model without a stand-in fails the test.
"""

from __future__ import annotations

import copy
import fnmatch
import functools
import hashlib
import json
import re
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf, open_dict

from specbench.configs import conf_dir
from specbench.models.tiny import byte_tokenizer, write_tiny
from tests.experiments import commands_for, experiments, paper_scale

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
GENERIC_CHAT = (
    "{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}<assistant>{% endif %}"
)


@dataclass(frozen=True)
class Family:
    """One tokenizer shared by every model of a family (the vocabulary check compares them)."""

    vocab: int  # tokenizer entries
    bos: str | None = None
    chat: bool = False  # the real tokenizer ships a chat template


@dataclass(frozen=True)
class StandIn:
    family: str
    arch: str  # a specbench.models.tiny.ARCHS class, or "eagle" (an EAGLE-1 head for the family's target)
    layers: int = 2
    rows: int | None = None  # embedding rows when the model pads its vocabulary
    tie: bool = True


FAMILIES = {
    "vicuna": Family(32000, bos="<s>"),
    "t5": Family(32100),
    "gemma2": Family(256000, bos="<bos>", chat=True),
    "llama3": Family(128256, bos="<|begin_of_text|>", chat=True),
    "qwen2": Family(151665, chat=True),
}
_T5 = StandIn("t5", "t5", rows=32128)
_FLAN = StandIn("t5", "t5_v1_1", rows=32128, tie=False)
_GEMMA = StandIn("gemma2", "gemma2")
_QWEN = StandIn("qwen2", "qwen2", rows=151936)
# Model references of the paper-scale configs (fnmatch patterns) -> their stand-ins.
STAND_INS = {
    "lmsys/vicuna-7b-v1.3": StandIn("vicuna", "llama"),
    "double7/vicuna-68m": StandIn("vicuna", "llama", layers=1),
    "cache:drafters/vicuna68m_*": StandIn("vicuna", "llama", layers=1),
    "yuhuili/EAGLE-Vicuna-7B-v1.3": StandIn("vicuna", "eagle"),
    "cache:drafters/eagle_vicuna_*": StandIn("vicuna", "eagle"),
    "google-t5/t5-large": _T5,
    "google-t5/t5-small": _T5,
    "Muennighoff/t5-small-finetuned-xsum-512": _T5,
    "sysresearch101/t5-large-finetuned-xsum": _T5,
    "google/flan-t5-xl": _FLAN,
    "google/flan-t5-base": _FLAN,
    "google/flan-t5-small": _FLAN,
    "google/gemma-2-9b-it": _GEMMA,
    "google/gemma-2-27b-it": _GEMMA,
    "google/gemma-2-2b-it": _GEMMA,
    "facebook/layerskip-llama3.2-1B": StandIn("llama3", "llama", layers=16),
    "Qwen/Qwen2.5-1.5B-Instruct": _QWEN,
    "Qwen/Qwen2.5-0.5B-Instruct": _QWEN,
}


def stand_in_of(ref: str) -> StandIn:
    matches = [spec for pattern, spec in STAND_INS.items() if fnmatch.fnmatchcase(ref, pattern)]
    assert matches, f"model '{ref}' has no tiny stand-in: add it to STAND_INS in {Path(__file__).name}"
    return matches[0]


def seed_of(ref: str) -> int:
    return int(hashlib.sha256(ref.encode()).hexdigest(), 16) % 10_000


@functools.cache
def _composed(command: str, overrides: tuple[str, ...]):
    with initialize_config_dir(config_dir=conf_dir(), version_base=None):
        return compose(config_name=command, overrides=list(overrides))


def compose_for(command: str, overrides: list[str]):
    """The composed config (a fresh copy: runs change it)."""
    return copy.deepcopy(_composed(command, tuple(overrides)))


PAPER = [name for name in experiments() if paper_scale(name)]


class StandIns:
    """Stand-in directories, built once per test session (tokenizers of 256k entries take a second)."""

    def __init__(self, root: Path):
        self.root = root
        self.dirs: dict[str, Path] = {}
        self.tokenizers: dict[str, object] = {}
        self.targets: dict[str, Path] = {}  # family -> the directory of its target's stand-in (EAGLE heads)

    def tokenizer(self, family: str):
        if family not in self.tokenizers:
            fam = FAMILIES[family]
            self.tokenizers[family] = byte_tokenizer(
                fam.vocab, bos_token=fam.bos, chat_template=GENERIC_CHAT if fam.chat else None
            )
        return self.tokenizers[family]

    def get(self, ref: str, target: bool = False) -> str:
        spec = stand_in_of(ref)
        if ref not in self.dirs:
            path = self.root / hashlib.sha256(ref.encode()).hexdigest()[:12]
            if spec.arch == "eagle":
                self._eagle(path, spec)
            else:
                write_tiny(
                    path,
                    spec.arch,
                    self.tokenizer(spec.family),
                    layers=spec.layers,
                    hidden=32,
                    seed=seed_of(ref),
                    vocab_size=spec.rows,
                    tie=spec.tie,
                )
            self.dirs[ref] = path
        if target:
            self.targets[spec.family] = self.dirs[ref]
        return str(self.dirs[ref])

    def _eagle(self, path: Path, spec: StandIn) -> None:
        """An EAGLE-1 head as published: pytorch_model.bin with embed_tokens, fc and layers.0 (no input norm)
        plus a Llama config.json of one layer, built against the family's target stand-in."""
        from transformers import AutoModelForCausalLM

        from specbench.drafters.eagle import EagleHead

        target = AutoModelForCausalLM.from_pretrained(self.targets[spec.family])
        head = EagleHead(target, layers=1)
        gen = torch.Generator().manual_seed(7)
        state = {k: torch.randn(v.shape, generator=gen) * 0.3 for k, v in head.state_dict().items()}
        state["embed_tokens.weight"] = target.get_input_embeddings().weight.detach().clone()
        path.mkdir(parents=True)
        torch.save(state, path / "pytorch_model.bin")
        config = target.config.to_dict() | {"num_hidden_layers": 1, "architectures": ["LlamaForCausalLM"]}
        (path / "config.json").write_text(json.dumps(config, default=str))


@pytest.fixture(scope="module")
def stand_ins(tmp_path_factory):
    return StandIns(tmp_path_factory.mktemp("stand_ins"))


# ------------------------------------------------------------------------------------------------
# data: each source reads a file in its own record format (content depends on the split, so a train
# split and a test split hold different queries, as on the hub)
# ------------------------------------------------------------------------------------------------


def rows_of(fmt: str, source, split: str, n: int = 10) -> list[dict]:
    if fmt in ("iwslt", "translation"):
        src, tgt = str(source.get("source_lang") or "de"), str(source.get("target_lang") or "en")
        return [
            {"translation": {src: f"{split} sentence {i} to translate.", tgt: f"{split} translation {i}."}}
            for i in range(n)
        ]
    if fmt == "xsum":
        return [
            {
                "document": f"{split} article {i}: the council met and voted.",
                "summary": f"Vote {i}.",
                "id": f"{split}-{i}",
            }
            for i in range(n)
        ]
    if fmt == "cnn_dm":
        return [
            {
                "article": f"{split} story {i}: a bridge reopened.",
                "highlights": f"Bridge {i} reopens.",
                "id": f"{split}-{i}",
            }
            for i in range(n)
        ]
    if fmt == "gsm8k":
        return [
            {"question": f"{split}: what is {i} plus 2?", "answer": f"{i} + 2 = {i + 2}\n#### {i + 2}"}
            for i in range(n)
        ]
    if fmt == "qa":
        return [{"question": f"{split} question {i}?", "answer": [f"answer {i}"]} for i in range(n)]
    if fmt == "alpaca":
        return [
            {"instruction": f"{split}: write a function {i}.", "input": "", "output": "def f(): pass"}
            for i in range(n)
        ]
    if (
        fmt == "mt_bench"
    ):  # Spec-Bench's question.jsonl: categories named like built-in tasks, two-turn questions
        return [json.loads(x) for x in (FIXTURES / "spec_bench_question.jsonl").read_text().splitlines()]
    raise AssertionError(f"no dry-run data for dataset format '{fmt}': add it to rows_of")


def local_data(cfg, root: Path) -> None:
    """Point every source (and the n-shot source) of ``cfg.dataset`` at a file in its format."""
    root.mkdir(parents=True, exist_ok=True)
    named = [(f"dataset.sources.{k}", v) for k, v in (cfg.dataset.sources or {}).items() if v is not None]
    if cfg.dataset.get("shots") is not None and int(cfg.dataset.get("n_shot") or 0) > 0:
        named.append(("dataset.shots", cfg.dataset.shots))
    for key, source in named:
        split = str(source.get("split") or "test")
        path = root / f"{key}-{split}.jsonl"
        path.write_text("".join(json.dumps(r) + "\n" for r in rows_of(str(source.format), source, split)))
        OmegaConf.update(cfg, f"{key}.path", str(path))
    if (
        OmegaConf.is_missing(cfg.dataset, "path") and named
    ):  # a source that reads ${dataset.path} (Spec-Bench)
        cfg.dataset.path = str(cfg.dataset.sources[named[0][0].rsplit(".", 1)[1]].path)


def tiny_run(cfg, stand_ins: StandIns, root: Path, limit: int = 1) -> None:
    """Stand-ins for every model of ``cfg``, local data, CPU, a few tokens."""
    with open_dict(cfg):
        cfg.target.model = stand_ins.get(str(cfg.target.model), target=True)
        cfg.target.device, cfg.target.dtype = "cpu", "float32"
        for drafter in (cfg.get("pool") or {}).get("drafters", {}).values():
            key = "checkpoint" if "checkpoint" in drafter else "model" if "model" in drafter else None
            if key:
                drafter[key] = stand_ins.get(str(drafter[key]))
        if (cfg.get("drafter") or {}).get("model"):  # train-drafter drafter.kind=hf: the model it fine-tunes
            cfg.drafter.model = stand_ins.get(str(cfg.drafter.model))
        local_data(cfg, root / "data")
        cfg.dataset.limit = limit
        cfg.dataset.max_input_tokens = 48
        if "decoding" in cfg:
            cfg.decoding.max_new_tokens = 3
        if "warmup" in cfg:  # the warm-up is the same decode call; skipping it halves the cascades' time
            cfg.warmup.max_new_tokens = 0
        cfg.threads = None
    # the early-exit read-off paths of the target config name modules of that family (T5 has no model.norm)
    from transformers import AutoModelForCausalLM, AutoModelForSeq2SeqLM

    auto = AutoModelForSeq2SeqLM if cfg.target.layers_key == "num_decoder_layers" else AutoModelForCausalLM
    auto.from_pretrained(cfg.target.model).get_submodule(str(cfg.target.final_norm))


def _check_outputs(out: Path, methods_min: int = 2) -> None:
    examples = [json.loads(x) for x in (out / "examples.jsonl").read_text().splitlines()]
    assert len({e["method"] for e in examples}) >= methods_min
    assert all(1 <= e["new_tokens"] <= 3 for e in examples)


def run_eval(cfg, out: Path) -> None:
    from specbench.pipelines import evaluate

    evaluate.run(cfg, out)
    _check_outputs(out)
    summary = (out / "summary.csv").read_text()
    for spec in cfg.methods:
        if str(spec).startswith("fixed:") and spec != "fixed:*":
            assert spec in summary
    if cfg.get("spec_bench_answers"):
        assert list((out / "spec_bench").glob("*-autoregressive.jsonl"))


@pytest.mark.parametrize("name", PAPER)
def test_paper_experiment_dry_run(name, stand_ins, tmp_path):
    commands = commands_for(name)
    if commands == ["train_drafter"]:
        from specbench.pipelines import train_drafter

        cfg = compose_for(
            "train_drafter",
            [
                f"experiment={name}",
                f"out={tmp_path / 'drafter'}",
                "train.epochs=1",
                "train.max_new_tokens=4",
                "train.max_tokens=512",
                "train.seq_len=512",
                "train.batch_size=2",
                "train.val_examples=1",
            ],
        )
        assert str(cfg.drafter.kind) in train_drafter.TRAINEES, cfg.drafter.kind
        tiny_run(cfg, stand_ins, tmp_path, limit=4)
        train_drafter.run(cfg, tmp_path / "run")
        assert (tmp_path / "drafter" / "model.safetensors").exists()
        return
    if commands == ["cascades"]:
        from specbench.pipelines import cascades

        cfg = compose_for("cascades", [f"experiment={name}"])
        tiny_run(cfg, stand_ins, tmp_path)
        cascades.run(cfg, tmp_path / "run")
        import pandas as pd

        from specbench.decoding.cascade import Cascade

        methods = set(pd.read_csv(tmp_path / "run" / "curves.csv").method)
        for rule in cfg.rules:
            for alpha in cfg.alphas[rule]:  # every point of the grid has its own row
                assert Cascade(str(rule), float(alpha)).label in methods, (rule, alpha, sorted(methods))
        return
    if commands == [
        "collect",
        "eval",
    ]:  # context-aware selection: collect -> train-policy -> eval with the policy
        from specbench.pipelines import collect, collected, train_policy

        cfg = compose_for("collect", [f"experiment={name}", "collect.measure_speculative=true"])
        tiny_run(cfg, stand_ins, tmp_path / "collect", limit=4)
        collect.run(cfg, tmp_path / "c")
        rows = collected.read_rows([tmp_path / "c"])
        assert rows and all(set(r["arms"]) == set(rows[0]["arms"]) for r in rows)
        train_policy.run(
            compose_for(
                "train_policy", [f"data={tmp_path / 'c'}", "train.epochs=2", "train.val_fraction=0.5"]
            ),
            tmp_path / "p",
        )  # >= 2 held-out rows
        cfg = compose_for(
            "eval",
            [f"experiment={name}", "selector=policy", f"policy.checkpoint={tmp_path / 'p' / 'policy.pt'}"],
        )
        tiny_run(cfg, stand_ins, tmp_path / "eval")  # the test split: held out from the collected train split
        run_eval(cfg, tmp_path / "e")
        assert "policy" in (tmp_path / "e" / "summary.csv").read_text()
        return
    assert commands == ["eval"], commands
    cfg = compose_for("eval", [f"experiment={name}"])
    tiny_run(cfg, stand_ins, tmp_path)
    run_eval(cfg, tmp_path / "run")


def test_every_paper_model_has_a_stand_in_of_its_family():
    """Each experiment's models share one family (the vocabulary check would refuse a mix), and every
    reference has a stand-in; the list of paper-scale experiments is not empty."""
    assert len(PAPER) >= 10
    for name in PAPER:
        for command in commands_for(name):
            cfg = compose_for(command, [f"experiment={name}"])
            refs = [str(cfg.target.model)] + [
                str(d.get("checkpoint") or d.get("model"))
                for d in ((cfg.get("pool") or {}).get("drafters") or {}).values()
                if d.get("checkpoint") or d.get("model")
            ]
            refs += [str(cfg.drafter.model)] if (cfg.get("drafter") or {}).get("model") else []
            assert len({stand_in_of(r).family for r in refs}) == 1, (name, refs)


@pytest.mark.slow  # 30 s: every paper step through reproduce (each experiment dry-runs in make test)
def test_reproduce_paper_runs_every_step_and_ends_in_the_paper_report(stand_ins, tmp_path):
    """`make reproduce-paper`'s plan (`specbench reproduce --scale paper`) on the stand-ins: every step
    runs in its fixed directory, and `specbench report` on that root builds every paper-scale exhibit
    (Spec-Bench, Huang et al., MetaSD black-box / white-box / stream / multilingual, each cascades run)."""
    from specbench.reproduction import plan, render, statements
    from specbench.reproduction.catalog import builders, specs_at
    from specbench.reproduction.layouts import PAPER as LAYOUT
    from specbench.reproduction.runs import PAPER_CASCADES

    def adapt(step, cfg):
        with open_dict(cfg):
            if step.command == "train_policy":  # a few collected rows: >= 2 held out, a short sweep
                cfg.train.epochs, cfg.train.val_fraction = 2, 0.5
                if cfg.sweep.n_examples:
                    cfg.sweep.n_examples = [2, 4]
                return
            tiny_run(
                cfg, stand_ins, tmp_path / "runs" / step.run, limit=4 if step.command == "collect" else 1
            )
            if step.command == "cascades":  # every rule runs in the per-experiment dry run above
                cfg.rules = ["token_v1", "lossy_sd"]
            if cfg.dataset.name == "spec_bench":  # two of the categories the published MetaSD columns name
                cfg.dataset.sources.spec_bench.path, cfg.dataset.limit = str(questions), 2

    questions = tmp_path / "question.jsonl"
    questions.write_text(
        json.dumps({"question_id": 1, "category": "coding", "turns": ["Write a loop in Python."]})
        + "\n"
        + json.dumps(
            {
                "question_id": 2,
                "category": "translation",
                "turns": ["Translate German to English: Guten Morgen."],
            }
        )
        + "\n"
    )
    root = tmp_path / "paper"
    report = plan.run(root, scale="paper", questions=str(questions), adapt=adapt)
    for step in plan.plan_at("paper"):
        assert (root / step.run / plan.DONE).exists(), step.run
    text = (report / "REPORT.md").read_text()
    assert "Not run yet" not in text, text
    linked = re.findall(r"^### \[.*\]\((.*)\.md\)$", text, flags=re.M)  # each heading's page
    judged_once = sorted(page for page in linked if page.startswith("statements/"))
    assert judged_once == sorted(statements.KEYS.values())  # one page of statements per family
    assert len(linked) - len(judged_once) == len(builders(LAYOUT)) == len(specs_at("paper"))
    assert sum(key.startswith("cascades/") for key in (s.key for s in specs_at("paper"))) == len(
        PAPER_CASCADES
    )
    for name in (
        "spec_bench/leaderboard",
        "huang/table1",
        "metasd/whitebox",
        "metasd/multilingual",
        "cascades/t5_wmt",
    ):
        assert (report / f"{name}.md").exists(), name
    assert "SpS (vicuna-68m)" in (report / "spec_bench" / "leaderboard.md").read_text()
    whitebox = (report / "metasd" / "whitebox.md").read_text()
    assert (
        "coding (paper)" in whitebox and "3.724" in whitebox and "2.318" in whitebox
    )  # MetaEagle-UCB beside UCB-BD
    # the root remembers its layout: a plain `specbench report ROOT` rebuilds the same paper report
    assert render.layout_of(root).name == "paper"
    # and a CPU-scale run into the paper root is refused before anything runs
    from specbench.errors import SpecbenchError

    with pytest.raises(SpecbenchError, match="another scale"):
        plan.run(root, scale="tiny")
