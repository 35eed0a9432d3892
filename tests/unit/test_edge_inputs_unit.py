"""Edge inputs below the command line (issue 22, defects 13 and 14): a temperature too small for float32,
empty query fields, a source that the filters empty, a confidence threshold that is no probability, an
experiment under a command it is not written for, an unwritable model cache, a damaged head checkpoint,
and the temporary directories of killed conversions. No model is loaded and nothing is converted."""

from __future__ import annotations

import json
import os
import random
import socket
import subprocess
import sys
import time

import pytest
import torch
from hydra import compose, initialize_config_dir

from specbench.configs import check_experiment_command, conf_dir, experiment_commands
from specbench.decoding.sampling import MIN_TEMPERATURE, SamplingParams, logits_to_probs
from specbench.drafters.base import ModelDrafter, check_confidence_threshold
from specbench.drafters.eagle import EagleDrafter, load_head
from specbench.drafters.head_files import load_state
from specbench.errors import SpecbenchError
from specbench.models import store
from specbench.pipelines.keys import check as validate
from specbench.tasks.datasets import load_dataset_config, read_source
from tests.experiments import commands_for, experiments


def composed(name: str, *overrides: str):
    with initialize_config_dir(config_dir=conf_dir(), version_base=None):
        return compose(config_name=name, overrides=list(overrides))


# -- temperature: 0 or at least MIN_TEMPERATURE ------------------------------------------------


@pytest.mark.parametrize("t", [1e-40, 1e-39, 1e-30, 1e-7])
def test_a_tiny_positive_temperature_is_refused(t):
    with pytest.raises(
        SpecbenchError, match=rf"decoding.temperature={t:g}: expected a finite number >= 0: 0 \(greedy\)"
    ) as info:
        SamplingParams(
            temperature=t
        )  # the dataclass reads the rule its field declares, as the config check does
    assert "decoding.temperature=<" in info.value.fix and f"{MIN_TEMPERATURE:g}" in info.value.fix
    with pytest.raises(
        SpecbenchError, match=rf"decoding.temperature={t:g}: expected a finite number >= 0: 0 \(greedy\)"
    ):
        validate(composed("eval", f"decoding.temperature={t}"))


def test_the_smallest_temperature_allowed_gives_finite_probabilities():
    logits = torch.tensor([30.0, 29.99, -50.0, 0.0])
    probs = logits_to_probs(logits, SamplingParams(temperature=MIN_TEMPERATURE))
    assert torch.isfinite(probs).all() and torch.allclose(probs.sum(), torch.tensor(1.0))
    assert probs.argmax() == 0 and probs[0] > 0.999
    for t in (0, MIN_TEMPERATURE, 0.7):  # 0 and the minimum itself validate
        validate(composed("eval", f"decoding.temperature={t}"))


# -- empty query fields, named before any model loads ------------------------------------------


@pytest.mark.parametrize(
    "fmt, record, field",
    [
        ("gsm8k", {"question": "", "answer": "#### 1"}, "question"),
        ("gsm8k", {"question": " \n\t", "answer": "#### 1"}, "question"),
        ("qa", {"question": "  ", "answer": ["x"]}, "question"),
        ("xsum", {"document": "", "summary": "s", "id": "d7"}, "document"),
        ("iwslt", {"translation": {"de": " ", "en": "hi"}}, "source"),
        ("mt_bench", {"question_id": 5, "category": "writing", "turns": ["", "more"]}, "turn"),
        ("mt_bench", {"question_id": 5, "category": "writing", "turns": ["first", " "]}, "turn 2"),
        ("alpaca", {"instruction": " ", "output": "o"}, "turn"),
    ],
)
def test_an_empty_query_field_is_refused_naming_the_record(tmp_path, fmt, record, field):
    good = {
        "gsm8k": {"question": "1+1?", "answer": "#### 2"},
        "qa": {"question": "who?", "answer": ["x"]},
        "xsum": {"document": "text", "summary": "s", "id": "d1"},
        "iwslt": {"translation": {"de": "hallo", "en": "hello"}},
        "mt_bench": {"question_id": 1, "category": "writing", "turns": ["hi", "again"]},
        "alpaca": {"instruction": "say hi", "output": "hi"},
    }[fmt]
    path = tmp_path / "data.jsonl"
    path.write_text(json.dumps(good) + "\n" + json.dumps(record) + "\n")
    with pytest.raises(SpecbenchError) as info:
        read_source("src", {"format": fmt, "path": str(path)})
    assert info.value.problem.startswith(f"{path}:2: dataset source 'src': query ")
    assert info.value.problem.endswith(f"has an empty {field}")
    assert "remove the record" in info.value.fix
    ids = {
        "gsm8k": "gsm8k-1",
        "qa": "qa-1",
        "xsum": "d7",
        "iwslt": "iwslt-1",
        "mt_bench": "q5",
        "alpaca": "alpaca-1",
    }
    assert f"query {ids[fmt]} " in info.value.problem


