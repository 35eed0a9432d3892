"""The core every command shares: one ``Session`` per run.

``Session.open(cfg, output_dir, files)`` makes the run directory (``run_dir``: refusing one whose records
were made with other settings, then saving the composed config), loads the queries, the target, the pool
and the prompt builder once (``prompting``), and validates the decoding settings and that every prompt fits
in the target's context; then the session decodes (``decode``: the one loop, with the run's sampling,
limits, EOS ids and clock), seeds each (query, method) (``schedule``: ``seed_for``), warms up before any
timing (``warm_up``), orders the methods of each query (``schedule.rotation``: A B C, B C A, ... so no method
always runs first) and writes records as each generation finishes (``run_records.Records``:
``examples.jsonl`` + ``rounds.jsonl``, resumable).
Pipelines hold only what is their own: which generations to run and which table to write.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path

import torch
from omegaconf import DictConfig, OmegaConf

from specbench.decoding.cascade import Cascade
from specbench.decoding.drafter import AUTOREGRESSIVE, Drafter
from specbench.decoding.engine import BatchResult, Job, Player, decode_rows
from specbench.decoding.generation import DecodeSpec, Generation, Limits
from specbench.decoding.sampling import SamplingParams
from specbench.files import files_fingerprint
from specbench.models import Target
from specbench.models.loading import LoadedModel
from specbench.pipelines.session.prompting import (
    CONTEXT_KEYS,
    Context,
    eos_ids_of,
    load_inputs,
    prompt_fingerprint,
)
from specbench.pipelines.session.run_dir import RunFiles, start_run
from specbench.pipelines.session.run_records import Records
from specbench.pipelines.session.schedule import seed_for
from specbench.pipelines.session.settings import cascade_of, check_acceptance, tie_tolerance_of
from specbench.policy.checkpoint import checkpoint_file
from specbench.selection import Fixed, Selector
from specbench.selection.base import context_aware
from specbench.tasks import Prompter
from specbench.timing import Clock
from specbench.validate import Sections

log = logging.getLogger(__name__)


def alone_target(drafter: Drafter, target: Target) -> Target:
    """A model drafter's own module as a target: decoding it with the autoregressive arm is the drafter's
    greedy generation, through the same loop and clock as every other method."""
    return Target(
        LoadedModel(model=drafter.standalone_model(), tokenizer=target.tokenizer, name=drafter.name)
    )


def policy_checkpoint(cfg: DictConfig) -> Path | None:
    """The policy checkpoint file a method of ``cfg`` reads (``selector=policy`` run as ``selector``, or
    ``selector:policy``), when it exists; None otherwise."""
    methods = [str(m) for m in (cfg.get("methods") or [])]
    composed = context_aware(OmegaConf.select(cfg, "selector._target_", default=None))
    if not ((composed and "selector" in methods) or "selector:policy" in methods):
        return None
    ckpt = (
        OmegaConf.select(cfg, "selector.checkpoint", default=None) if composed else None
    ) or OmegaConf.select(cfg, "policy.checkpoint", default=None)
    if not ckpt:
        return None
    path = checkpoint_file(str(ckpt))
    return path if path.is_file() else None


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
    context: Context = Context()
    fit_context: bool = False  # decoding.fit_context: stop at the context's end instead of refusing
    tie_tolerance: float | None = None  # the target's tie tolerance in the run's dtype (decoding/certify.py)

    @classmethod
    def open(
        cls,
        cfg: DictConfig,
        output_dir: str | Path,
        files: RunFiles | None = None,
        command: str | None = None,
        sections: Sections | None = None,
    ):
        """Make the run directory and load everything a timed run needs, before any timing.

        ``files``: the records the pipeline resumes; a directory holding records of other settings
        is refused (or, with the overwrite key, emptied) before anything is loaded
        (:func:`claim_run_dir`); ``command`` (``eval``, ``cascades``, ...) takes the directory for this process
        and command (:func:`lock_run_dir`); ``sections``: the command's own config sections (:func:`start_run`).
        Every query's first prompt is checked against the target's context.
        """
        from specbench.drafters import build_pool

        out = start_run(cfg, output_dir, files, command, sections)
        dec = cfg.decoding
        sampling = SamplingParams(
            temperature=float(dec.temperature),
            top_k=int(dec.top_k),
            top_p=float(dec.top_p),
            acceptance=str(dec.get("acceptance", "full")),
        )
        limits = Limits(max_new_tokens=dec.max_new_tokens, draft_length=dec.draft_length)
        cascade = cascade_of(cfg)
        check_acceptance(sampling, cascade)
        inputs = load_inputs(cfg, cfg.dataset.get("max_input_tokens"))
        queries, loaded, target, prompter = inputs.queries, inputs.loaded, inputs.target, inputs.prompter
        eos_ids = eos_ids_of(loaded, dec.get("extra_eos_ids"), target.vocab_size)
        pool = build_pool(target, cfg.pool.get("drafters"), profile=cfg.get("profile_path"))
        context = Context.of(
            target.config,
            cfg.target.get("context_keys", CONTEXT_KEYS),
            str(cfg.target.model),
            cfg.target.get("context_limit"),
        )
        clock = Clock(target.device, phases=bool(OmegaConf.select(cfg, "timing.phases", default=False)))
        session = cls(cfg=cfg, out=out, queries=queries, loaded=loaded, target=target, pool=pool, prompter=prompter,
                      sampling=sampling, limits=limits, eos_ids=eos_ids, clock=clock, cascade=cascade, context=context,
                      fit_context=bool(dec.get("fit_context", False)), tie_tolerance=tie_tolerance_of(cfg))  # fmt: skip
        session.check_prompts()
        return session

    def drafter_fingerprints(self) -> dict[str, str]:
        """``{arm: fingerprint}`` of the pool's drafters loaded from checkpoint files (eagle heads, hf
        drafters: ``drafter.fingerprint``), and ``policy``: the policy checkpoint a method of the run reads, so a
        record made with a retrained checkpoint is not resumed."""
        out = {a: str(d.fingerprint) for a, d in self.pool.items() if getattr(d, "fingerprint", None)}
        policy = policy_checkpoint(self.cfg)
        if policy is not None:
            out["policy"] = str(files_fingerprint(policy))
        return out

    def records(self, queries=None) -> Records:
        """The run's :class:`Records`, checked against this run's queries (``queries``: a subset of
        them) and drafters; ``overwrite=true`` redoes records whose inputs changed instead of refusing."""
        return Records(
            self.out,
            self.tie_tolerance,
            queries=self.queries if queries is None else queries,
            drafters=self.drafter_fingerprints(),
            overwrite=bool(self.cfg.get("overwrite", False)),
        )

    def check_prompts(self, limits: Limits | None = None) -> None:
        """Refuse, before any decoding, a query whose first prompt and new tokens overrun the context."""
        limits = limits or self.limits
        for query in self.queries:
            self.context.fit(
                query.id, len(self.prompter(query)), limits, self.target.is_encoder_decoder, self.fit_context
            )

    # -- decoding ----------------------------------------------------------------------------
    def rng(self, query_index: int = 0, method_index: int = 0, seed: int | None = None) -> torch.Generator:
        seed = seed_for(int(self.cfg.seed), query_index, method_index) if seed is None else seed
        return torch.Generator(device=self.target.device).manual_seed(seed)

    @property
    def spec(self) -> DecodeSpec:
        """How this run decodes (sampling, limits, EOS ids, clock, cascade rule); a pipeline changes a field
        for one call with ``dataclasses.replace(s.spec, limits=...)``."""
        return DecodeSpec(self.sampling, self.limits, self.eos_ids, self.clock, self.cascade)

    def decode(
        self,
        selector: Selector,
        prompt_ids: list[int],
        rng: torch.Generator,
        spec: DecodeSpec | None = None,
        *,
        query=None,
        target: Target | None = None,
        pool: Mapping[str, Drafter] | None = None,
    ) -> Generation:
        """The one decode loop's batch of one: ``spec`` (default: the run's) with its limits cut to the target's
        context, ``target`` and ``pool`` the run's unless given (a drafter decoding alone, a cascade's two-model
        pool)."""
        job = Job(Player(selector, self.pool if pool is None else pool), list(prompt_ids), query=query)
        return self.decode_rows([job], rng, spec, target=target).generations[0]

    def decode_rows(
        self,
        jobs: list[Job],
        rng: torch.Generator,
        spec: DecodeSpec | None = None,
        *,
        width: int = 1,
        budget=None,
        verifier=None,
        target: Target | None = None,
    ) -> BatchResult:
        """The one decode loop (``engine.decode_rows``) over ``jobs``, at most ``width`` at once: each row's limits
        (the spec's) cut to the target's context on their own (``decoding.fit_context``: a row cut there stops with
        ``context``), each generation fingerprinted with its prompt."""
        spec = spec or self.spec
        target = target or self.target
        fitted = [
            replace(
                job,
                limits=self.context.fit(
                    getattr(job.query, "id", "(unnamed)"),
                    len(job.prompt),
                    spec.limits,
                    target.is_encoder_decoder,
                    self.fit_context,
                ),
            )
            for job in jobs
        ]
        result = decode_rows(target, fitted, spec, rng, width=width, budget=budget, verifier=verifier)
        for gen, job in zip(result.generations, fitted):
            if job.limits is not spec.limits and gen.stop == "length":
                gen.stop = "context"  # cut at the context's end, before max_new_tokens
            gen.prompt_sha = prompt_fingerprint(job.prompt)
        return result

    def fixed(self, arm: str, pool: Mapping[str, Drafter] | None = None) -> Fixed:
        return Fixed(list(self.pool if pool is None else pool), arm)

    def alone(self, arm: str) -> Callable[[list[int], torch.Generator, Limits | None], Generation]:
        """``generate(prompt_ids, rng, limits)``: drafter ``arm``'s own greedy generation (no target)."""
        own = alone_target(self.pool[arm], self.target)
        arms = {AUTOREGRESSIVE: self.pool[AUTOREGRESSIVE]}

        def generate(prompt_ids, rng, limits=None):
            spec = replace(self.spec, sampling=SamplingParams(), limits=limits or self.limits, cascade=None)
            return self.decode(
                Fixed([AUTOREGRESSIVE], AUTOREGRESSIVE), prompt_ids, rng, spec, target=own, pool=arms
            )

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
