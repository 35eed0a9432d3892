"""``specbench trace``: acceptance traces of a pool along the target's greedy output (``decoding/trace.py``), for
``specbench replay`` to judge any selector over them.

In the run directory:

- ``costs.json``: the replay clock's curves, measured first in this process (same dtype, threads, device):
  the target's forward over ``q`` new tokens at each context of ``trace.costs.contexts`` (as
  ``specbench profile`` times them) and each drafter's ``sync`` over ``n`` missed tokens for each ``n`` of
  ``trace.costs.catch_up`` (its catch-up after rounds it did not play);
- ``traces.jsonl``: one line per query, the trace (``QueryTrace.to_dict``) with the pool's arms and draft
  lengths, written as each query finishes and before its ``examples.jsonl`` record (method ``trace``: the
  output, its deciders, certified as eval's are, and the fingerprints). A rerun into the directory resumes
  from ``examples.jsonl``; a record whose query content or drafter checkpoints changed is refused, as
  eval's (``run_records.Records``), and the run's settings (dtype, draft lengths, new tokens) are compared by
  the run directory's door. Trace lines without an example record (a run killed between the two appends)
  are ignored and redone.
Only a conversation's first turn is traced (later turns would need the model's own earlier answers).
"""

from __future__ import annotations

import json
import logging
import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated

from omegaconf import DictConfig
from tqdm.auto import tqdm

from specbench.decoding.drafter import DecodeContext
from specbench.decoding.loop import DecodeSpec
from specbench.decoding.trace import QueryTrace, check_decoder_only, check_greedy, trace, trace_lengths
from specbench.errors import SpecbenchError
from specbench.files import atomic_write_text, existing
from specbench.pipelines.profile import interleaved, measure_trees, measure_verify, profile_dict, repeat_to
from specbench.pipelines.session.core import Session
from specbench.pipelines.session.prompting import example_id, prompt_fingerprint
from specbench.pipelines.session.run_dir import RECORDS, RunFiles
from specbench.records import EXAMPLES, JsonlWriter, read_jsonl, unfinished, write_plan
from specbench.timing import Clock
from specbench.validate import COUNT, boolean, integer, list_of, nested, nonempty_list_of


@dataclass(frozen=True, kw_only=True)
class CostGrid:
    """trace.costs.*: the grid the trace times each arm's cost curves on."""

    contexts: Annotated[list[int], nonempty_list_of(integer(1))]
    q: Annotated[list[int], nonempty_list_of(integer(1))]
    catch_up: Annotated[list[int], list_of(integer(1))]
    repeats: Annotated[int, COUNT]
    warmup: Annotated[int, integer(0)]


@dataclass(frozen=True, kw_only=True)
class TraceSettings:
    """trace.* (conf/trace.yaml holds the defaults)."""

    draft_length: Annotated[
        int | None, integer(1, null=True, note=" (null: each drafter's own draft length)")
    ]
    side_observations: Annotated[bool, boolean()]
    costs: Annotated[CostGrid, nested(CostGrid)]


SECTIONS: dict[str, tuple[type, ...]] = {"trace": (TraceSettings,)}

log = logging.getLogger(__name__)

METHOD = "trace"
COSTS = "costs.json"
TRACES = "traces.jsonl"
FILES = RunFiles(results=(*RECORDS.results, TRACES, COSTS))


def run(cfg: DictConfig, output_dir: str | Path) -> Path:
    s = Session.open(cfg, output_dir, FILES, "trace", SECTIONS)
    spec = DecodeSpec(s.sampling, s.limits, s.eos_ids, s.clock, s.cascade)
    check_greedy(spec)
    check_decoder_only(s.target)
    t = cfg.trace
    lengths = trace_lengths(s.pool, s.limits.draft_length, t.get("draft_length"))
    if not lengths:
        raise SpecbenchError(
            "the pool has no drafter to trace (only the autoregressive arm)",
            "choose a pool with drafters, e.g. pool=smollm2_default",
        )
    records = s.records()
    write_plan(s.out, "trace", [example_id(q, 0) for q in s.queries])  # replay checks the trace is finished
    todo = [(i, q) for i, q in enumerate(s.queries) if (example_id(q, 0), METHOD) not in records.done]
    if todo:
        warm_up(s, lengths)
    if not (s.out / COSTS).exists():
        costs = measure_costs(s, cfg, lengths)
        atomic_write_text(s.out / COSTS, json.dumps(costs, indent=1))
    with (
        records,
        JsonlWriter(s.out / TRACES) as traces,
        tqdm(total=len(todo), desc="trace", unit="query") as bar,
    ):
        for i, query in todo:
            prompt = s.prompter(query)
            limits = s.context.fit(query.id, len(prompt), s.limits, False, s.fit_context)
            qt, gen = trace(
                s.target,
                s.pool,
                prompt,
                DecodeSpec(s.sampling, limits, s.eos_ids, s.clock),
                lengths,
                s.rng(i),
                side_observations=bool(t.get("side_observations", False)),
            )
            gen.prompt_sha = prompt_fingerprint(prompt)
            traces.write(
                {
                    "query_id": example_id(query, 0),
                    "trace": qt.to_dict(),
                    "lengths": lengths,
                    "arms": list(s.pool),
                    "draft_length": s.limits.draft_length,
                    "own_lengths": {n: s.pool[n].draft_length for n in lengths},
                }
            )
            records.write(query, example_id(query, 0), METHOD, gen, s.text(gen.tokens), query.reference)
            bar.update(1)
    write_summary(s.out, lengths)
    return s.out


