"""The order and the seeds of a run's generations: each (query, method) its own seed (``seed_for``), the methods
of each query rotated so no method always runs first (``rotation``), and the per-run verification settings read
from the config (the tie tolerance of greedy certification, the cascade rule)."""

from __future__ import annotations

from omegaconf import DictConfig

from specbench.decoding.cascade import Cascade
from specbench.decoding.certify import DEFAULT_TOLERANCE, tolerance_for
from specbench.models.devices import dtype_name


def tie_tolerance_of(cfg: DictConfig) -> float:
    """The tie tolerance of the run's target in its (resolved) dtype: ``target.tie_tolerance.<dtype>``,
    else the generic default of that dtype (``certify.DEFAULT_TOLERANCE``)."""
    dtype = dtype_name(cfg.target.get("dtype"), cfg.target.get("device"))
    return tolerance_for(cfg.target.get("tie_tolerance"), dtype, DEFAULT_TOLERANCE.get(dtype, 1.0))


def cascade_of(cfg: DictConfig) -> Cascade | None:
    """The run's cascade rule (``cascade=<rule> cascade.alpha=<a>``); None when the config has none."""
    c = cfg.get("cascade")
    return None if c is None else Cascade(rule=str(c.rule), alpha=float(c.alpha))


def seed_for(seed: int, query_index: int, method_index: int) -> int:
    """The seed of one (query, method) generation: independent of the order methods run in."""
    return (seed * 1_000_003 + query_index * 1_009 + method_index) % (2**63)


def rotation(n: int, index: int) -> list[int]:
    """The order of ``n`` methods for the ``index``-th query: 0 1 2, 1 2 0, 2 0 1, ..."""
    return [(index + j) % n for j in range(n)]
