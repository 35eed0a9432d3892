"""Published numbers (``published.yaml``, one reviewed file): each entry names its paper, table or
figure, setting, row, column, value and source."""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import yaml

from specbench.errors import SpecbenchError

PUBLISHED = Path(__file__).with_name("published.yaml")
REQUIRED = ("paper", "exhibit", "setting", "row", "column", "value", "source")


@dataclass(frozen=True)
class Published:
    paper: str
    exhibit: str
    setting: str
    row: str
    column: str
    value: float
    source: str
    approx: bool = False
    via: str | None = None


def load(path: Path = PUBLISHED) -> list[Published]:
    """Every entry, checked: the required fields present and non-empty, the value a number."""
    entries = yaml.safe_load(Path(path).read_text(encoding="utf-8")) or []
    out = []
    for i, e in enumerate(entries):
        lacking = [k for k in REQUIRED if e.get(k) in (None, "")]
        if lacking:
            raise SpecbenchError(
                f"{path}: entry {i + 1} ({e.get('paper')}/{e.get('exhibit')}) lacks {', '.join(lacking)}",
                "give every published value its paper, exhibit, setting, row, column, value and source",
            )
        try:
            value = float(e["value"])
        except (TypeError, ValueError):
            raise SpecbenchError(
                f"{path}: entry {i + 1} has a non-numeric value {e['value']!r}",
                "write the published number as a number",
            ) from None
        out.append(
            Published(
                **{
                    **{k: str(e[k]) for k in REQUIRED if k != "value"},
                    "value": value,
                    "approx": bool(e.get("approx", False)),
                    "via": e.get("via"),
                }
            )
        )
    return out


def lookup(published: list[Published], paper: str, exhibit: str, row: str, column: str) -> float:
    """The published value at (row, column) of a paper's exhibit, NaN when there is none."""
    for p in published:
        if (p.paper, p.exhibit, p.row, p.column) == (paper, exhibit, row, column):
            return p.value
    return math.nan
