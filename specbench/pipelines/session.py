"""The core every command shares: one ``Session`` per run.

``Session.open(cfg, output_dir, files)`` makes the run directory (refusing one whose records were
made with other settings: ``claim_run_dir``; then saving the composed config), loads the queries,
the target, the pool and the prompt builder once, and validates the decoding settings and that every
prompt fits in the target's context; then the session decodes (``decode``: the one loop, with the
run's sampling, limits, EOS ids and clock), seeds each (query, method) (``rng``), warms up before
any timing (``warm_up``), orders the methods of each query (``rotation``: A B C, B C A, ... so no
method always runs first) and writes records as each generation finishes (``Records``:
``examples.jsonl`` + ``rounds.jsonl``, resumable).
Pipelines hold only what is their own: which generations to run and which table to write.
"""

from __future__ import annotations

import datetime
import fcntl
import hashlib
import json
import logging
import os
import socket
import sys
import uuid
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path

import torch
from omegaconf import DictConfig, OmegaConf, open_dict

from specbench.decoding.cascade import Cascade
from specbench.decoding.certify import DEFAULT_TOLERANCE, tolerance_for
from specbench.decoding.drafter import AUTOREGRESSIVE, Drafter
from specbench.decoding.loop import Generation, Limits, decode
from specbench.decoding.sampling import SamplingParams
from specbench.errors import SpecbenchError
from specbench.models import Target, load_model
from specbench.models.loading import AUTO, LoadedModel, auto_dtype, dtype_name, resolve_device
from specbench.records import (EXAMPLE_KEYS, ExampleRecord, JsonlWriter, atomic_path, atomic_write_text, read_jsonl,
                               round_row)
from specbench.selection import Fixed, Selector
from specbench.tasks import (build_prompt, check_templates, load_dataset_config, load_shots, metrics, render,
                             truncate_fields)
from specbench.timing import Clock

log = logging.getLogger(__name__)


# Settings a rerun into a run directory may change, because they change neither the records the run
# writes nor what the records mean: the torch thread count (speed only, and every query's methods
# run back to back under one setting, so per-query comparisons stay fair), the untimed warm-up, the
# run name (where outputs go), the overwrite flags themselves, and which shard a collect process
# takes (each shard writes its own rows file). Hydra's own settings (hydra.*) are not in the config
# a pipeline gets. Every other key is compared: a rerun with any other change is a different run.
NOT_COMPARED = ("threads", "warmup", "run_name", "overwrite", "collect.overwrite", "collect.shard",
                "collect.num_shards")


def settings(cfg) -> dict:
    """The resolved settings of a config (a DictConfig or a plain dict) that a rerun must match:
    everything but :data:`NOT_COMPARED`."""
    tree = OmegaConf.to_container(cfg if OmegaConf.is_config(cfg) else OmegaConf.create(cfg), resolve=True)
    for key in NOT_COMPARED:
        *parents, leaf = key.split(".")
        node = tree
        for part in parents:
            node = node.get(part) if isinstance(node, dict) else None
        if isinstance(node, dict):
            node.pop(leaf, None)
    return tree


UNSET = object()


def changes(old, new, prefix: str = "") -> list[tuple[str, object, object]]:
    """``(dotted key, old value, new value)`` for every setting that differs between two settings
    trees, in the new tree's order; a key whose value is a mapping on both sides is compared key by
    key, anything else (a list, a mapping on one side only) as a whole."""
    if isinstance(old, dict) and isinstance(new, dict):
        keys = list(new) + [k for k in old if k not in new]
        return [c for k in keys for c in changes(old.get(k, UNSET), new.get(k, UNSET), f"{prefix}{k}.")]
    return [] if old == new else [(prefix[:-1], old, new)]


def differences(old: dict, new: dict, limit: int = 10) -> list[str]:
    """``key: old -> new`` for each setting that differs (:func:`changes`): the first ``limit`` with
    their values, then the names of the rest."""
    diff = changes(old, new)
    lines = [f"{k}: {_show(a)} -> {_show(b)}" for k, a, b in diff[:limit]]
    rest = [k for k, _, _ in diff[limit:]]
    return lines + ([f"and {len(rest)} more: {', '.join(rest)}"] if rest else [])


