"""The core every command shares: one ``Session`` per run.

``Session.open(cfg, output_dir)`` makes the run directory (saving the composed config), loads the
queries, the target, the pool and the prompt builder once, and validates the decoding settings;
then the session decodes (``decode``: the one loop, with the run's sampling, limits, EOS ids and
clock), seeds each (query, method) (``rng``), warms up before any timing (``warm_up``), orders the
methods of each query (``rotation``: A B C, B C A, ... so no method always runs first) and writes
records as each generation finishes (``Records``: ``examples.jsonl`` + ``rounds.jsonl``, resumable).
Pipelines hold only what is their own: which generations to run and which table to write.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

import torch
from omegaconf import DictConfig, OmegaConf

from specbench.decoding.cascade import Cascade
from specbench.decoding.drafter import AUTOREGRESSIVE, Drafter
from specbench.decoding.loop import Generation, Limits, decode
from specbench.decoding.sampling import SamplingParams
from specbench.errors import SpecbenchError
from specbench.models import Target, load_model
from specbench.models.loading import LoadedModel
from specbench.records import ExampleRecord, JsonlWriter, read_jsonl, round_row
from specbench.selection import Fixed, Selector
from specbench.tasks import (build_prompt, check_templates, load_dataset_config, load_shots, metrics, render,
                             truncate_fields)
from specbench.timing import Clock

log = logging.getLogger(__name__)


def start_run(cfg: DictConfig, output_dir: str | Path) -> Path:
    """Create the run directory, save the composed config there, apply ``threads``."""
    out = Path(output_dir)
    out.mkdir(parents=True, exist_ok=True)
    OmegaConf.save(cfg, out / "config.yaml")
    if cfg.get("threads"):
        torch.set_num_threads(int(cfg.threads))
    return out


def eos_ids_of(loaded: LoadedModel, extra=()) -> frozenset[int]:
    ids = set()
    for source in (loaded.tokenizer.eos_token_id, getattr(loaded.model.generation_config, "eos_token_id", None)):
        if source is None:
            continue
        ids.update(source if isinstance(source, (list, tuple)) else [source])
    ids.update(int(x) for x in extra or ())
    return frozenset(int(i) for i in ids)


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


def turns_of(query, max_turns: int) -> int:
    return max(1, min(len(query.turns), max_turns)) if query.turns else 1


def example_id(query, turn: int) -> str:
    return query.id if turn == 0 else f"{query.id}/turn{turn + 1}"


@dataclass
class Prompter:
    tokenizer: object
    style: str
    templates: dict
    system: str | None
    shots: list
    chat_template: str | None = None

    def __call__(self, query, turn: int = 0, history=()) -> list[int]:
        return build_prompt(query, self.tokenizer, self.style, self.templates, self.system, turn=turn,
                            history=history, shots=self.shots, chat_template=self.chat_template)

    def user_text(self, query, turn: int) -> str:
        return render(query, self.templates, turn=turn, shots=self.shots if turn == 0 else ())


def alone_target(drafter: Drafter, target: Target) -> Target:
    """A model drafter's own module as a target: decoding it with the autoregressive arm is the drafter's
    greedy generation, through the same loop and clock as every other method."""
    return Target(LoadedModel(model=drafter.standalone_model(), tokenizer=target.tokenizer, name=drafter.name))


@dataclass
class Session:
    cfg: DictConfig
    out: Path
    queries: list
    loaded: LoadedModel
    target: Target
    pool: dict[str, Drafter]
    prompter: Prompter
    sampling: SamplingParams
    limits: Limits
    eos_ids: frozenset[int]
    clock: Clock
    cascade: Cascade | None

    @classmethod
    def open(cls, cfg: DictConfig, output_dir: str | Path, before_load: Callable[[Path], None] | None = None):
        """Make the run directory and load everything a timed run needs, before any timing.

        ``before_load(out)``: a pipeline's own checks of the directory, run before the (slow) load.
        """
        from specbench.drafters import build_pool

        out = start_run(cfg, output_dir)
        if before_load is not None:
            before_load(out)
        dec = cfg.decoding
        sampling = SamplingParams(temperature=float(dec.temperature), top_k=int(dec.top_k), top_p=float(dec.top_p))
        limits = Limits(max_new_tokens=int(dec.max_new_tokens), draft_length=int(dec.draft_length))
        queries = load_dataset_config(cfg.dataset)
        if cfg.target.prompt.templates not in cfg.templates:
            raise SpecbenchError(f"unknown template set '{cfg.target.prompt.templates}'",
                                 f"set target.prompt.templates to one of: {', '.join(cfg.templates)}")
        templates = cfg.templates[cfg.target.prompt.templates]
        shots = load_shots(cfg.dataset, int(cfg.dataset.get("n_shot") or 0))
        # Every record against its template before the (slow) model load and any decoding.
        check_templates(queries, templates, int(cfg.dataset.get("max_turns") or 1), shots)
        log.info("loading target %s", cfg.target.model)
        loaded = load_model(cfg.target.model, dtype=cfg.target.dtype, device=cfg.target.device)
        target = Target(loaded)
        pool = build_pool(target, cfg.pool.get("drafters"))
        queries = [truncate_fields(q, loaded.tokenizer, cfg.dataset.get("max_input_tokens")) for q in queries]
        prompter = Prompter(loaded.tokenizer, cfg.target.prompt.style, templates, cfg.target.prompt.get("system"),
                            shots, cfg.target.prompt.get("chat_template"))
        clock = Clock(target.device, phases=bool(OmegaConf.select(cfg, "timing.phases", default=False)))
        return cls(cfg=cfg, out=out, queries=queries, loaded=loaded, target=target, pool=pool, prompter=prompter,
                   sampling=sampling, limits=limits, eos_ids=eos_ids_of(loaded, dec.get("extra_eos_ids")),
                   clock=clock, cascade=cascade_of(cfg))

    # -- decoding ----------------------------------------------------------------------------
    def rng(self, query_index: int = 0, method_index: int = 0, seed: int | None = None) -> torch.Generator:
        seed = seed_for(int(self.cfg.seed), query_index, method_index) if seed is None else seed
        return torch.Generator(device=self.target.device).manual_seed(seed)

    def decode(self, selector: Selector, prompt_ids: list[int], rng: torch.Generator, *, limits: Limits | None = None,
               query=None, cascade: Cascade | None = None, target: Target | None = None,
               pool: Mapping[str, Drafter] | None = None, sampling: SamplingParams | None = None) -> Generation:
        """The one decode loop with this run's settings (each may be replaced for one call)."""
        return decode(target or self.target, self.pool if pool is None else pool, selector, prompt_ids,
                      sampling=sampling or self.sampling, limits=limits or self.limits, eos_ids=self.eos_ids,
                      rng=rng, clock=self.clock, query=query, cascade=cascade)

    def fixed(self, arm: str, pool: Mapping[str, Drafter] | None = None) -> Fixed:
        return Fixed(list(self.pool if pool is None else pool), arm)

    def alone(self, arm: str) -> Callable[[list[int], torch.Generator, Limits | None], Generation]:
        """``generate(prompt_ids, rng, limits)``: drafter ``arm``'s own greedy generation (no target)."""
        own = alone_target(self.pool[arm], self.target)
        arms = {AUTOREGRESSIVE: self.pool[AUTOREGRESSIVE]}

        def generate(prompt_ids, rng, limits=None):
            return self.decode(Fixed([AUTOREGRESSIVE], AUTOREGRESSIVE), prompt_ids, rng, limits=limits, target=own,
                               pool=arms, sampling=SamplingParams())
        return generate

    def text(self, tokens: list[int]) -> str:
        return self.loaded.tokenizer.decode(tokens, skip_special_tokens=True)

    @property
    def warmup_limits(self) -> Limits | None:
        n = int(self.cfg.warmup.max_new_tokens)
        return Limits(max_new_tokens=n, draft_length=self.limits.draft_length) if n > 0 else None

    def warm_up(self, runs: Iterable[Callable[[list[int], Limits, torch.Generator], object]]) -> None:
        """One short untimed generation per run (``run(prompt_ids, limits, rng)``) on the first query."""
        limits = self.warmup_limits
        if limits is None or not self.queries:
            return
        prompt = self.prompter(self.queries[0])
        for run in runs:
            run(prompt, limits, self.rng(seed=0))