def warm_up(s: Session, lengths: dict[str, int]) -> None:
    """One short untimed trace of the first query (lazily built state is loaded before anything is timed)."""
    warm = s.warmup_limits
    if warm is None:
        return
    s.target.prefill(s.prompter(s.queries[0]))
    spec = DecodeSpec(s.sampling, warm, s.eos_ids, s.clock)
    trace(s.target, s.pool, s.prompter(s.queries[0]), spec, lengths, s.rng(seed=0))


# -- the cost curves --------------------------------------------------------------------------------


def measure_costs(s: Session, cfg: DictConfig, lengths: dict[str, int]) -> dict:
    """``costs.json``: the target's verification curve (``profile.json``'s layout) and the drafters' catch-up
    curves, in this run's dtype, threads and device."""
    c = cfg.trace.costs
    contexts = sorted({int(x) for x in c.contexts})
    n_up = sorted({int(x) for x in c.catch_up})
    longest_q = max(1 + sum(lengths.values()), *(int(q) for q in c.q))
    qs = sorted({1, *(int(q) for q in c.q), longest_q})
    limit = s.context.limit
    if limit is not None:
        contexts = [x for x in contexts if x + longest_q <= limit] or [max(8, limit - longest_q - 1)]
    repeats, warmup = int(c.repeats), int(c.warmup)
    source = repeat_to(s.prompter(s.queries[0]), contexts[-1] + longest_q + max(n_up, default=1))
    clock = Clock(s.target.device)
    log.info(
        "trace: measuring the target's cost curve (%d contexts x %d q) and %d catch-up points per drafter",
        len(contexts),
        len(qs),
        len(n_up),
    )
    verify = {x: measure_verify(s.target, source, x, qs, repeats, warmup, clock) for x in contexts}
    costs = profile_dict(s.target, qs, contexts, verify, {}, 0, repeats, "prompt")
    costs["catch_up"] = measure_catch_up(
        s, {n: s.pool[n] for n in lengths}, source[: contexts[0]], n_up, repeats, warmup, clock
    )
    costs["tree_extra_s"] = tree_extra(s.target, source, contexts[0], repeats, warmup, clock)
    return costs


TREE_SHAPES = (
    (2, 2),
    (2, 4),
    (3, 4),
)  # [branches, depth] of the trees timed against chains of as many tokens


def tree_extra(target, source: list[int], context: int, repeats: int, warmup: int, clock: Clock) -> float:
    """Median seconds a tree forward (``TREE_SHAPES``, with its attention mask) costs beyond a chain forward over as
    many tokens after ``context`` tokens, averaged over the shapes (>= 0): what the replay adds to a tree round."""
    if target.is_encoder_decoder:
        return 0.0
    trees = measure_trees(target, source, context, list(TREE_SHAPES), repeats, warmup, clock)
    chains = measure_verify(
        target, source, context, [b * d + 1 for b, d in TREE_SHAPES], repeats, warmup, clock
    )
    return max(statistics.fmean(t - c for t, c in zip(trees, chains)), 0.0)


def measure_catch_up(
    s: Session, drafters: dict, context: list[int], ns: list[int], repeats: int, warmup: int, clock: Clock
) -> dict[str, list[list[float]]]:
    """Per drafter, ``[[n, seconds], ...]``: the median time of ``sync`` over the last ``n`` of ``context``'s
    tokens after being synced to the rest (the catch-up a drafter does after ``n`` tokens it did not see)."""
    ns = [n for n in ns if 0 < n < len(context) - 2]
    if not ns:
        return {}
    layers = tuple(sorted({layer for d in drafters.values() for layer in d.state_layers(False)}))
    query = DecodeContext()
    states = s.target.prefill(context, layers=layers).states
    if layers:
        query.record_states(states, rows=len(s.target.tokens) - 1, start=0)
    committed = list(s.target.tokens)
    out: dict[str, list[list[float]]] = {}
    for name, d in drafters.items():
        d.sync(query, committed)  # per-query setup, untimed

        def timed(i: int, d=d) -> float:
            d.sync(query, committed[: len(committed) - ns[i]])
            t0 = clock.boundary()
            d.sync(query, committed)
            return clock.boundary() - t0

        readings = interleaved(len(ns), repeats, warmup, timed)
        out[name] = [[n, statistics.median(r)] for n, r in zip(ns, readings)]
    return out


