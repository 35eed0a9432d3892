"""``specbench eval``: timed decoding of several methods on the same examples, interleaved.

Per example every method runs once, in an order rotated by the example index (A B C, B C A, ...),
in one process with one clock; the autoregressive baseline is always among them. Records are
appended as each generation finishes; rerunning into the same directory skips finished
(query, method) pairs, so an interrupted run resumes.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
from hydra.errors import InstantiationException
from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf
from tqdm.auto import tqdm

from specbench.configs import conf_dir, group_options
from specbench.decoding.cascade import Cascade
from specbench.decoding.loop import Generation, Limits, decode
from specbench.decoding.sampling import SamplingParams
from specbench.drafters import AUTOREGRESSIVE, ModelDrafter, build_pool
from specbench.errors import SpecbenchError
from specbench.models import Target, load_model
from specbench.models.loading import LoadedModel
from specbench.pipelines import report
from specbench.records import ExampleRecord, JsonlWriter, read_jsonl, round_row
from specbench.selection import Fixed, Selector
from specbench.tasks import build_prompt, load_dataset_config, load_shots, metrics, render, truncate_fields
from specbench.timing import Clock

log = logging.getLogger(__name__)


@dataclass
class Method:
    name: str
    make_selector: Callable[[], Selector]


def parse_methods(specs, pool: dict, selector_cfg, root: DictConfig | None = None) -> list[Method]:
    """``autoregressive`` | ``fixed:<arm>`` | ``fixed:*`` (every drafter) | ``selector`` (the composed
    ``selector`` config) | ``selector:<name>`` (``conf/selector/<name>.yaml``, so one run can compare
    several selectors). The autoregressive baseline is always first."""
    arms = list(pool)
    names: list[str] = [AUTOREGRESSIVE]
    methods = [Method(AUTOREGRESSIVE, lambda: Fixed(arms, AUTOREGRESSIVE))]
    for spec in specs or []:
        spec = str(spec)
        if spec == AUTOREGRESSIVE:
            continue
        if spec == "selector" or spec.startswith("selector:"):
            if spec.startswith("selector:"):
                selector_cfg = load_selector_config(spec.split(":", 1)[1], root)
            elif selector_cfg is None:
                continue
            name = str(selector_cfg.get("name") or selector_cfg._target_.rsplit(".", 1)[-1].lower())
            scfg = {k: v for k, v in OmegaConf.to_container(selector_cfg, resolve=True).items() if k != "name"}
            make_selector(scfg, arms)  # validates the config now, before any decoding
            new = [Method(name, lambda scfg=scfg: make_selector(scfg, arms))]
        elif spec.startswith("fixed:"):
            arm = spec.split(":", 1)[1]
            chosen = [a for a in arms if a != AUTOREGRESSIVE] if arm == "*" else [arm]
            for a in chosen:
                Fixed(arms, a)  # validates the arm name now, before any decoding
            new = [Method(f"fixed:{a}", lambda a=a: Fixed(arms, a)) for a in chosen]
        else:
            raise SpecbenchError(f"unknown method '{spec}'",
                                 "use autoregressive, fixed:<drafter>, fixed:*, selector or selector:<name> in methods")
        for m in new:
            if m.name not in names:
                names.append(m.name)
                methods.append(m)
    return methods


def make_selector(scfg: dict, arms: list[str]) -> Selector:
    """Instantiate a selector config; a ``SpecbenchError`` inside surfaces as itself."""
    try:
        return instantiate(scfg, arms=arms)
    except InstantiationException as exc:
        if isinstance(exc.__cause__, SpecbenchError):
            raise exc.__cause__ from None
        raise SpecbenchError(f"could not build selector '{scfg.get('_target_')}': {exc}",
                             "check its keys against conf/selector/") from exc


def load_selector_config(name: str, root: DictConfig | None = None):
    """``conf/selector/<name>.yaml``, placed under ``root`` (the run's config) so that its
    interpolations (``${policy.checkpoint}``) resolve as they would for ``selector=<name>``."""
    options = group_options("selector")
    if name not in options:
        raise SpecbenchError(f"no selector config named '{name}'", f"use one of: {', '.join(options)}")
    loaded = OmegaConf.load(Path(conf_dir()) / "selector" / f"{name}.yaml")
    if root is None:
        return loaded
    ctx = OmegaConf.create({k: v for k, v in OmegaConf.to_container(root, resolve=False).items() if k != "selector"})
    ctx.selector = loaded
    return ctx.selector


def eos_ids_of(loaded, extra=()) -> frozenset[int]:
    ids = set()
    for source in (loaded.tokenizer.eos_token_id, getattr(loaded.model.generation_config, "eos_token_id", None)):
        if source is None:
            continue
        ids.update(source if isinstance(source, (list, tuple)) else [source])
    ids.update(int(x) for x in extra or ())
    return frozenset(int(i) for i in ids)


def write_convergence(examples: list[dict], out: Path) -> None:
    """convergence.csv (+ .png when matplotlib is installed) when adaptive selectors ran."""
    import pandas as pd

    adaptive = {e["method"] for e in examples if e["method"] != AUTOREGRESSIVE and not e["method"].startswith("fixed:")}
    if not adaptive:
        return
    conv = report.convergence(read_jsonl(out / "rounds.jsonl"), report.oracle_arms(pd.DataFrame(examples)))
    conv.to_csv(out / "convergence.csv", index=False)
    try:
        report.plot_convergence(conv, out / "convergence.png")
    except ImportError:
        log.warning("matplotlib is not installed: convergence.png skipped (pip install matplotlib)")


def cascade_of(cfg: DictConfig) -> Cascade | None:
    """The run's cascade rule (``cascade=<rule> cascade.alpha=<a>``); None when the config has none."""
    c = cfg.get("cascade")
    return None if c is None else Cascade(rule=str(c.rule), alpha=float(c.alpha))


def _seed_for(seed: int, query_index: int, method_index: int) -> int:
    return (seed * 1_000_003 + query_index * 1_009 + method_index) % (2**63)


def prepare(cfg: DictConfig):
    """Everything a timed run needs, built before any timing: queries, target, pool, prompts."""
    dec = cfg.decoding
    sampling = SamplingParams(temperature=float(dec.temperature), top_k=int(dec.top_k), top_p=float(dec.top_p))
    limits = Limits(max_new_tokens=int(dec.max_new_tokens), draft_length=int(dec.draft_length))
    queries = load_dataset_config(cfg.dataset)
    log.info("loading target %s", cfg.target.model)
    loaded = load_model(cfg.target.model, dtype=cfg.target.dtype, device=cfg.target.device)
    target = Target(loaded)
    pool = build_pool(target, cfg.pool.get("drafters"))
    if cfg.target.prompt.templates not in cfg.templates:
        raise SpecbenchError(f"unknown template set '{cfg.target.prompt.templates}'",
                             f"set target.prompt.templates to one of: {', '.join(cfg.templates)}")
    shots = load_shots(cfg.dataset, int(cfg.dataset.get("n_shot") or 0))
    queries = [truncate_fields(q, loaded.tokenizer, cfg.dataset.get("max_input_tokens")) for q in queries]
    prompter = Prompter(loaded.tokenizer, cfg.target.prompt.style, cfg.templates[cfg.target.prompt.templates],
                        cfg.target.prompt.get("system"), shots)
    return sampling, limits, queries, loaded, target, pool, prompter


@dataclass
class Prompter:
    tokenizer: object
    style: str
    templates: dict
    system: str | None
    shots: list

    def __call__(self, query, turn: int = 0, history=()) -> list[int]:
        return build_prompt(query, self.tokenizer, self.style, self.templates, self.system, turn=turn,
                            history=history, shots=self.shots)

    def user_text(self, query, turn: int) -> str:
        return render(query, self.templates, turn=turn, shots=self.shots if turn == 0 else ())


def turns_of(query, max_turns: int) -> int:
    return max(1, min(len(query.turns), max_turns)) if query.turns else 1


def example_id(query, turn: int) -> str:
    return query.id if turn == 0 else f"{query.id}/turn{turn + 1}"


def alone_target(drafter: ModelDrafter, target: Target) -> Target:
    """The drafter's own module as a target: decoding it with the autoregressive arm is the drafter's
    greedy generation, through the same loop and clock as every other method."""
    return Target(LoadedModel(model=drafter.lm.model, tokenizer=target.tokenizer, name=drafter.name))


def example_record(query, ex_id: str, method: str, gen: Generation, text: str, reference: str | None,
                   **extra) -> ExampleRecord:
    """The ``examples.jsonl`` record of one finished generation (quality scored against ``reference``)."""
    return ExampleRecord(
        query_id=ex_id, task=query.task, method=method, output_ids=gen.tokens, text=text,
        new_tokens=len(gen.tokens), seconds=gen.seconds, target_calls=gen.target_calls, rounds=len(gen.rounds),
        drafted=gen.drafted, accepted=gen.accepted, switches=gen.switches,
        t_switch=sum(r.t_switch for r in gen.rounds), t_select=sum(r.t_select for r in gen.rounds),
        stop=gen.stop, category=query.category, reference=reference,
        quality=metrics.score(query.task, text, reference), deferred=gen.deferred, **extra)


def start_run(cfg: DictConfig, output_dir: str | Path) -> Path:
    """Create the run directory, save the composed config there, apply ``threads``."""
    out = Path(output_dir)
    out.mkdir(parents=True, exist_ok=True)
    OmegaConf.save(cfg, out / "config.yaml")
    if cfg.get("threads"):
        torch.set_num_threads(int(cfg.threads))
    return out


def run(cfg: DictConfig, output_dir: str | Path) -> Path:
    out = start_run(cfg, output_dir)
    sampling, limits, queries, loaded, target, pool, prompter = prepare(cfg)
    methods = parse_methods(cfg.methods, pool, cfg.get("selector"), cfg)
    eos_ids = eos_ids_of(loaded, cfg.decoding.get("extra_eos_ids"))
    max_turns = int(cfg.dataset.get("max_turns") or 1)
    clock = Clock(target.device)
    cascade = cascade_of(cfg)

    done = {(r["query_id"], r["method"]) for r in read_jsonl(out / "examples.jsonl")}
    if done:
        log.info("resuming: %d finished generations found in %s", len(done), out)
    todo = [(qi, mi) for qi, q in enumerate(queries) for mi in range(len(methods))
            if any((example_id(q, t), methods[mi].name) not in done for t in range(turns_of(q, max_turns)))]

    if todo and cfg.warmup.max_new_tokens > 0:
        warm = Limits(max_new_tokens=int(cfg.warmup.max_new_tokens), draft_length=limits.draft_length)
        for m in methods:
            decode(target, pool, m.make_selector(), prompter(queries[0]), sampling=sampling, limits=warm,
                   eos_ids=eos_ids, rng=torch.Generator(device=target.device).manual_seed(0), clock=clock,
                   query=queries[0], cascade=cascade)

    # One selector per method for the whole run: ``reset`` starts each query, and selectors that
    # carry statistics across queries (warm start) keep them.
    selectors = {m.name: m.make_selector() for m in methods}
    todo_set = set(todo)
    with JsonlWriter(out / "rounds.jsonl") as rounds_out, JsonlWriter(out / "examples.jsonl") as examples_out, \
            tqdm(total=len(todo), desc="eval", unit="query x method") as bar:
        for qi, query in enumerate(queries):
            for j in range(len(methods)):
                mi = (qi + j) % len(methods)  # rotate the order per example
                if (qi, mi) not in todo_set:
                    continue
                m = methods[mi]
                rng = torch.Generator(device=target.device).manual_seed(_seed_for(int(cfg.seed), qi, mi))
                history: list[tuple[str, str]] = []
                for turn in range(turns_of(query, max_turns)):
                    gen = decode(target, pool, selectors[m.name], prompter(query, turn, history), sampling=sampling,
                                 limits=limits, eos_ids=eos_ids, rng=rng, clock=clock, query=query,
                                 cascade=cascade)
                    text = loaded.tokenizer.decode(gen.tokens, skip_special_tokens=True)
                    history.append((prompter.user_text(query, turn), text))
                    ex_id = example_id(query, turn)
                    if (ex_id, m.name) in done:  # redone only to rebuild the chat history
                        continue
                    reference = query.reference if turn == 0 else None
                    rounds_out.write_many(round_row(ex_id, query.task, m.name, r) for r in gen.rounds)
                    examples_out.write(example_record(query, ex_id, m.name, gen, text, reference, turn=turn + 1))
                bar.update(1)

    examples = list(read_jsonl(out / "examples.jsonl"))
    table = report.summarize(examples)
    lossy = f" (cascade rule {cascade.label}: lossy)" if cascade is not None and not cascade.lossless else ""
    report.write_tables(table, out, title=f"specbench eval: {cfg.target.model}{lossy}")
    write_convergence(examples, out)
    report.print_table(report.compact(table), title=f"summary ({out}; every column in summary.csv / summary.md)")
    return out