def test_many_empty_records_are_counted(tmp_path):
    path = tmp_path / "q.jsonl"
    path.write_text("".join(json.dumps({"question": "", "answer": "#### 1"}) + "\n" for _ in range(3)))
    with pytest.raises(
        SpecbenchError, match=r"q.jsonl:1: .* gsm8k-0 has an empty question \(and 2 more such records\)"
    ):
        read_source("gsm8k", {"format": "gsm8k", "path": str(path)})


# -- a source that the filters empty -----------------------------------------------------------


def test_categories_and_offset_that_empty_a_source_are_refused():
    cfg = composed("eval", "dataset.categories=[writing]", "dataset.offset=3").dataset
    with pytest.raises(SpecbenchError) as info:
        load_dataset_config(cfg)
    assert info.value.problem == (
        "dataset source 'chat' yields no queries: it has 1 record in "
        "dataset.categories=['writing'] and dataset.offset=3 skips it"
    )
    assert "dataset.offset below 1" in info.value.fix and "dataset.sources.chat=null" in info.value.fix
    # the same offset without the filter, and the filter without the offset: every source yields queries
    assert {q.task for q in load_dataset_config(composed("eval", "dataset.offset=3").dataset)} == {
        "translation",
        "summarization",
        "math",
        "chat",
        "code",
    }
    assert {
        q.task for q in load_dataset_config(composed("eval", "dataset.categories=[writing]").dataset)
    } == {"translation", "summarization", "math", "chat", "code"}


def test_an_offset_past_one_source_is_refused(tmp_path):
    short = tmp_path / "short.jsonl"
    short.write_text(json.dumps({"question": "1+1?", "answer": "#### 2"}) + "\n")
    cfg = composed("eval", "dataset.offset=2", f"dataset.sources.math.path={short}").dataset
    with pytest.raises(
        SpecbenchError,
        match=r"dataset source 'math' yields no queries: it has 1 record and "
        r"dataset.offset=2 skips it",
    ):
        load_dataset_config(cfg)


def test_categories_that_only_another_source_has_are_refused(tmp_path):
    other = tmp_path / "other.jsonl"
    other.write_text(json.dumps({"question_id": 9, "category": "coding", "turns": ["write code"]}) + "\n")
    cfg = composed(
        "eval", "dataset.categories=[writing]", f"+dataset.sources.more={{format: mt_bench, path: '{other}'}}"
    )
    with pytest.raises(
        SpecbenchError,
        match=r"dataset source 'more' yields no queries: none of its 1 records? is in "
        r"dataset.categories=\['writing'\]",
    ):
        load_dataset_config(cfg.dataset)


# -- confidence_threshold: a probability -------------------------------------------------------


@pytest.mark.parametrize("value", [2, -0.1, 1.5])
def test_a_confidence_threshold_outside_0_1_is_refused(value):
    with pytest.raises(
        SpecbenchError,
        match=rf"pool.drafters.quantized.confidence_threshold={value}: "
        r"expected a finite number in \[0, 1\]",
    ):
        validate(composed("eval", "pool=tiny", f"pool.drafters.quantized.confidence_threshold={value}"))
    for build in (
        lambda: ModelDrafter("q", None, 10, 0.1, confidence_threshold=value),
        lambda: EagleDrafter("q", None, None, None, 0.0, confidence_threshold=value),
    ):
        with pytest.raises(
            SpecbenchError, match=r"drafter 'q': confidence_threshold=.* is not a probability in \[0, 1\]"
        ):
            build()


