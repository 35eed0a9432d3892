"""The draft heads shipped as package data (specbench/heads): present, small, bf16, the head's own
weights only, and trained with the recipe `make specialists` uses today (a stale head fails here)."""

from __future__ import annotations

import json
import re
import shlex
import subprocess
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from safetensors import safe_open

from specbench.configs import conf_dir
from specbench.drafters import shipped
from specbench.errors import SpecbenchError
from specbench.pipelines.train_drafter import same_signature, signature

ROOT = Path(__file__).resolve().parents[2]
MAX_BYTES = 10.5 * 2**20


def make_commands() -> dict[str, list[str]]:
    """``{head name: train-drafter overrides}`` of the training commands ``make -n specialists`` prints."""
    out = subprocess.run(
        ["make", "-n", "--no-print-directory", "specialists"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    commands = {}
    for part in re.split(r"&&|\n", out):
        words = shlex.split(part)
        if "train-drafter" not in words or "train.generate_only=true" in words:
            continue
        args = words[words.index("train-drafter") + 1 :]
        name = next(a.split("=", 1)[1] for a in args if a.startswith("name="))
        commands[name] = [a for a in args if not a.startswith(("hydra.", "threads="))]
    return commands


COMMANDS = make_commands()


def test_make_specialists_trains_every_shipped_config():
    """Every head a drafter config reads from the package is one `make specialists` trains, code included."""
    package_heads = {
        p.stem for p in Path(conf_dir(), "drafter").glob("eagle_*.yaml") if "package:" in p.read_text()
    }
    assert package_heads == set(COMMANDS) and "eagle_code" in COMMANDS


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_shipped_head_matches_the_current_recipe(name):
    path = Path(str(shipped.heads_dir())) / name
    assert (path / "config.json").exists(), f"{name} is not shipped: run `make specialists`"
    with initialize_config_dir(config_dir=conf_dir(), version_base=None):
        cfg = compose(config_name="train_drafter", overrides=COMMANDS[name])
    recorded = json.loads((path / shipped.RECIPE).read_text())
    # a key added since the head was trained matches at the value that trains as before (LATER_TRAIN_KEYS)
    assert same_signature(recorded, json.loads(json.dumps(signature(cfg)))), (
        f"{name} was trained with another recipe than `make specialists` uses now: rebuild it (make specialists)"
    )


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_shipped_head_is_small_bf16_and_its_own_weights(name):
    path = Path(str(shipped.heads_dir())) / name
    weights = path / "model.safetensors"
    assert weights.stat().st_size <= MAX_BYTES
    with safe_open(str(weights), framework="pt") as f:
        keys = list(f.keys())
        assert keys and all(
            k.startswith(("fc.", "layers.")) or k == "d2t" for k in keys
        )  # no embedding / LM head
        assert {str(f.get_tensor(k).dtype) for k in keys if k != "d2t"} == {"torch.bfloat16"}
    for companion in ("metrics.json", "history.csv", "loss.png", "config.json"):
        assert (path / companion).exists(), f"{name} ships without {companion}"
    meta = json.loads((path / "config.json").read_text())["specbench"]
    assert meta["shipped"]["dtype"] == "bfloat16" and meta["target"] == "embedded:smollm2_135m"


def test_unknown_package_head_is_a_clear_error():
    with pytest.raises(SpecbenchError) as info:
        shipped.resolve_package("package:eagle_nope", "make specialists")
    # issue 34: a mistyped name lists the shipped names (a 99-minute `make specialists` would not make it exist)
    assert "eagle_nope" in info.value.problem and "package:eagle_math" in info.value.problem
    assert "make specialists" not in info.value.fix and "did you mean" in info.value.fix


def test_heads_directory_follows_the_environment(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECBENCH_HEADS", str(tmp_path))
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "config.json").write_text("{}")
    assert shipped.resolve_package("package:mine") == tmp_path / "mine"


def small_command() -> list[str]:
    """The train-drafter overrides `make -n small-drafter` prints (the shipped small drafter's recipe)."""
    out = subprocess.run(
        ["make", "-n", "--no-print-directory", "small-drafter"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    line = next(part for part in re.split(r"&&|\n", out) if "train-drafter" in part)
    words = shlex.split(line)
    return [a for a in words[words.index("train-drafter") + 1 :] if not a.startswith(("hydra.", "threads="))]


def test_shipped_small_drafter_matches_its_recipe_and_ships_its_own_weights_only():
    path = Path(str(shipped.heads_dir())) / "small_general"
    assert (path / "config.json").exists(), "small_general is not shipped: run `make small-drafter`"
    with initialize_config_dir(config_dir=conf_dir(), version_base=None):
        cfg = compose(config_name="train_drafter", overrides=small_command())
    recorded = json.loads((path / shipped.RECIPE).read_text())
    assert same_signature(recorded, json.loads(json.dumps(signature(cfg)))), (
        "small_general was trained with another recipe than `make small-drafter` uses now: rebuild it"
    )
    weights = path / "model.safetensors"
    assert (
        weights.stat().st_size <= 15 * 2**20
    )  # its own layers and norm: the embedding and LM head are the target's
    with safe_open(str(weights), framework="pt") as f:
        keys = list(f.keys())
        assert keys and all(k.startswith(("layers.", "norm.")) or k == "d2t" for k in keys)
        assert {str(f.get_tensor(k).dtype) for k in keys if k != "d2t"} == {"torch.bfloat16"}
    meta = json.loads((path / "config.json").read_text())["specbench"]
    assert meta["kind"] == "small" and meta["shipped"]["dtype"] == "bfloat16"
    assert meta["layers"] == int(cfg.drafter.layers) and meta["target"] == "embedded:smollm2_135m"