def example_record(query, ex_id: str, method: str, gen: Generation, text: str, reference: str | None,
                   **extra) -> ExampleRecord:
    """The ``examples.jsonl`` record of one finished generation (quality scored against ``reference``)."""
    return ExampleRecord(
        query_id=ex_id, task=query.task, method=method, output_ids=gen.tokens, text=text,
        new_tokens=len(gen.tokens), seconds=gen.seconds, target_calls=gen.target_calls, rounds=len(gen.rounds),
        drafted=gen.drafted, accepted=gen.accepted, switches=gen.switches,
        t_switch=sum(r.t_switch for r in gen.rounds), t_select=sum(r.t_select for r in gen.rounds),
        stop=gen.stop, category=query.category, reference=reference,
        quality=metrics.score(query.kind, text, reference), deferred=gen.deferred, **extra)


class Records:
    """``examples.jsonl`` and ``rounds.jsonl`` of a run directory, appended as generations finish.

    ``done``: the (query id, method) pairs already written (a rerun into the directory skips them).
    """

    def __init__(self, out: Path):
        self.out = Path(out)
        self.done = {(r["query_id"], r["method"]) for r in read_jsonl(self.out / "examples.jsonl")}
        if self.done:
            log.info("resuming: %d finished generations found in %s", len(self.done), self.out)
        self._rounds = self._examples = None

    def __enter__(self):
        self._rounds = JsonlWriter(self.out / "rounds.jsonl")
        self._examples = JsonlWriter(self.out / "examples.jsonl")
        return self

    def __exit__(self, *exc):
        self._rounds.close()
        self._examples.close()

    def write(self, query, ex_id: str, method: str, gen: Generation, text: str, reference: str | None, **extra):
        self._rounds.write_many(round_row(ex_id, query.task, method, r) for r in gen.rounds)
        self._examples.write(example_record(query, ex_id, method, gen, text, reference, **extra))
        self.done.add((ex_id, method))

    def examples(self) -> list[dict]:
        return list(read_jsonl(self.out / "examples.jsonl"))

    def rounds(self) -> list[dict]:
        return list(read_jsonl(self.out / "rounds.jsonl"))