# -- reading and summarising ------------------------------------------------------------------------


def load_traces(run: str | Path, partial: bool = False) -> tuple[list[dict], dict]:
    """``(records, costs)`` of a trace run directory: each finished query's ``examples.jsonl`` record merged with
    its (last) ``traces.jsonl`` line, in the order of the examples; and ``costs.json``. Without ``partial``, a trace
    that has not finished every query it planned (``plan.json``: stopped, or still running) is refused."""
    run = Path(run)
    existing(run, "the trace run", "point traces= at a `specbench trace` run directory")
    if not run.is_dir():
        raise SpecbenchError(
            f"no trace run directory at {run}", "point traces= at a `specbench trace` run directory"
        )
    path = run / EXAMPLES
    examples = [r for r in read_jsonl(path) if r.get("method") == METHOD] if path.exists() else []
    lines = {r.get("query_id"): r for r in read_jsonl(run / TRACES)} if (run / TRACES).exists() else {}
    records = [{**e, **lines[e["query_id"]]} for e in examples if e["query_id"] in lines]
    if not records:
        from specbench.pipelines.session.run_dir import run_command

        owner = run_command(run)
        if owner and owner != "trace":  # tracing into it would be refused: it is that command's directory
            raise SpecbenchError(
                f"{run} is a `specbench {owner}` run directory, not a trace",
                "trace into a new directory (specbench trace hydra.run.dir=<new dir> ...) and point "
                "traces= at it",
            )
        raise SpecbenchError(
            f"{run} holds no finished trace (examples.jsonl and traces.jsonl of `specbench trace`)",
            f"point traces= at a `specbench trace` run directory (it holds traces.jsonl), or trace into "
            f"it first: specbench trace hydra.run.dir={run} ...",
        )
    missing = [] if partial else unfinished(run, (r["query_id"] for r in records))
    if missing:
        raise SpecbenchError(
            f"{run} holds {len(records)} of the {len(records) + len(missing)} queries its trace planned "
            f"(missing {', '.join(missing[:3])}{', ...' if len(missing) > 3 else ''}): it stopped "
            "early or is still running",
            f"finish it (rerun the same trace into {run}: it resumes), or replay the finished queries "
            "with replay.partial=true",
        )
    costs_path = run / COSTS
    if not costs_path.exists():
        raise SpecbenchError(
            f"{costs_path} is missing: the trace run stopped before measuring its cost curves",
            f"rerun the trace into {run} (it resumes)",
        )
    return records, json.loads(costs_path.read_text())


def write_summary(out: Path, lengths: dict[str, int]) -> None:
    """trace.md: positions traced and the cost of tracing per drafter (seconds per 1,000 positions)."""
    rows, _ = load_traces(out, partial=True)  # the trace's own summary, finished or not
    traces = [QueryTrace.from_dict(r["trace"]) for r in rows]
    positions = sum(t.positions for t in traces)
    seconds = sum(r["seconds"] for r in rows)
    lines = [
        f"# specbench trace: {len(rows)} queries, {positions:,} positions",
        "",
        f"Wall time {seconds:.1f} s ({1000 * seconds / max(positions, 1):.1f} s per 1,000 positions, every drafter "
        "and the tree forward included).",
        "",
        "| drafter | trace length | mean accepted | propose s / 1,000 positions |",
        "|---|---:|---:|---:|",
    ]
    for name, k in lengths.items():
        acc = [a for t in traces for a in t.drafters[name].accepted]
        prop = sum(sum(t.drafters[name].t_propose) for t in traces)
        lines.append(
            f"| {name} | {k} | {statistics.fmean(acc) if acc else 0:.2f} | {1000 * prop / max(positions, 1):.2f} |"
        )
    drafting = sum(sum(sum(d.t_propose) for d in t.drafters.values()) for t in traces)
    lines += [
        "",
        f"The rest, {1000 * (seconds - drafting) / max(positions, 1):.1f} s per 1,000 positions, is the target's "
        "tree forward over every draft at each position (and the prefills, syncs and bookkeeping).",
    ]
    atomic_write_text(out / "trace.md", "\n".join(lines) + "\n")
    print("\n".join(lines))