def _show(value, width: int = 48) -> str:
    text = "(unset)" if value is UNSET else json.dumps(value, default=str)
    return text if len(text) <= width else text[: width - 3] + "..."


@dataclass(frozen=True)
class RunFiles:
    """What a resumable pipeline keeps in its run directory: ``results``, globs of the records a
    rerun resumes; ``settings``, the file holding the settings those records were made with; and
    ``overwrite``, the config key that lets a rerun with other settings delete those records."""

    results: tuple[str, ...]
    settings: str = "config.yaml"
    overwrite: str = "overwrite"


def claim_run_dir(out: Path, cfg: DictConfig, files: RunFiles) -> None:
    """Refuse to resume records made with other settings (naming every setting that differs), unless
    the config's ``files.overwrite`` key is true: then delete them. A directory without records
    (new, or a run that stopped before its first one) is always taken."""
    found = [p for pattern in files.results for p in sorted(out.glob(pattern)) if p.is_file()]
    if not any(p.stat().st_size for p in found):
        return
    saved = out / files.settings
    diff = (differences(settings(OmegaConf.load(saved)), settings(cfg)) if saved.exists()
            else [f"(no {files.settings} to compare with)"])
    if not diff:
        return
    if not OmegaConf.select(cfg, files.overwrite, default=False):
        raise SpecbenchError(
            f"{out} holds results of a different config than this run's, so it cannot resume them; differs in: "
            + "; ".join(diff),
            f"rerun with the directory's own settings to resume it, pick a new directory (hydra.run.dir=...), "
            f"or pass {files.overwrite}=true to delete its results ({', '.join(p.name for p in found)})")
    log.warning("%s=true: deleting the results of another config in %s (%s)", files.overwrite, out,
                ", ".join(p.name for p in found))
    for p in found:
        p.unlink()


# eval and cascades: examples.jsonl and rounds.jsonl, resumed by (query id, method) (``Records``).
RECORDS = RunFiles(results=("examples.jsonl", "rounds.jsonl"))


def resolve_target_dtype(cfg: DictConfig) -> None:
    """Replace ``target.dtype`` (``auto``, null or an alias such as ``bf16``) by the dtype it resolves to on
    this machine (:func:`specbench.models.loading.auto_dtype`), so ``config.yaml``, the summaries and the
    checkpoints written from this config name the dtype the run computed in."""
    target = cfg.get("target")
    if not isinstance(target, DictConfig) or "dtype" not in target:
        return
    asked = target.get("dtype")
    name = dtype_name(asked, target.get("device"))
    if asked == AUTO:
        why = auto_dtype(resolve_device(target.get("device")))[1]
        log.info("target.dtype=auto resolves to %s: %s", name, why)
    with open_dict(cfg):
        target.dtype = name


def save_config(cfg, path: Path) -> None:
    """``OmegaConf.save`` through a temporary file and ``os.replace`` (never a torn config)."""
    with atomic_path(path) as tmp:
        OmegaConf.save(cfg, tmp)


def start_run(cfg: DictConfig, output_dir: str | Path, files: RunFiles | None = None,
              command: str | None = None) -> Path:
    """Create the run directory and take it (:func:`lock_run_dir`: one process at a time, one command
    per directory; ``command`` defaults to Hydra's config name), then (with ``files``: after
    :func:`claim_run_dir`) save the composed config there (``target.dtype`` resolved:
    :func:`resolve_target_dtype`; and the settings file of ``files``), apply ``threads``."""
    resolve_target_dtype(cfg)
    out = Path(output_dir)
    if out.exists() and not out.is_dir():
        raise SpecbenchError(f"the run directory {out} is a file", "write the run elsewhere: hydra.run.dir=<a directory>")
    out.mkdir(parents=True, exist_ok=True)
    lock_run_dir(out, command or hydra_command())
    if files is not None:
        claim_run_dir(out, cfg, files)
    save_config(cfg, out / "config.yaml")
    if files is not None and files.settings != "config.yaml":
        save_config(OmegaConf.create(settings(cfg)), out / files.settings)
    if cfg.get("threads"):
        torch.set_num_threads(int(cfg.threads))
    return out