def test_confidence_thresholds_in_0_1_pass():
    for value in (0, 0.0, 0.5, 1):
        assert check_confidence_threshold(value, "q") == float(value)
    validate(composed("eval", "pool=tiny", "pool.drafters.quantized.confidence_threshold=0.3"))
    with pytest.raises(SpecbenchError):
        check_confidence_threshold(float("nan"), "q")


# -- an experiment under the command it is written for -----------------------------------------


@pytest.mark.parametrize("name", experiments())
def test_every_experiment_declares_its_commands(name):
    """Each experiment's ``commands`` key matches the commands the config tests compose it for."""
    declared = experiment_commands(name)
    assert declared, f"conf/experiment/{name}.yaml has no commands key"
    assert [c.replace("-", "_") for c in declared] == commands_for(name)
    for command in declared:
        check_experiment_command(name, command.replace("-", "_"))


@pytest.mark.parametrize(
    "name, command, right",
    [
        ("cascades_cpu", "eval", "cascades"),
        ("cascades_cpu", "collect", "cascades"),
        ("metasd_cpu", "cascades", "eval"),
        ("huang_cpu", "cascades", "collect"),
        ("drafter_vicuna68m_qa", "eval", "train-drafter"),
        ("metasd_cpu", "train_policy", "eval"),
    ],
)
def test_an_experiment_under_another_command_is_refused(name, command, right):
    with pytest.raises(
        SpecbenchError, match=f"experiment '{name}' is written for .*, not {command.replace('_', '-')}"
    ) as info:
        check_experiment_command(name, command)
    assert f"`specbench {right} experiment={name} ...`" in info.value.fix


def test_no_experiment_or_an_unknown_one_is_not_checked_here():
    check_experiment_command(None, "eval")
    check_experiment_command("no_such_experiment", "eval")  # Hydra names a missing experiment itself


# -- the model cache ---------------------------------------------------------------------------


@pytest.fixture
def no_conversion(monkeypatch):
    def convert(pkg_dir, tmp):
        raise AssertionError("the embedded model was converted")

    monkeypatch.setattr(store, "convert_smollm2", convert)


@pytest.mark.parametrize("where", ["file/cache", "file"])
def test_an_unwritable_cache_is_named_with_its_own_fix(tmp_path, monkeypatch, no_conversion, where):
    (tmp_path / "file").write_text("not a directory")
    monkeypatch.setenv("SPECBENCH_CACHE", str(tmp_path / where))
    with pytest.raises(SpecbenchError) as info:
        store.smollm2_dir()
    assert info.value.problem.startswith(f"cannot write the model cache {tmp_path / where}")
    assert (
        "SPECBENCH_CACHE=<a writable directory>" in info.value.fix and "hydra.run.dir" not in info.value.fix
    )


def test_a_write_that_fails_during_the_conversion_names_the_cache(tmp_path, monkeypatch):
    import errno

    def convert(pkg_dir, tmp):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(tmp / "model.safetensors"))

    monkeypatch.setattr(store, "convert_smollm2", convert)
    monkeypatch.setenv("SPECBENCH_CACHE", str(tmp_path / "cache"))
    with pytest.raises(
        SpecbenchError, match="cannot write the model cache .*No space left on device"
    ) as info:
        store.smollm2_dir()
    assert "SPECBENCH_CACHE=" in info.value.fix
    assert not [
        p for p in (tmp_path / "cache").iterdir() if p.name.startswith(".smollm2-")
    ]  # its temp dir went


def dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_a_conversion_removes_the_temporary_directories_of_killed_ones(tmp_path, monkeypatch):
    cache = tmp_path / "cache"
    cache.mkdir()
    host = socket.gethostname()
    dead = cache / f".smollm2-{host}-{dead_pid()}-k1ll3d__"
    old = cache / ".smollm2-ab3_x9yz"  # an older version's name (no pid), two hours old
    live = cache / f".smollm2-{host}-{os.getpid()}-running_"  # a conversion running now: kept
    young = cache / ".smollm2-q7w8e9r0"  # no pid, a minute old: may be running, kept
    other = cache / "drafters"  # the rest of the cache is never touched
    for d in (dead, old, live, young, other):
        d.mkdir()
        (d / "model.safetensors").write_bytes(b"x" * 1000)
    two_hours_ago = time.time() - 2 * 3600
    os.utime(old, (two_hours_ago, two_hours_ago))
    made = []

    def convert(pkg_dir, tmp):  # the tiny stand-in for the ~20 s conversion
        made.append(tmp)
        assert not dead.exists() and not old.exists(), "stale directories are removed before converting"
        (tmp / "config.json").write_text("{}")
        (tmp / "model.safetensors").write_bytes(b"weights")

    monkeypatch.setattr(store, "convert_smollm2", convert)
    monkeypatch.setenv("SPECBENCH_CACHE", str(cache))
    out = store.smollm2_dir()
    assert out == cache / "smollm2-135m-instruct" and (out / "model.safetensors").read_bytes() == b"weights"
    assert sorted(p.name for p in cache.iterdir()) == sorted([live.name, young.name, other.name, out.name])
    # the conversion's own temporary directory carries this host and pid, so a kill -9 of it is recognized later
    assert made[0].name.startswith(f".smollm2-{host}-{os.getpid()}-")
    assert store.smollm2_dir() == out and len(made) == 1  # converted once


def test_remove_stale_conversions_by_age_and_owner(tmp_path):
    host = socket.gethostname()
    elsewhere = (
        tmp_path / f".smollm2-another-host-{dead_pid()}-abcdefgh"
    )  # another host's pid means nothing here
    elsewhere.mkdir()
    assert store.remove_stale_conversions(tmp_path) == []
    assert store.remove_stale_conversions(tmp_path, now=time.time() + 2 * 3600) == [elsewhere]
    mine = tmp_path / f".smollm2-{host}-{os.getpid()}-abcdefgh"
    mine.mkdir()
    assert store.remove_stale_conversions(tmp_path) == [] and mine.exists()
    assert store.remove_stale_conversions(tmp_path / "missing") == []


# -- a damaged head checkpoint -----------------------------------------------------------------


@pytest.mark.parametrize(
    "name, content",
    [
        ("model.safetensors", random.Random(0).randbytes(600)),
        ("model.safetensors", b""),
        ("model.safetensors", b'\x10\x00\x00\x00\x00\x00\x00\x00{"a": '),  # a torn header
        ("pytorch_model.bin", random.Random(1).randbytes(600)),
        ("pytorch_model.bin", random.Random(2).randbytes(600)),
        ("pytorch_model.bin", b"PK\x03\x04" + random.Random(3).randbytes(100)),  # a torn zip
    ],
)
def test_a_damaged_head_file_is_named(tmp_path, name, content):
    (tmp_path / name).write_bytes(content)
    with pytest.raises(SpecbenchError) as info:
        load_state(tmp_path)
    assert info.value.problem.startswith(f"draft head file {tmp_path / name} cannot be read (")
    assert "train-drafter" in info.value.fix


@pytest.mark.parametrize("config", ['{"specbench": ', "[1, 2]", b"\xff\xfe"])
def test_a_damaged_head_config_is_named(tmp_path, config):
    path = tmp_path / "config.json"
    path.write_bytes(config if isinstance(config, bytes) else config.encode())
    with pytest.raises(SpecbenchError, match=f"draft head file {path} cannot be read"):
        load_head(str(tmp_path), target=None)


