"""The batch budget's start-up profile: seconds of one batched target forward by rows and new tokens per row
(``decoding/batch_budget.ForwardCosts``), measured on the run's own target, dtype, device and threads before any
timed generation, and cached per machine like the budget's profile (``pipelines/cost_cache.py``:
``$SPECBENCH_CACHE/profiles/batch-<key>.json``).

How: ``rows`` copies of the first query's prompt (repeated to ``CONTEXT`` tokens) are prefilled once into a
``BatchedLM``; then, for each row count of the grid from the largest down (finished rows leave a batch the same way:
``drop``), each ``q`` of the grid is timed as one ``score`` of ``q`` tokens a row, ``REPEATS`` readings after
``WARMUP``, their order rotated by the repeat, the median kept. The scored slots are masked again (``keep`` of none),
so every reading sees the same context. One reading is one ``Clock.boundary`` pair.
"""

from __future__ import annotations

import logging
import statistics
import time

from specbench.decoding.batch_budget import ForwardCosts
from specbench.models.batched import BatchedLM
from specbench.models.target import Target
from specbench.pipelines.cost_cache import cache_file, machine_key, read_cached, write_cached
from specbench.pipelines.profile import repeat_to
from specbench.pipelines.session.schedule import rotation
from specbench.timing import Clock

log = logging.getLogger(__name__)

FORMAT = 1
CONTEXT = 128  # tokens each row holds before the timed forwards
REPEATS, WARMUP = 3, 1
Q_POINTS = (
    1,
    2,
    3,
    4,
    6,
    8,
    12,
    16,
)  # new tokens a row (the last committed token + the draft), up to the longest


def grid(rows: int, q: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """The row counts (powers of two below ``rows``, and ``rows``) and the ``q`` points (those of ``Q_POINTS`` below
    ``q``, and ``q``) to measure."""
    rows_grid = sorted({r for r in (2**i for i in range(rows.bit_length())) if r < rows} | {rows})
    q_grid = sorted({x for x in Q_POINTS if x < q} | {q})
    return tuple(rows_grid), tuple(q_grid)


def batch_key(target: Target, rows_grid, q_grid) -> dict:
    return {
        "format": FORMAT,
        **machine_key(target),
        "rows": list(rows_grid),
        "q": list(q_grid),
        "context": CONTEXT,
    }


def batch_costs(target: Target, rows: int, q: int, prompt: list[int], clock: Clock) -> ForwardCosts:
    """The forward costs up to ``rows`` rows and ``q`` new tokens a row: cached, else measured now and cached."""
    rows_grid, q_grid = grid(rows, q)
    key = batch_key(target, rows_grid, q_grid)
    path = cache_file(key, "batch")
    cached = read_cached(path, key, ForwardCosts.from_dict)  # a damaged value: measured again, the file named
    if cached is not None:
        return cached
    start = time.perf_counter()
    costs = measure_batch_costs(target, rows_grid, q_grid, prompt, clock)
    log.info(
        "batch costs: measured at start-up in %.1f s (rows %s, q %s: %.4f s at 1 x 1, %.4f s at %d x %d); cached "
        "in %s",
        time.perf_counter() - start,
        list(rows_grid),
        list(q_grid),
        costs(1, 1),
        costs(rows_grid[-1], q_grid[-1]),
        rows_grid[-1],
        q_grid[-1],
        path,
    )
    write_cached(path, key, costs.as_dict(), repeats=REPEATS, warmup=WARMUP)
    return costs


def measure_batch_costs(target: Target, rows_grid, q_grid, prompt: list[int], clock: Clock) -> ForwardCosts:
    """Median seconds of a forward at each (rows, q) of the grid (the module's docstring)."""
    source = repeat_to(prompt, CONTEXT + max(q_grid))
    lm = BatchedLM(target.model, target.vocab_size)
    lm.start([source[:CONTEXT]] * rows_grid[-1])
    seconds: dict[int, list[float]] = {}
    for rows in reversed(rows_grid):
        if rows < lm.rows:
            lm.drop(list(range(rows)))
        readings: list[list[float]] = [[] for _ in q_grid]
        for r in range(WARMUP + REPEATS):
            for i in rotation(len(q_grid), r):
                t0 = clock.boundary()
                lm.score([source[CONTEXT - 1 : CONTEXT - 1 + q_grid[i]]] * rows)
                t = clock.boundary() - t0
                lm.keep([0] * rows)
                if r >= WARMUP:
                    readings[i].append(t)
        seconds[rows] = [statistics.median(x) for x in readings]
    return ForwardCosts(tuple(rows_grid), tuple(q_grid), tuple(tuple(seconds[r]) for r in rows_grid))


__all__ = ["batch_costs", "grid", "measure_batch_costs"]