# -- who writes a run directory ----------------------------------------------------------------------

class RunDirTaken(SpecbenchError):
    """A run directory held by another process, or owned by another command (:func:`lock_run_dir`): the
    refused run must leave that directory as it is (not remove it as a run that wrote nothing)."""


CLAIM_FILE = ".specbench.yaml"  # the directory's owner (command) and the process holding it (flock)
_HELD: dict[str, tuple[int, str]] = {}  # real path of a claim file -> (open fd holding its lock, command)


def hydra_command() -> str | None:
    """The command of the Hydra app running now (``eval``, ``train-policy``, ...), None outside one."""
    try:
        from hydra.core.hydra_config import HydraConfig

        return str(HydraConfig.get().job.config_name).replace("_", "-")
    except Exception:  # noqa: BLE001 - not under @hydra.main (a pipeline called directly, compose)
        return None


def _read_claim(path: Path) -> dict:
    try:
        claim = OmegaConf.to_container(OmegaConf.load(path)) if path.stat().st_size else {}
    except Exception:  # noqa: BLE001 - a claim torn by a kill: no owner known
        log.warning("%s is unreadable: taking the directory as unclaimed", path)
        return {}
    return claim if isinstance(claim, dict) else {}


def _holder(claim: dict) -> str:
    h = claim.get("holder") or {}
    if not h:
        return "another process"
    return (f"pid {h.get('pid')} on {h.get('host')} (`{h.get('argv')}`), started {h.get('started')}")


def lock_run_dir(path: str | Path, command: str | None, fix: str | None = None) -> Path:
    """Take the run directory ``path`` for this process and ``command`` (e.g. ``"eval"``, ``"reproduce"``),
    for the rest of the process's life; returns ``path``.

    - One writer at a time: an exclusive ``fcntl.flock`` on ``<path>/.specbench.yaml``, held open until the
      process exits (the kernel releases it then, so a killed run leaves no stale lock). A second process
      is refused with a SpecbenchError naming the holder (pid, host, command line, start time: written
      into that file); ``fix`` replaces the default fix line (another hydra.run.dir).
    - One command per directory: the file records the command that first wrote the directory, and a run
      of another command into it is refused (it would replace that command's files). ``command`` None
      (a pipeline called outside the CLI without naming itself) locks without checking the owner.
    Reentrant: the process that holds the directory may take it again (a resume in the same process).
    """
    out = Path(path)
    out.mkdir(parents=True, exist_ok=True)
    command = None if command is None else str(command).replace("_", "-")
    file = out / CLAIM_FILE
    key = os.path.realpath(file)
    held = _HELD.get(key)
    if held is not None:
        try:
            same = os.fstat(held[0]).st_ino == os.stat(file).st_ino
        except OSError:
            same = False
        if not same:  # the directory was removed (a failed run's) and made again
            os.close(held[0])
            del _HELD[key]
            held = None
    owner = _read_claim(file).get("command") if file.is_file() else None
    if command is not None and owner and owner != command:
        raise RunDirTaken(
            f"{out} belongs to `specbench {owner}` (recorded in {file}), so `specbench {command}` cannot run into it: "
            f"it would replace {owner}'s files (config.yaml, summaries) and {owner} would refuse its own records",
            fix or f"write the {command} run elsewhere: hydra.run.dir=<another directory>")
    fd = held[0] if held is not None else os.open(file, os.O_RDWR | os.O_CREAT, 0o644)
    if held is None:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            claim = _read_claim(file)
            os.close(fd)
            raise RunDirTaken(
                f"{out} is being written by another specbench run: {_holder(claim)} "
                f"(specbench {claim.get('command') or '?'}); two runs in one directory would both append every "
                "record and build their summaries on the doubled records",
                fix or "wait for that run to finish (or stop it), or write this run elsewhere: "
                       "hydra.run.dir=<another directory>") from None
        owner = _read_claim(file).get("command")  # as it is now that this process holds it
        if command is not None and owner and owner != command:
            os.close(fd)
            raise RunDirTaken(f"{out} belongs to `specbench {owner}` (recorded in {file}), so `specbench {command}` "
                              "cannot run into it", fix or f"write the {command} run elsewhere: "
                                                           "hydra.run.dir=<another directory>")
    text = OmegaConf.to_yaml(OmegaConf.create({
        "command": owner or command,
        "holder": {"pid": os.getpid(), "host": socket.gethostname(), "argv": " ".join(sys.argv),
                   "started": datetime.datetime.now().astimezone().isoformat(timespec="seconds")}}))
    data = text.encode()
    os.pwrite(fd, data, 0)  # in place (the lock is on this file), then cut: never an empty claim
    os.ftruncate(fd, len(data))
    _HELD[key] = (fd, owner or command)
    return out


