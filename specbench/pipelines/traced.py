"""``collect.trace``: a collection's timed runs replayed from a ``specbench trace`` run instead of decoded.

A collection per query decodes the target (the autoregressive run) and one speculative run per arm: about 8 s a
query on 2 CPUs at 48 tokens with two heads, so Huang et al.'s Fig. 3 sweep (1k-10k training queries) would
take hours. A trace of the same queries holds every arm's greedy acceptance at every output position of the
target's greedy output (``decoding/trace.py``), so each arm's speculative run is its exact replay
(``decoding/replay.py``: the same arm, drafted and accepted tokens as the live greedy run, the time predicted
from the cost curves measured with the trace). The collection then decodes nothing: per query it reads the
target's embedding of the prompt and replays the autoregressive arm and each drafter as fixed arms. Its rows
say ``replayed: true`` in each arm's ``spec``; a drafter's standalone output (ROUGE-L alignment) is not collected,
so policies train on ``reward.alignment=acceptance``.

The trace must be of this collection's target and dtype, hold every arm of its pool, and hold every collected
query with the same prompt (checked by fingerprint), else the collection is refused naming the difference.
"""

from __future__ import annotations

from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from specbench.decoding.loop import Generation, Limits
from specbench.decoding.replay import replay
from specbench.decoding.replay_costs import Costs
from specbench.decoding.trace import QueryTrace
from specbench.errors import SpecbenchError
from specbench.pipelines.session.prompting import example_id, prompt_fingerprint
from specbench.pipelines.trace import load_traces
from specbench.records import CONFIG
from specbench.selection.fixed import Fixed


class TracedRuns:
    """The replayed runs of a trace run directory for one collection (its pool ``arms`` and ``limits``)."""

    def __init__(self, run_dir: str | Path, cfg: DictConfig, arms: list[str], limits: Limits):
        self.dir = Path(run_dir)
        rows, costs = load_traces(self.dir)
        self.costs = Costs.from_dict(costs)
        self._check_target(cfg)
        first = rows[0]
        self.traced_arms = list(first["arms"])
        missing = [a for a in arms if a not in self.traced_arms]
        if missing:
            raise SpecbenchError(
                f"the trace run {self.dir} holds no trace of {', '.join(missing)} (it traced "
                f"{', '.join(self.traced_arms)})",
                "collect with the trace's pool, or trace a pool that holds every arm of this collection",
            )
        traced_tokens = int(first["trace"]["max_new_tokens"])
        if limits.max_new_tokens > traced_tokens:
            raise SpecbenchError(
                f"collect.max_new_tokens={limits.max_new_tokens} is more than the trace's "
                f"{traced_tokens} new tokens",
                f"set collect.max_new_tokens={traced_tokens} (or fewer)",
            )
        self.lengths = {}
        for name, traced in first["lengths"].items():
            own = OmegaConf.select(
                cfg, f"pool.drafters.{name}.draft_length", default=None
            )  # this collection's
            k = int(own or limits.draft_length)
            if name in arms and k > int(traced):
                raise SpecbenchError(
                    f"drafter '{name}' drafts {k} tokens a round; the trace holds {traced}",
                    f"set {f'pool.drafters.{name}.draft_length' if own else 'decoding.draft_length'}"
                    f"={traced} (or fewer), or trace with trace.draft_length={k}",
                )
            self.lengths[name] = min(k, int(traced))
        self.arms, self.limits = arms, limits
        self.rows = {r["query_id"]: r for r in rows}

    def _check_target(self, cfg: DictConfig) -> None:
        saved = self.dir / CONFIG
        if not saved.is_file():
            return
        traced = OmegaConf.load(saved)
        for key in ("target.model", "target.dtype"):
            mine, theirs = OmegaConf.select(cfg, key), OmegaConf.select(traced, key)
            if theirs is not None and str(mine) != str(theirs):
                raise SpecbenchError(
                    f"the trace run {self.dir} was made with {key}={theirs}, this collection has {mine}",
                    f"collect with {key}={theirs}, or trace with this collection's target",
                )

    def generations(self, query, prompt_ids: list[int]) -> dict[str, Generation]:
        """Every arm's replayed greedy run of ``query`` (the autoregressive arm included), keyed by arm."""
        row = self.rows.get(example_id(query, 0))
        if row is None:
            raise SpecbenchError(
                f"query {query.id} is not in the trace run {self.dir} ({len(self.rows)} traced queries)",
                "trace the same dataset selection (dataset.limit, offset, shuffle) as this collection, "
                "or collect fewer queries",
            )
        if row.get("prompt_sha") and row["prompt_sha"] != prompt_fingerprint(prompt_ids):
            raise SpecbenchError(
                f"query {query.id}'s prompt differs from the traced one (templates or "
                "dataset.max_input_tokens changed since the trace)",
                "collect with the trace's dataset and template settings, or trace again",
            )
        qt = QueryTrace.from_dict(row["trace"])
        out = {
            arm: replay(qt, Fixed(self.traced_arms, arm), self.limits, self.costs, self.lengths, query)
            for arm in self.arms
        }
        for gen in out.values():
            gen.prompt_sha = row.get("prompt_sha")
        return out