def test_two_experiments_are_refused_and_experiment_null_is_the_default():
    """issue 34: Hydra kept the last of two experiments without a word; ``experiment=null`` was a Hydra ValueError."""
    from specbench.configs import hydra_overrides

    with pytest.raises(SpecbenchError, match="2 experiments given \\(metasd_cpu, huang_cpu\\)"):
        hydra_overrides(["+experiment=metasd_cpu", "+experiment=huang_cpu"])
    with pytest.raises(SpecbenchError, match="2 experiments given"):
        hydra_overrides(["experiment=metasd_cpu", "++experiment=huang_cpu"])
    assert hydra_overrides(["+experiment=metasd_cpu", "seed=1"]) == ["experiment=metasd_cpu", "seed=1"]
    assert hydra_overrides(["experiment=null", "seed=1"]) == ["seed=1"]


def test_atomically_replaced_files_keep_the_umask_mode(tmp_path):
    """issue 34: files written through atomic_path were 0600 (mkstemp), unreadable in a shared outputs directory."""
    from specbench.files import atomic_write_text, current_umask

    atomic_write_text(tmp_path / "summary.md", "x")
    assert (tmp_path / "summary.md").stat().st_mode & 0o777 == 0o666 & ~current_umask()


def test_a_bad_heads_variable_or_a_mistyped_head_names_the_real_fix(tmp_path, monkeypatch):
    """issue 34: both were told to rebuild the package's heads with `make specialists` (99 minutes, and it writes
    specbench/heads, not the directory the variable names)."""
    from specbench.drafters import shipped

    monkeypatch.delenv("SPECBENCH_HEADS", raising=False)
    assert set(shipped.shipped_names()) == set(shipped.SHIPPED_NAMES)  # the list the refusal trusts
    with pytest.raises(SpecbenchError, match="no shipped draft head package:eagle_mth") as err:
        shipped.resolve_package("package:eagle_mth", "make specialists")
    assert "did you mean package:eagle_math" in err.value.fix and "make specialists" not in err.value.fix
    monkeypatch.setenv("SPECBENCH_HEADS", str(tmp_path / "nope"))
    with pytest.raises(SpecbenchError, match=r"\$SPECBENCH_HEADS=.*nope \(no such directory\)") as err:
        shipped.resolve_package("package:eagle_math", "make specialists")
    assert "unset SPECBENCH_HEADS" in err.value.fix and "make specialists" not in err.value.fix


def test_a_dataset_path_that_is_a_pipe_or_a_directory_is_named_as_such(tmp_path):
    """issue 34: a FIFO given as dataset.path was said not to exist."""
    from specbench.tasks.files import resolve_path

    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    with pytest.raises(SpecbenchError, match="is not a regular file"):
        resolve_path(str(fifo))
    with pytest.raises(SpecbenchError, match="is a directory"):
        resolve_path(str(tmp_path))
    with pytest.raises(SpecbenchError, match="does not exist"):
        resolve_path(str(tmp_path / "nope.jsonl"))


def test_file_system_failures_map_to_one_error_and_fix():
    """issue 34: write() errors carry no file name and torch.save wraps ENOSPC in a RuntimeError, so a full disk was
    a traceback; path errors were mapped only at the doors reported."""
    import errno as errno_

    from specbench.cli import os_failure

    full = os_failure(OSError(errno_.ENOSPC, "No space left on device"), "write it elsewhere")
    assert (
        "no space left on the device" in full.problem
        and "free some space" in full.fix
        and "resumes" in full.fix
    )
    try:
        try:
            raise OSError(errno_.EDQUOT, "Disk quota exceeded")
        except OSError as inner:
            raise RuntimeError(
                "[enforce fail at inline_container.cc:603] . unexpected pos 64 vs 0"
            ) from inner
    except RuntimeError as wrapped:
        assert "no space left" in os_failure(wrapped, "x").problem  # found through the cause
    torch_full = os_failure(
        RuntimeError("[enforce fail at inline_container.cc:603] . unexpected pos 64 vs 0"), "x"
    )
    assert "checkpoint write failed" in torch_full.problem and "full" in torch_full.problem
    missing = os_failure(
        FileNotFoundError(errno_.ENOENT, "No such file or directory", "/nope/x"), "elsewhere"
    )
    assert missing.problem == "No such file or directory: /nope/x" and "elsewhere" in missing.fix
    a_dir = os_failure(IsADirectoryError(errno_.EISDIR, "Is a directory", "run/.specbench.yaml"), "elsewhere")
    assert a_dir.problem == "Is a directory: run/.specbench.yaml"
    assert os_failure(ValueError("not ours"), "x") is None
    assert os_failure(RuntimeError("shape mismatch"), "x") is None