def run_command(path: str | Path) -> str | None:
    """The command that owns a run directory (its ``.specbench.yaml``), None when unrecorded."""
    file = Path(path) / CLAIM_FILE
    return _read_claim(file).get("command") if file.is_file() else None


def eos_ids_of(loaded: LoadedModel, extra=(), vocab_size: int | None = None) -> frozenset[int]:
    """The model's EOS ids plus ``extra`` (``decoding.extra_eos_ids``), each checked to be a token id
    of a vocabulary of ``vocab_size`` when given."""
    ids = set()
    for source in (loaded.tokenizer.eos_token_id, getattr(loaded.model.generation_config, "eos_token_id", None)):
        if source is None:
            continue
        ids.update(source if isinstance(source, (list, tuple)) else [source])
    for x in extra or ():
        if isinstance(x, bool) or not isinstance(x, int) or x < 0 or (vocab_size is not None and x >= vocab_size):
            vocab = f"the target's vocabulary has {vocab_size} tokens (ids 0..{vocab_size - 1})" \
                if vocab_size is not None else "token ids are whole numbers >= 0"
            raise SpecbenchError(f"decoding.extra_eos_ids: {x!r} is not a token id: {vocab}",
                                 "list token ids of the target's tokenizer in decoding.extra_eos_ids")
        ids.add(x)
    return frozenset(int(i) for i in ids)


# The model-config fields read for a target's context length when its config (conf/target/) sets no
# ``context_keys``; a target with relative positions and no hard limit (T5) sets ``context_keys: []``.
CONTEXT_KEYS = ("max_position_embeddings", "n_positions")


