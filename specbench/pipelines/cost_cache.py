"""The cost-model budget's start-up profile (``selector.costs: profile``): verification seconds ``a + b * nodes`` and
each drafter's drafting seconds a round at each context of a small grid that spans the run's contexts (``run_contexts``:
its shortest prompt to its longest prompt and output), measured on the run's own target, dtype, device, threads and
pool before any timed generation, and cached per machine so that later runs read them instead of measuring again. The
budget interpolates between the grid's contexts and corrects the profile online (``selection/costs.py``).

The cache file is ``$SPECBENCH_CACHE/profiles/budget-<key>.json``; ``<key>`` hashes what the costs depend on: the
machine (device name, threads, torch version), the target (its name, dtype, device) and each drafter (its kind, its
checkpoint fingerprint, its tree shape and draft length). Anything else is another file: a stale profile is never
read. The budget then decides from these numbers alone, reading no clock while it decodes (``selection/budget.py``).
"""

from __future__ import annotations

import hashlib
import json
import logging
import statistics
import time
from collections.abc import Mapping
from dataclasses import dataclass

import torch

from specbench import profiling
from specbench.decoding.drafter import AUTOREGRESSIVE, Drafter
from specbench.decoding.sampling import SamplingParams
from specbench.errors import SpecbenchError
from specbench.files import atomic_write_text
from specbench.models.store import cache_dir
from specbench.models.target import Target
from specbench.pipelines.profile import Readings, cpu_name, measure_drafters, measure_verify, repeat_to
from specbench.timing import Clock

log = logging.getLogger(__name__)

FORMAT = 2  # 2: costs by context (1: one context)
CONTEXT = (
    256  # tokens in the cache before each timed forward without a grid (the first query's prompt, repeated)
)
GRID = 3  # contexts a profile measures: the run's shortest, their geometric mean, the run's longest
NODES = (0, 4, 8, 12, 16, 24)  # verified draft tokens per timed forward
REPEATS, WARMUP = 7, 2


def machine_key(target: Target) -> dict:
    """What any measured cost depends on besides the workload: the target in its dtype, the device, threads, torch,
    transformers, and the forward path (``frontier.ENGINE``: the cache written in place and the attention the target
    runs), so costs measured by another engine are measured again."""
    import transformers

    from specbench.models.frontier import ENGINE

    device = target.device
    return {
        **profiling.identity(target),
        "device_name": torch.cuda.get_device_name(device) if device.type == "cuda" else cpu_name(),
        "threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "engine": ENGINE,
        "attention": getattr(target.model.config, "_attn_implementation", None),
    }


def cost_key(target: Target, pool: Mapping[str, Drafter], draft_length: int) -> dict:
    """What the costs depend on: the machine, the target in its dtype, and each drafter as it drafts."""
    return {
        "format": FORMAT,
        **machine_key(target),
        "drafters": {
            name: {
                "kind": type(d).__name__,
                "fingerprint": getattr(d, "fingerprint", None),
                "tree": repr(getattr(d, "tree", None)),
                "draft_length": d.draft_length or draft_length,
            }
            for name, d in pool.items()
            if d.drafts
        },
    }


def cache_file(key: Mapping, kind: str = "budget"):
    digest = hashlib.sha256(json.dumps(key, sort_keys=True, default=str).encode()).hexdigest()[:16]
    return cache_dir() / "profiles" / f"{kind}-{digest}.json"


def read_cached(path, key: Mapping, parse=None):
    """The costs cached in ``path`` for exactly ``key`` (``parse``d, when given: a damaged value in them is then
    found here, not in the run); None when there are none, or they are unreadable or damaged (measured again, with a
    warning naming the file)."""
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        if data.get("key") == key:
            costs = data["costs"] if parse is None else parse(data["costs"])
            log.info("costs: read from %s (measured %s)", path, data.get("measured_at", "?"))
            return costs
    except (OSError, ValueError, KeyError, AttributeError, TypeError) as exc:
        log.warning("costs: %s is unreadable (%s); measuring again", path, exc)
    except SpecbenchError as exc:
        log.warning("costs: %s holds damaged costs (%s); measuring again", path, exc.problem)
    return None


def budget_costs_of(costs: dict) -> dict:
    """A cached budget profile checked (``selection.budget.fixed_costs``: an ``[a, b]`` and seconds per drafter at
    each context; else refused, so ``read_cached`` measures it again)."""
    from specbench.selection.budget import fixed_costs

    checked = fixed_costs(costs, list(costs["draft"]))
    if not checked["profiled"] or any(x != x for v in checked["verify"] for x in v):
        raise SpecbenchError(f"budget costs {costs!r} are not a measured profile", "measure them again")
    return costs