def test_a_file_where_a_directory_must_go_is_named(tmp_path):
    import errno as errno_

    from specbench.cli import os_failure

    afile = tmp_path / "afile"
    afile.write_text("x")
    try:
        afile.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        mapped = os_failure(exc, "--root <a directory>")
    assert mapped.problem == f"{afile} is a file, not a directory" and mapped.fix == "--root <a directory>"
    assert (
        os_failure(FileExistsError(errno_.EEXIST, "File exists", str(tmp_path)), "x") is None
    )  # a directory: not ours


def test_a_package_head_of_another_target_points_at_the_heads_variable(tiny_llama_target, monkeypatch):
    """issue 34: `reproduce --scale tiny` on a fresh machine was told to train a tiny head, which cannot help:
    package: heads are read from $SPECBENCH_HEADS (or the package)."""
    from specbench.drafters import eagle

    monkeypatch.delenv("SPECBENCH_HEADS", raising=False)
    with pytest.raises(SpecbenchError, match="was trained for target 'embedded:smollm2_135m'") as err:
        eagle.build(tiny_llama_target, "e", checkpoint="package:eagle_math")
    assert "point SPECBENCH_HEADS at a directory of heads trained for" in err.value.fix


def test_an_encoder_decoder_target_without_a_hard_limit_refuses_a_huge_input_before_allocating():
    """issue 34: a 54k-token question on a T5 target (context_keys: []) tried to allocate 23 GB in the warm-up; the
    T5 target configs now set target.context_limit, which Context applies when the model config sets no limit."""
    from types import SimpleNamespace

    from specbench.decoding.loop import Limits
    from specbench.pipelines.session.prompting import Context

    cfg = composed("eval", "target=tiny_t5")
    assert cfg.target.context_limit == 4096
    ctx = Context.of(
        SimpleNamespace(n_positions=512), list(cfg.target.context_keys), "tiny_t5", cfg.target.context_limit
    )
    ctx.fit("q1", 4000, Limits(max_new_tokens=48), encoder_decoder=True)  # fits
    with pytest.raises(SpecbenchError, match="its prompt has 54,000 tokens.*target.context_limit") as err:
        ctx.fit("q2", 54_000, Limits(max_new_tokens=48), encoder_decoder=True)
    assert "dataset.max_input_tokens" in err.value.fix
    assert Context.of(SimpleNamespace(), [], "m").limit is None  # no key, no bound: unchanged


def test_a_hub_drafter_is_fingerprinted_by_the_snapshot_it_resolved_to():
    """issue 34: hf drafters from the hub carried no fingerprint, so a moved branch resumed the old model's records."""
    from types import SimpleNamespace

    from specbench.drafters.hf import hub_fingerprint

    module = SimpleNamespace(config=SimpleNamespace(_commit_hash="abc123"))
    assert hub_fingerprint("double7/vicuna-68m", module) == "double7/vicuna-68m@abc123"
    assert hub_fingerprint("embedded:tiny_llama_draft", module) is None
    assert hub_fingerprint("double7/vicuna-68m", SimpleNamespace(config=SimpleNamespace())) is None


def test_a_missing_local_head_path_is_not_fetched_from_the_hub(tmp_path):
    """probe (issue 34): a missing directory with more than one slash was tried as a hub id ("check the hub id and
    your network"); it names the missing directory instead, and no download is attempted."""
    from specbench.drafters.head_files import resolve_checkpoint

    with pytest.raises(SpecbenchError) as err:
        resolve_checkpoint(str(tmp_path / "runs" / "no_head"))
    assert (
        "no directory" in err.value.problem
        and "not a hub id" in err.value.problem
        and "hub" not in err.value.fix
    )
