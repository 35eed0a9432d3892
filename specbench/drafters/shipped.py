"""Draft heads shipped with the package (``package:<name>`` -> ``specbench/heads/<name>``).

``make specialists`` trains the embedded target's heads into ``$SPECBENCH_CACHE/drafters`` (float32);
``make ship-heads`` exports each with :func:`ship` into ``specbench/heads/<name>``: the head's own
tensors only (``fc.*``, ``layers.*``; the target's embedding and LM head are never stored) cast to
bfloat16 (``d2t`` stays int64), its ``config.json`` (the ``specbench`` entry gains ``shipped``: the stored
dtype and the source checkpoint), ``metrics.json``, ``history.csv``, ``loss.png`` and ``recipe.json`` (the
train-drafter signature it was trained with: the target, the teacher's dtype, the data and every
weight-changing train key). A test compares each shipped recipe with the one ``make specialists`` would
use today, so a stale head is caught. A user's own heads stay in ``$SPECBENCH_CACHE`` (``cache:``).

    python -m specbench.drafters.shipped --summary [HEADS_DIR]   # writes HEADS_DIR/README.md (the table)
    python -m specbench.drafters.shipped SRC_CHECKPOINT_DIR DEST_DIR
"""

from __future__ import annotations

import difflib
import json
import os
import shutil
import sys
from importlib import resources
from pathlib import Path

import torch

from specbench.errors import SpecbenchError, exit_on
from specbench.files import atomic_write_text, existing, save_tensors
from specbench.records import CONFIG_FILE, HISTORY_CSV, METRICS, SIGNATURE, WEIGHTS_FILE

PREFIX = "package:"
COPIED = (METRICS, HISTORY_CSV, "loss.png")
RECIPE = "recipe.json"
SHIPPED_DTYPE = torch.bfloat16


# The heads the make targets ship (make specialists, make small-drafter): a missing one of these is rebuilt by its
# target; any other name is a typo.
SHIPPED_NAMES = (
    "eagle_chat",
    "eagle_code",
    "eagle_general",
    "eagle_math",
    "eagle_summarization",
    "eagle_translation",
    "small_general",
)


def heads_dir() -> Path:
    """Where ``package:`` heads are read from: ``$SPECBENCH_HEADS`` when set (a directory of heads, e.g. a
    set trained for another target), else ``specbench/heads`` of the installed package."""
    if os.environ.get("SPECBENCH_HEADS"):
        return Path(os.environ["SPECBENCH_HEADS"]).expanduser()
    return Path(str(resources.files("specbench"))) / "heads"


def other_target_fix(checkpoint: str, target: str, default: str) -> str:
    """The fix for a head trained for another target: for a ``package:`` head, where package heads are read from
    (training one into the cache cannot help there); else ``default``."""
    if not str(checkpoint).startswith(PREFIX):
        return default
    env = os.environ.get("SPECBENCH_HEADS")
    where = f"$SPECBENCH_HEADS={env}" if env else "the heads shipped with specbench (SmolLM2-135M's)"
    return (
        f"{checkpoint} is read from {where}: point SPECBENCH_HEADS at a directory of heads trained for {target} "
        "under the same names (as tests/conftest.py's write_tiny_shipped makes them), or use that target"
    )


def shipped_names() -> list[str]:
    root = heads_dir()
    return sorted(p.name for p in root.iterdir() if (p / CONFIG_FILE).exists()) if root.is_dir() else []


def resolve_package(name: str, make_target: str | None = None) -> Path:
    """``package:<name>`` -> the shipped head's directory, or a clear error listing the shipped heads."""
    entry = name[len(PREFIX) :]
    path = heads_dir() / entry
    if not (path / CONFIG_FILE).exists():
        names = shipped_names()
        have = ", ".join(PREFIX + n for n in names) or "none"
        env = os.environ.get("SPECBENCH_HEADS")
        if env:  # the variable points elsewhere: rebuilding the package's heads would not help (issue 34)
            where = f"$SPECBENCH_HEADS={env}" + ("" if heads_dir().is_dir() else " (no such directory)")
            raise SpecbenchError(
                f"shipped draft head {name} not found in {where}; heads there: {have}",
                "unset SPECBENCH_HEADS to read the heads shipped with specbench, or point it at a "
                f"directory that holds {entry}/config.json" + (f", or use one of: {have}" if names else ""),
            )
        if entry not in SHIPPED_NAMES and names:  # a mistyped name: rebuilding would not make it either
            close = difflib.get_close_matches(entry, names, n=1)
            raise SpecbenchError(
                f"no shipped draft head {name} (shipped: {have})",
                f"use one of them{f' (did you mean {PREFIX}{close[0]}?)' if close else ''}",
            )
        fix = (
            f"rebuild it with `{make_target}` (it ships the heads it trains)"
            if make_target
            else "train one with `specbench train-drafter` (checkpoint=cache:drafters/<name>)"
        )
        raise SpecbenchError(f"shipped draft head {name} not found in {heads_dir()} (shipped: {have})", fix)
    return path