def run_contexts(shortest: int, longest: int, limit: int | None = None) -> tuple[int, ...]:
    """The profile's grid: ``GRID`` contexts from ``shortest`` to ``longest`` tokens, geometric (the cost of a
    forward is nearly flat at short contexts and grows with the cache), rounded to 16 tokens, within ``limit``
    (the target's positions less a forward's room)."""
    top = max(16, min(longest, limit) if limit else longest)
    low = max(16, min(shortest, top))
    points = [low * (top / low) ** (i / (GRID - 1)) for i in range(GRID)]
    return tuple(sorted({max(16, int(round(p / 16.0)) * 16) for p in points}))


def write_cached(path, key: Mapping, costs: dict, **about) -> None:
    """``costs`` cached in ``path`` under ``key`` (with ``about``: how they were measured); a cache that cannot
    be written costs a measurement next time, nothing else."""
    try:
        atomic_write_text(
            path,
            json.dumps(
                {"key": key, "costs": costs, "measured_at": time.strftime("%Y-%m-%d %H:%M"), **about},
                indent=1,
            ),
        )
    except OSError as exc:
        log.warning("costs: could not cache them in %s (%s)", path, exc)


@dataclass(frozen=True)
class Probe:
    """What the start-up profile is measured on: the run's target and pool as they decode (``draft_length``: the
    loop's, for a drafter without its own), the first query's ``prompt`` (repeated into the timed contexts), the run's
    ``sampling`` and its ``clock``, and the ``contexts`` of the grid (``run_contexts``)."""

    target: Target
    pool: Mapping[str, Drafter]
    prompt: list[int]
    draft_length: int
    sampling: SamplingParams
    clock: Clock
    contexts: tuple[int, ...] = (CONTEXT,)


def profile_key(probe: Probe) -> dict:
    """What a profile depends on: ``cost_key``'s, and the grid of contexts it is measured at."""
    return {**cost_key(probe.target, probe.pool, probe.draft_length), "contexts": list(probe.contexts)}


def startup_costs(probe: Probe) -> dict:
    """``{contexts, verify: [[a, b], ...], draft: {drafter: [seconds a round, ...]}, profiled: true}`` for ``pool``:
    the cached profile of this machine, target, pool and grid, else measured now (seconds) and cached."""
    key = profile_key(probe)
    path = cache_file(key)
    cached = read_cached(path, key, budget_costs_of)
    if cached is not None:
        return cached
    start = time.perf_counter()
    costs = measure_costs(probe)
    log.info(
        "budget costs: measured at start-up in %.1f s at contexts %s (verify %s s + %s s a node); cached in %s",
        time.perf_counter() - start,
        costs["contexts"],
        [round(a, 4) for a, _ in costs["verify"]],
        [round(b, 5) for _, b in costs["verify"]],
        path,
    )
    write_cached(path, key, costs, nodes=list(NODES), repeats=REPEATS)
    return costs


def measure_costs(probe: Probe) -> dict:
    """At each context of ``probe.contexts``: verification seconds over ``NODES`` draft tokens after that many
    tokens of prefill, fitted as ``a + b * n`` (least squares), and each drafter's median seconds a round (sync +
    propose of its draft length)."""
    target, clock = probe.target, probe.clock
    source = repeat_to(probe.prompt, max(probe.contexts) + max(NODES) + 1)
    rng = torch.Generator(device=target.device).manual_seed(0)
    drafting = {n: d for n, d in probe.pool.items() if n != AUTOREGRESSIVE and d.drafts}
    verify, draft = [], {name: [] for name in drafting}
    for context in probe.contexts:
        seconds = measure_verify(target, source, context, [n + 1 for n in NODES], REPEATS, WARMUP, clock)
        verify.append(list(fit_line(list(NODES), seconds)))
        for name, d in drafting.items():
            got = measure_drafters(
                target,
                {name: d},
                source[:context],
                d.draft_length or probe.draft_length,
                probe.sampling,
                rng,
                Readings(REPEATS, WARMUP, clock),
            )[name]
            draft[name].append(got["seconds_per_token"] * max(got["drafted"], 1))
    return {"contexts": list(probe.contexts), "verify": verify, "draft": draft, "profiled": True}


def fit_line(xs: list[float], ys: list[float]) -> tuple[float, float]:
    """Least-squares ``y = a + b x`` with ``a > 0`` and ``b >= 0`` (a forward costs something; a node never saves)."""
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    var = sum((x - mx) ** 2 for x in xs)
    b = max(sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / var, 0.0) if var > 0 else 0.0
    return max(my - b * mx, 1e-6), b
