"""The order and the seeds of a run's generations: each (query, method) its own seed (``seed_for``), the methods
of each query rotated so no method always runs first (``rotation``)."""

from __future__ import annotations


def seed_for(seed: int, query_index: int, method_index: int) -> int:
    """The seed of one (query, method) generation: independent of the order methods run in."""
    return (seed * 1_000_003 + query_index * 1_009 + method_index) % (2**63)


def rotation(n: int, index: int) -> list[int]:
    """The order of ``n`` methods for the ``index``-th query: 0 1 2, 1 2 0, 2 0 1, ..."""
    return [(index + j) % n for j in range(n)]