def ship(src: Path, dst: Path) -> Path:
    """Export the train-drafter checkpoint ``src`` (an eagle head, or a small drafter: its layers and norm) into
    ``dst`` as package data."""
    from safetensors.torch import load_file

    src, dst = Path(src), Path(dst)
    for need in (WEIGHTS_FILE, CONFIG_FILE, SIGNATURE):
        if not (src / need).exists():
            raise SpecbenchError(
                f"{src} has no {need}: not a finished train-drafter checkpoint",
                "run `make specialists` (or specbench train-drafter) to the end first",
            )
    state = load_file(str(src / WEIGHTS_FILE))
    kept = {
        k: (v if k == "d2t" or not v.is_floating_point() else v.to(SHIPPED_DTYPE)).contiguous()
        for k, v in state.items()
        if k.startswith(("fc.", "layers.", "norm.")) or k == "d2t"
    }
    config = json.loads((src / CONFIG_FILE).read_text())
    config.setdefault("specbench", {})["shipped"] = {
        "dtype": str(SHIPPED_DTYPE).removeprefix("torch."),
        "from": src.name,
    }
    dst.mkdir(parents=True, exist_ok=True)
    save_tensors(kept, dst / WEIGHTS_FILE)
    atomic_write_text(dst / CONFIG_FILE, json.dumps(config, indent=1, default=str))
    atomic_write_text(dst / RECIPE, (src / SIGNATURE).read_text())
    for name in COPIED:
        if (src / name).exists():
            shutil.copyfile(src / name, dst / name)
    return dst


def summary(root: Path | None = None) -> str:
    """A markdown table of the shipped heads, read from their ``metrics.json`` and ``config.json``: data,
    epochs, held-out top-1 by draft depth on the head's own task (``eagle_<task>``; the generalist: the
    mean over tasks), expected accepted tokens at draft length 4 there, and mean top-1 on the other tasks."""
    root = Path(root) if root is not None else heads_dir()
    rows = [
        "| head | sequences | learned tokens (answer tokens) | epochs | own-task top-1 by depth 1-5 | "
        "E[accepted] at k=4 | other tasks' top-1 (mean) | weights |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name in sorted(p.name for p in root.iterdir() if (p / METRICS).exists()):
        metrics = json.loads((root / name / METRICS).read_text())
        meta = json.loads((root / name / CONFIG_FILE).read_text()).get("specbench", {})
        tasks = metrics.get("tasks") or {}
        own = name.removeprefix("eagle_")
        mine = [own] if own in tasks else list(tasks)
        # eagle heads: conditional top-1 by draft depth; a small drafter (finetune.agreement): top-1 at depth 1 only
        depth = [
            [
                t["top1_by_depth"][d] if "top1_by_depth" in t else (t["top1"] if d == 0 else None)
                for t in (tasks[m] for m in mine)
            ]
            for d in range(5)
        ]
        depth = [[x for x in xs if x is not None] for xs in depth]
        fmt = lambda xs: f"{sum(xs) / len(xs):.2f}" if xs else "-"  # noqa: E731
        others = [t["top1"] for k, t in tasks.items() if k not in mine]
        size = (root / name / WEIGHTS_FILE).stat().st_size / 2**20
        rows.append(
            f"| `{name}` | {meta.get('train_sequences')} | {meta.get('train_tokens')} "
            f"({meta.get('train_response_tokens')}) | {meta.get('epochs')} | "
            f"{' / '.join(fmt(x) for x in depth)} | {fmt([tasks[m]['expected_accepted'] for m in mine])} | "
            f"{fmt(others)} | {size:.1f} MiB |"
        )
    return "\n".join(rows) + "\n"


SUMMARY_HEADER = """# Shipped draft heads (generated by `make ship-heads`: `python -m specbench.drafters.shipped --summary`)

The embedded target's heads, trained by `make specialists` (the recipe: docs/drafters.md, "How the shipped heads were trained").
Held-out rows only: each task's evaluation-side rows (`eval_sets` of `conf/train_drafter.yaml`), the
target's own greedy answers; top-1 by depth d is conditional (among positions whose drafts 1..d-1
agreed, the share whose depth-d draft agrees too, drafting on the head's own features).

"""


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if args[:1] == ["--summary"]:
        root = Path(args[1]) if len(args) > 1 else heads_dir()
        text = SUMMARY_HEADER + summary(root)
        atomic_write_text(root / "README.md", text)
        print(text)
        return 0
    if len(args) != 2:
        print(__doc__.strip().splitlines()[-1].strip(), file=sys.stderr)
        return 2
    try:
        existing(
            args[0], "the trained head", "train it first (make specialists), or pass its checkpoint directory"
        )
    except SpecbenchError as exc:
        exit_on(exc)
    out = ship(Path(args[0]), Path(args[1]))
    size = (out / WEIGHTS_FILE).stat().st_size / 2**20
    print(f"shipped {args[0]} -> {out} ({size:.1f} MiB)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