@dataclass(frozen=True)
class Context:
    """How many positions a model can attend to: ``limit`` from the model-config field ``key``
    (None: no hard limit). ``check`` refuses a prompt that does not fit with its new tokens."""

    limit: int | None = None
    key: str | None = None
    model: str = "the model"

    @classmethod
    def of(cls, model_config, keys, model: str = "the model") -> "Context":
        """The first of ``keys`` that ``model_config`` sets to a positive whole number."""
        for key in keys:
            value = getattr(model_config, str(key), None)
            if isinstance(value, int) and not isinstance(value, bool) and value > 0:
                return cls(value, str(key), model)
        return cls(model=model)

    def fit(self, query_id: str, prompt_len: int, limits: Limits, encoder_decoder: bool = False,
            shorten: bool = False) -> Limits:
        """``limits`` when the prompt and its new tokens fit; with ``shorten`` (``decoding.fit_context``), a
        decoder-only generation that would overrun the context gets the positions left (at least one) as
        its ``max_new_tokens``; otherwise ``check`` refuses it."""
        room = None if self.limit is None else self.limit - prompt_len
        if shorten and not encoder_decoder and room is not None and 1 <= room < limits.max_new_tokens:
            return replace(limits, max_new_tokens=room)
        self.check(query_id, prompt_len, limits.max_new_tokens, encoder_decoder)
        return limits

    def check(self, query_id: str, prompt_len: int, max_new_tokens: int, encoder_decoder: bool = False) -> None:
        """SpecbenchError unless the prompt (the encoder input of an encoder-decoder model) and the
        ``max_new_tokens`` it may generate fit in ``limit`` positions."""
        if self.limit is None:
            return
        needed = max(prompt_len, 1 + max_new_tokens) if encoder_decoder else prompt_len + max_new_tokens
        if needed <= self.limit:
            return
        room = self.limit if encoder_decoder else self.limit - max_new_tokens
        raise SpecbenchError(
            f"query {query_id}: its prompt has {prompt_len:,} tokens, and with max_new_tokens={max_new_tokens} "
            f"it needs {needed:,} positions: more than the {self.limit:,} of {self.model} "
            f"({self.key} in its model config)",
            f"cut long inputs with dataset.max_input_tokens=<n> (each document / source / question / turn is "
            f"truncated to n tokens; the prompt template adds its own, and {max(room, 0):,} positions are left for "
            f"the whole prompt), lower max_new_tokens, let each generation stop at the context's end with "
            f"decoding.fit_context=true, or leave that record out of the data file")


def prompt_fingerprint(ids) -> str:
    """A short hash of a prompt's token ids."""
    return hashlib.sha256(json.dumps([int(i) for i in ids]).encode()).hexdigest()[:16]


