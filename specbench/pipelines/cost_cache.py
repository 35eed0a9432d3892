"""The cost-model budget's start-up profile (``selector.costs: profile``): verification seconds ``a + b * nodes`` and
each drafter's drafting seconds a round, measured on the run's own target, dtype, device, threads and pool before any
timed generation, and cached per machine so that later runs read them instead of measuring again.

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

FORMAT = 1
CONTEXT = 256  # tokens in the cache before each timed forward (the first query's prompt, repeated)
NODES = (0, 4, 8, 12, 16, 24)  # verified draft tokens per timed forward
REPEATS, WARMUP = 7, 2


def machine_key(target: Target) -> dict:
    """What any measured cost depends on besides the workload: the target in its dtype, the device, threads, torch."""
    device = target.device
    return {
        **profiling.identity(target),
        "device_name": torch.cuda.get_device_name(device) if device.type == "cuda" else cpu_name(),
        "threads": torch.get_num_threads(),
        "torch": torch.__version__,
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
    """A cached budget profile checked: ``verify`` two numbers, ``draft`` a number per drafter (else refused, so
    ``read_cached`` measures it again)."""
    verify = [float(x) for x in costs["verify"]]
    draft = {str(k): float(v) for k, v in costs["draft"].items()}
    if len(verify) != 2 or not all(x == x and x >= 0 for x in [*verify, *draft.values()]):
        raise SpecbenchError(
            f"budget costs {costs!r} are not [a, b] and seconds per drafter", "measure them again"
        )
    return {**costs, "verify": verify, "draft": draft}


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
    loop's, for a drafter without its own), the first query's ``prompt`` (repeated into the timed context), the run's
    ``sampling`` and its ``clock``."""

    target: Target
    pool: Mapping[str, Drafter]
    prompt: list[int]
    draft_length: int
    sampling: SamplingParams
    clock: Clock


def startup_costs(probe: Probe) -> dict:
    """``{verify: [a, b], draft: {drafter: seconds a round}}`` for ``pool``: the cached profile of this machine,
    target and pool, else measured now (a few seconds) and cached."""
    key = cost_key(probe.target, probe.pool, probe.draft_length)
    path = cache_file(key)
    cached = read_cached(path, key, budget_costs_of)
    if cached is not None:
        return cached
    start = time.perf_counter()
    costs = measure_costs(probe)
    log.info(
        "budget costs: measured at start-up in %.1f s (verify %.4f s + %.5f s a node; draft %s); cached in %s",
        time.perf_counter() - start,
        *costs["verify"],
        ", ".join(f"{k} {v:.4f} s" for k, v in costs["draft"].items()),
        path,
    )
    write_cached(path, key, costs, context=CONTEXT, nodes=list(NODES), repeats=REPEATS)
    return costs


def measure_costs(probe: Probe) -> dict:
    """Verification seconds over ``NODES`` draft tokens after a ``CONTEXT``-token prefill, fitted as ``a + b * n``
    (least squares), and each drafter's median seconds a round (sync + propose of its draft length)."""
    target, clock = probe.target, probe.clock
    source = repeat_to(probe.prompt, CONTEXT + max(NODES) + 1)
    seconds = measure_verify(target, source, CONTEXT, [n + 1 for n in NODES], REPEATS, WARMUP, clock)
    a, b = fit_line(list(NODES), seconds)
    rng = torch.Generator(device=target.device).manual_seed(0)
    draft = {}
    for name, d in probe.pool.items():
        if name == AUTOREGRESSIVE or not d.drafts:
            continue
        got = measure_drafters(
            target,
            {name: d},
            source[:CONTEXT],
            d.draft_length or probe.draft_length,
            probe.sampling,
            rng,
            Readings(REPEATS, WARMUP, clock),
        )[name]
        draft[name] = got["seconds_per_token"] * max(got["drafted"], 1)
    return {"verify": [a, b], "draft": draft}


def fit_line(xs: list[float], ys: list[float]) -> tuple[float, float]:
    """Least-squares ``y = a + b x`` with ``a > 0`` and ``b >= 0`` (a forward costs something; a node never saves)."""
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    var = sum((x - mx) ** 2 for x in xs)
    b = max(sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / var, 0.0) if var > 0 else 0.0
    return max(my - b * mx, 1e-6), b
