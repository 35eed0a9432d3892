"""The reproduced tables and figures, declared once each (``ExhibitSpec``), in report order.

An exhibit owns its key (where its files go), its builder (which lays our numbers out as the paper does, sets the
published ones beside them and judges the paper's claims on per-query paired data: ``verdicts``), the runs it reads
(``runs.py``: directory, command, overrides per scale) and the published values it shows. A scale's report holds the
exhibits whose runs all run at that scale, and its ``specbench reproduce`` plan is derived from those runs
(:func:`plan_at`), so adding an exhibit is one object here; ``RUNS``, every run of the reproduction, is derived from
them too. A builder whose runs are missing is skipped and listed
as not run; one built on an unfinished run says so and judges none of its claims (``mark_unfinished``).
"""

from __future__ import annotations

from specbench.reproduction import (
    cascade_exhibits,
    huang,
    metasd,
    metasd_rounds,
    multi_drafter,
    noise,
    spec_bench,
)
from specbench.reproduction.exhibit import ExhibitSpec, Layout
from specbench.reproduction.runs import Run, Step, in_order, steps_at

EXHIBITS: tuple[ExhibitSpec, ...] = (
    spec_bench.LEADERBOARD,
    *huang.EXHIBITS,
    metasd.MAIN,
    metasd.SEED_LIVE,
    noise.AA,
    metasd.WHITEBOX,
    metasd.HEADS,
    metasd_rounds.BANDIT_ALGORITHMS,
    metasd_rounds.VARIANCE,
    metasd_rounds.CONVERGENCE,
    metasd_rounds.FULL_INFO,
    metasd.SWITCHING,
    metasd.STREAM,
    metasd.MULTILINGUAL,
    multi_drafter.TREES,
    *cascade_exhibits.EXHIBITS,
)


def runs_of(exhibits: tuple[ExhibitSpec, ...]) -> tuple[Run, ...]:
    """Every run ``exhibits`` read and every upstream run those read, in declaration order (upstream runs first)."""
    found: list[Run] = []
    todo = [r for spec in exhibits for r in spec.runs]
    while todo:
        run = todo.pop()
        if run not in found:
            found.append(run)
            todo.extend(run.reads)
    return in_order(found)


RUNS: tuple[Run, ...] = runs_of(EXHIBITS)  # every run directory of `specbench reproduce`, in plan order


def specs_at(scale: str, exhibits: tuple[ExhibitSpec, ...] | None = None) -> list[ExhibitSpec]:
    """The exhibits of ``scale``'s report (every one of their runs runs at that scale), in report order."""
    return [spec for spec in (EXHIBITS if exhibits is None else exhibits) if spec.at(scale)]


def builders(lay: Layout, exhibits: tuple[ExhibitSpec, ...] | None = None) -> list:
    """The layout's exhibits in report order, each ``(root, published) -> Exhibit``."""
    return [lambda root, pub, spec=spec: spec(root, pub, lay) for spec in specs_at(lay.name, exhibits)]


def plan_at(scale: str, exhibits: tuple[ExhibitSpec, ...] | None = None) -> tuple[Step, ...]:
    """The ``specbench reproduce`` plan of ``scale``: every run its exhibits read, upstream runs first."""
    return steps_at([r for spec in specs_at(scale, exhibits) for r in spec.runs], scale)