def query_fingerprint(query) -> str:
    """A short hash of everything of a query that a record is made from: its kind, fields and turns (the
    prompt) and its reference (the quality scores)."""
    blob = json.dumps([query.kind, query.fields, query.turns, query.reference, query.task], sort_keys=True,
                      ensure_ascii=False, default=str)
    return hashlib.sha256(blob.encode("utf-8")).hexdigest()[:16]


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
    context: Context = Context()
    fit_context: bool = False  # decoding.fit_context: stop at the context's end instead of refusing
    tie_tolerance: float | None = None  # the target's tie tolerance in the run's dtype (decoding/certify.py)

    @classmethod
    def open(cls, cfg: DictConfig, output_dir: str | Path, files: RunFiles | None = None, command: str | None = None):
        """Make the run directory and load everything a timed run needs, before any timing.

        ``files``: the records the pipeline resumes; a directory holding records of other settings
        is refused (or, with the overwrite key, emptied) before anything is loaded
        (:func:`claim_run_dir`); ``command`` (``eval``, ``cascades``, ...) takes the directory for this process
        and command (:func:`lock_run_dir`). Every query's first prompt is checked against the target's context.
        """
        from specbench.drafters import build_pool

        out = start_run(cfg, output_dir, files, command)
        dec = cfg.decoding
        sampling = SamplingParams(temperature=float(dec.temperature), top_k=int(dec.top_k), top_p=float(dec.top_p))
        limits = Limits(max_new_tokens=dec.max_new_tokens, draft_length=dec.draft_length)
        cascade = cascade_of(cfg)
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
        eos_ids = eos_ids_of(loaded, dec.get("extra_eos_ids"), target.vocab_size)
        pool = build_pool(target, cfg.pool.get("drafters"), profile=cfg.get("profile_path"))
        queries = [truncate_fields(q, loaded.tokenizer, cfg.dataset.get("max_input_tokens")) for q in queries]
        prompter = Prompter(loaded.tokenizer, cfg.target.prompt.style, templates, cfg.target.prompt.get("system"),
                            shots, cfg.target.prompt.get("chat_template"))
        context = Context.of(target.config, cfg.target.get("context_keys", CONTEXT_KEYS), str(cfg.target.model))
        clock = Clock(target.device, phases=bool(OmegaConf.select(cfg, "timing.phases", default=False)))
        session = cls(cfg=cfg, out=out, queries=queries, loaded=loaded, target=target, pool=pool, prompter=prompter,
                      sampling=sampling, limits=limits, eos_ids=eos_ids, clock=clock, cascade=cascade,
                      context=context, fit_context=bool(dec.get("fit_context", False)),
                      tie_tolerance=tie_tolerance_of(cfg))
        session.check_prompts()
        return session

    def drafter_fingerprints(self) -> dict[str, str]:
        """``{arm: fingerprint}`` of the pool's drafters loaded from checkpoint files (eagle heads, hf
        drafters: ``drafter.fingerprint``), so a record made with a retrained checkpoint is not resumed."""
        return {a: str(d.fingerprint) for a, d in self.pool.items() if getattr(d, "fingerprint", None)}

    def records(self, queries=None) -> "Records":
        """The run's :class:`Records`, checked against this run's queries (``queries``: a subset of
        them) and drafters; ``overwrite=true`` redoes records whose inputs changed instead of refusing."""
        return Records(self.out, self.tie_tolerance, queries=self.queries if queries is None else queries,
                       drafters=self.drafter_fingerprints(), overwrite=bool(self.cfg.get("overwrite", False)))

    def check_prompts(self, limits: Limits | None = None) -> None:
        """Refuse, before any decoding, a query whose first prompt and new tokens overrun the context."""
        limits = limits or self.limits
        for query in self.queries:
            self.context.fit(query.id, len(self.prompter(query)), limits, self.target.is_encoder_decoder,
                             self.fit_context)

    # -- decoding ----------------------------------------------------------------------------
    def rng(self, query_index: int = 0, method_index: int = 0, seed: int | None = None) -> torch.Generator:
        seed = seed_for(int(self.cfg.seed), query_index, method_index) if seed is None else seed
        return torch.Generator(device=self.target.device).manual_seed(seed)

    def decode(self, selector: Selector, prompt_ids: list[int], rng: torch.Generator, *, limits: Limits | None = None,
               query=None, cascade: Cascade | None = None, target: Target | None = None,
               pool: Mapping[str, Drafter] | None = None, sampling: SamplingParams | None = None) -> Generation:
        """The one decode loop with this run's settings (each may be replaced for one call)."""
        asked = limits or self.limits
        limits = self.context.fit(getattr(query, "id", "(unnamed)"), len(prompt_ids), asked,
                                  self.target.is_encoder_decoder, self.fit_context)
        gen = decode(target or self.target, self.pool if pool is None else pool, selector, prompt_ids,
                     sampling=sampling or self.sampling, limits=limits, eos_ids=self.eos_ids,
                     rng=rng, clock=self.clock, query=query, cascade=cascade)
        if limits is not asked and gen.stop == "length":
            gen.stop = "context"  # cut at the context's end, before max_new_tokens
        gen.prompt_sha = prompt_fingerprint(prompt_ids)
        return gen

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
                   tie_tolerance: float | None = None, **extra) -> ExampleRecord:
    """The ``examples.jsonl`` record of one finished generation (quality scored against ``reference``;
    ``tie_tolerance``: the run's, kept beside the generation's deciders)."""
    return ExampleRecord(
        deciders=gen.deciders, tie_tolerance=tie_tolerance if gen.deciders is not None else None,
        prompt_sha=gen.prompt_sha,
        query_id=ex_id, task=query.task, method=method, output_ids=gen.tokens, text=text,
        new_tokens=len(gen.tokens), seconds=gen.seconds, target_calls=gen.target_calls, rounds=len(gen.rounds),
        drafted=gen.drafted, accepted=gen.accepted, switches=gen.switches,
        t_switch=sum(r.t_switch for r in gen.rounds), t_select=sum(r.t_select for r in gen.rounds),
        stop=gen.stop, category=query.category, reference=reference,
        quality=metrics.score(query.kind, text, reference), deferred=gen.deferred, **extra)


DUPLICATES_SHOWN = 5


class Records:
    """``examples.jsonl`` and ``rounds.jsonl`` of a run directory, appended as generations finish.

    ``done``: the (query id, method) pairs already written (a rerun into the directory skips them).
    On opening (a resume):

    - duplicated (query id, method) records (two processes that wrote one directory) are refused;
    - ``rounds.jsonl`` lines whose generation has no example record (a run stopped between the two
      appends, or a damaged example line deleted) are dropped, so a redone generation's rounds are not
      counted twice (the file is rewritten atomically);
    - with ``queries`` (and ``drafters``: ``{arm: checkpoint fingerprint}``), a finished record made from
      another content of its query (the data file changed: :func:`query_fingerprint`) or other drafter
      checkpoints (retrained) is refused, naming the query ids; with ``overwrite`` it is dropped and redone.

    Every record written carries ``process`` (one id per ``Records``, i.e. per run process), so speedups
    pair only generations timed in one process (``report.summarize``), and the fingerprints.
    """

    def __init__(self, out: Path, tie_tolerance: float | None = None, *, queries=None,
                 drafters: Mapping[str, str] | None = None, overwrite: bool = False):
        self.out = Path(out)
        self.tie_tolerance = tie_tolerance
        self.process = uuid.uuid4().hex[:12]
        self.fingerprints = None if queries is None else {q.id: query_fingerprint(q) for q in queries}
        self.drafters = dict(drafters or {})
        path = self.out / "examples.jsonl"
        examples = []
        for i, rec in enumerate(read_jsonl(path), 1):
            missing = [k for k in EXAMPLE_KEYS if not isinstance(rec, dict) or k not in rec]
            if missing:
                have = ", ".join(rec) if isinstance(rec, dict) else f"a JSON {type(rec).__name__}"
                raise SpecbenchError(f"{path}: record {i} has no {', '.join(missing)} (it has: {have})",
                                     f"repair or delete line {i} of {path} (or rerun into a new directory)")
            examples.append((i, rec))
        self._check_duplicates(path, examples)
        stale = self._stale([rec for _, rec in examples])
        if stale:
            examples = self._drop_stale(path, examples, stale, overwrite)
        self.done = {(rec["query_id"], rec["method"]) for _, rec in examples}
        self._drop_orphan_rounds({(rec["query_id"], rec["method"]): rec for _, rec in examples})
        if self.done:
            log.info("resuming: %d finished generations found in %s", len(self.done), self.out)
        self._rounds = self._examples = None

    @staticmethod
    def _check_duplicates(path: Path, examples) -> None:
        seen: dict[tuple[str, str], list[int]] = {}
        for i, rec in examples:
            seen.setdefault((rec["query_id"], rec["method"]), []).append(i)
        dup = {k: v for k, v in seen.items() if len(v) > 1}
        if not dup:
            return
        shown = "; ".join(f"{q} / {m} (lines {', '.join(map(str, v))})" for (q, m), v in list(dup.items())[:DUPLICATES_SHOWN])
        more = f" and {len(dup) - DUPLICATES_SHOWN} more" if len(dup) > DUPLICATES_SHOWN else ""
        raise SpecbenchError(
            f"{path} holds {len(dup)} (query id, method) pair(s) more than once: {shown}{more}; two runs wrote "
            "this directory at once, so its records (and any summary of them) are doubled",
            f"rerun into a new directory (hydra.run.dir=...), or delete {path} and rounds.jsonl beside it to start "
            "it again")

    def _stale(self, examples: list[dict]) -> dict[tuple[str, str], str]:
        """``{(query id, method): why}`` for finished records made from other inputs than this run's."""
        out: dict[tuple[str, str], str] = {}
        for rec in examples:
            key = (rec["query_id"], rec["method"])
            base = str(rec["query_id"]).split("/turn")[0]
            if self.fingerprints is not None and rec.get("query_sha") is not None:
                now = self.fingerprints.get(rec["query_id"], self.fingerprints.get(base))
                if now is None:
                    out[key] = "its query is no longer in the dataset"
                elif now != rec["query_sha"]:
                    out[key] = "its query's content changed in the data"
            if key not in out and rec["method"] != AUTOREGRESSIVE and rec.get("drafters") is not None:
                changed = sorted(a for a in set(rec["drafters"]) | set(self.drafters)
                                 if rec["drafters"].get(a) != self.drafters.get(a))
                if changed:
                    out[key] = f"drafter checkpoint(s) changed: {', '.join(changed)}"
        return out

    def _drop_stale(self, path: Path, examples, stale: dict, overwrite: bool):
        ids = list(dict.fromkeys(q for q, _ in stale))
        whys = sorted(set(stale.values()))
        what = f"{len(stale)} finished generation(s) of {len(ids)} query id(s) ({', '.join(ids[:10])}" + \
               (f" and {len(ids) - 10} more" if len(ids) > 10 else "") + ")"
        if not overwrite:
            raise SpecbenchError(
                f"{path}: {what} were made from other inputs than this run's ({'; '.join(whys)}), so they cannot "
                "be resumed",
                "rerun into a new directory (hydra.run.dir=...), or pass overwrite=true to redo them")
        log.warning("overwrite=true: redoing %s in %s (%s)", what, self.out, "; ".join(whys))
        kept = [(i, rec) for i, rec in examples if (rec["query_id"], rec["method"]) not in stale]
        rewrite_jsonl(path, [rec for _, rec in kept])
        return kept

    def _drop_orphan_rounds(self, finished: dict[tuple[str, str], dict]) -> None:
        path = self.out / "rounds.jsonl"
        if not path.exists():
            return
        by_pair: dict[tuple[str, str], list[dict]] = {}
        rows = list(read_jsonl(path))
        for row in rows:
            by_pair.setdefault((row.get("query_id"), row.get("method")), []).append(row)
        kept: list[dict] = []
        orphans = extra = 0
        for key, group in by_pair.items():
            rec = finished.get(key)
            if rec is None:
                orphans += len(group)
                continue
            n = rec.get("rounds")
            if isinstance(n, int) and len(group) > n:  # rounds of an earlier, unfinished try of the pair: keep the last
                extra += len(group) - n
                group = group[len(group) - n:]
            kept.extend(group)
        if not orphans and not extra:
            return
        log.warning("%s: dropping %d round line(s) without their example record and %d of an earlier unfinished "
                    "try (a run stopped between appending a generation's rounds and its example, or an example "
                    "line was deleted): the resume redoes those generations", path, orphans, extra)
        order = {id(r): i for i, r in enumerate(rows)}
        rewrite_jsonl(path, sorted(kept, key=lambda r: order[id(r)]))

    def __enter__(self):
        self._rounds = JsonlWriter(self.out / "rounds.jsonl")
        self._examples = JsonlWriter(self.out / "examples.jsonl")
        return self

    def __exit__(self, *exc):
        self._rounds.close()
        self._examples.close()

    def write(self, query, ex_id: str, method: str, gen: Generation, text: str, reference: str | None, **extra):
        extra.setdefault("process", self.process)
        if self.fingerprints is not None:
            extra.setdefault("query_sha", self.fingerprints.get(query.id) or query_fingerprint(query))
        if method != AUTOREGRESSIVE:
            extra.setdefault("drafters", dict(self.drafters))
        self._rounds.write_many(round_row(ex_id, query.task, method, r) for r in gen.rounds)
        self._examples.write(example_record(query, ex_id, method, gen, text, reference, self.tie_tolerance, **extra))
        self.done.add((ex_id, method))

    def examples(self) -> list[dict]:
        return list(read_jsonl(self.out / "examples.jsonl"))

    def rounds(self) -> list[dict]:
        return list(read_jsonl(self.out / "rounds.jsonl"))


def rewrite_jsonl(path: Path, rows: Iterable[dict]) -> None:
    """Replace a JSONL file whole with ``rows`` (atomically: :func:`specbench.records.atomic_write_text`)."""
    atomic_write_text(path, "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows))
