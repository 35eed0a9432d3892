"""``specbench eval``: timed decoding of several methods on the same examples, interleaved.

Per example every method runs once, in an order rotated by the example index (A B C, B C A, ...),
in one process with one clock; the autoregressive baseline is always among them. Records are
appended as each generation finishes; rerunning into the same directory skips finished
(query, method) pairs, so an interrupted run resumes.
"""

from __future__ import annotations

import functools
import logging
from dataclasses import replace
from pathlib import Path

from omegaconf import DictConfig, OmegaConf, open_dict
from tqdm.auto import tqdm

from specbench.arms import AUTOREGRESSIVE, BATCH_ONLY
from specbench.decoding import certify
from specbench.decoding.engine import check_trees
from specbench.errors import SpecbenchError
from specbench.pipelines import forks, spec_bench, tables
from specbench.pipelines.batch_settings import batch_size, check_batched, check_queries
from specbench.pipelines.cost_cache import NODES, Probe, run_contexts, startup_costs
from specbench.pipelines.methods import Method, check_methods, parse_methods
from specbench.pipelines.session.core import Session, policy_checkpoint
from specbench.pipelines.session.prompting import example_id, turns_of
from specbench.pipelines.session.run_dir import RECORDS
from specbench.pipelines.session.run_records import Records, write_after_stop
from specbench.pipelines.waves import decode_waves
from specbench.policy import check_not_trained_on, load_checkpoint
from specbench.records import CONVERGENCE_CSV, FORKS_CSV, ROUNDS, read_jsonl
from specbench.selection import PolicySelector, Selector

log = logging.getLogger(__name__)


def write_convergence(examples: list[dict], out: Path) -> None:
    """convergence.csv (+ .png when matplotlib is installed) when adaptive selectors ran."""
    import pandas as pd

    adaptive = {
        e["method"]
        for e in examples
        if e["method"] != AUTOREGRESSIVE and not e["method"].startswith(("fixed:", "again:", *BATCH_ONLY))
    }
    if not adaptive:
        return
    conv = tables.convergence(read_jsonl(out / ROUNDS), tables.oracle_arms(pd.DataFrame(examples)))
    tables.write_csv(conv, out / CONVERGENCE_CSV)
    try:
        tables.plot_convergence(conv, out / "convergence.png")
    except ImportError:
        log.warning("matplotlib is not installed: convergence.png skipped (pip install matplotlib)")


def write_forks(examples: list[dict], out: Path) -> None:
    """forks.csv: each output of a method that departs from the autoregressive output of its query, with
    the two tokens, both runs' logit margins and the verdict; a warning names every query with a defect."""
    table = forks.forks(examples)
    if table.empty:
        (out / FORKS_CSV).unlink(missing_ok=True)
        return
    tables.write_csv(table, out / FORKS_CSV)
    bad = table[table.verdict == certify.DEFECT]
    if len(bad):
        log.warning(
            "%d output(s) fork from autoregressive decoding where rounding does not explain it (defect): %s; "
            "see %s",
            len(bad),
            ", ".join(f"{q} ({m})" for q, m in zip(bad.query_id, bad.method)),
            out / FORKS_CSV,
        )


def check_resumable(
    selectors: dict[str, Selector],
    methods: list[Method],
    todo: list[tuple[int, int]],
    done_methods: set[str],
    out: Path | None = None,
) -> None:
    """A selector that carries statistics across queries (``carry_over``) cannot pick up half way: its
    state after the finished queries is not in the records. Refuse instead of silently differing."""
    for mi, m in enumerate(methods):
        if (
            getattr(selectors.get(m.name), "carry_over", False)
            and m.name in done_methods
            and any(i == mi for _, i in todo)
        ):
            raise SpecbenchError(
                f"cannot resume method '{m.name}': its selector carries statistics across queries (carry_over), "
                "and its state after the finished queries is not restored from the records",
                f"rerun into a new directory (hydra.run.dir=...), or delete {out or 'this directory'}/examples.jsonl "
                f"and {out or 'this directory'}/rounds.jsonl to start it again",
            )


POLICY_POOL = (
    "from_policy"  # the key of conf/pool/auto.yaml: the pool a policy was collected with may replace it
)


def use_policy_pool(cfg: DictConfig) -> None:
    """``pool=auto`` (eval's default: ``from_policy: true``, conf/pool/auto.yaml) and a method that plays a policy
    whose checkpoint keeps its collection's pool: that pool, so ``eval selector=policy`` after a default collect
    and train-policy needs no ``pool=``. A chosen pool has no ``from_policy`` and is kept. The key is removed
    either way (the run's config.yaml holds the pool it ran)."""
    if not OmegaConf.select(cfg, f"pool.{POLICY_POOL}", default=False):
        return
    with open_dict(cfg):
        del cfg.pool[POLICY_POOL]
    path = policy_checkpoint(cfg)
    pool = load_checkpoint(path).meta.get("pool") if path is not None else None  # older checkpoints keep none
    if not pool or OmegaConf.to_container(cfg.pool, resolve=True) == pool:
        return
    log.info("pool: the one the policy in %s was collected with (set pool=<name> to choose another)", path)
    with open_dict(cfg):
        cfg.pool = pool


def check_methods_early(cfg: DictConfig) -> None:
    """``methods.check_methods`` unless a policy's checkpoint exists (its pool may come from the checkpoint:
    ``use_policy_pool``)."""
    if policy_checkpoint(cfg) is None:
        check_methods(cfg)


def probe_of(s: Session) -> Probe:
    """What a budget's start-up profile measures: the run's target and pool, on a grid of contexts from its shortest
    prompt to its longest prompt and output (``cost_cache.run_contexts``)."""
    lengths = [len(s.prompter(q)) for q in s.queries]
    positions = getattr(s.target.model.config, "max_position_embeddings", None)
    limit = positions - max(NODES) - 2 if positions else None
    contexts = run_contexts(min(lengths), max(lengths) + s.limits.max_new_tokens, limit)
    return Probe(
        s.target, s.pool, s.prompter(s.queries[0]), s.limits.draft_length, s.sampling, s.clock, contexts
    )


def run(cfg: DictConfig, output_dir: str | Path) -> Path:
    use_policy_pool(cfg)
    check_methods_early(cfg)
    check_batched(cfg)
    s = Session.open(cfg, output_dir, RECORDS, "eval")
    costs = functools.cache(
        lambda: startup_costs(probe_of(s))
    )  # a budget's profile (costs: profile), measured once
    methods = parse_methods(cfg.methods, s.pool, cfg.get("selector"), cfg, costs)
    max_turns = int(cfg.dataset.get("max_turns") or 1)
    records = s.records()
    todo = [
        (qi, mi)
        for qi, q in enumerate(s.queries)
        for mi in range(len(methods))
        if any(
            (example_id(q, t), methods[mi].name) not in records.done for t in range(turns_of(q, max_turns))
        )
    ]
    batched = batch_size(cfg) > 1
    if batched:
        check_queries(batch_size(cfg), len(s.queries))
    # every check a method's selector gets runs at every batch size (a policy on its training queries, a resumable
    # state, trees); only the warm-up is batch 1's own (the batched decoder warms each method on a batch itself)
    selectors = prepared_selectors(s, methods, records, todo, warm=not batched)
    try:
        with records, tqdm(total=len(todo), desc="eval", unit="query x method") as bar:
            decode_waves(
                s, methods, selectors, records, set(todo), int(cfg.get("conversation_length") or 1), bar
            )
    except BaseException:
        write_after_stop(
            records, s.out, "eval", "summary", lambda: write_summary(s, cfg, records, partial=True)
        )
        raise
    write_summary(s, cfg, records)
    return s.out


def prepared_selectors(
    s: Session, methods: list[Method], records: Records, todo, warm: bool = True
) -> dict[str, Selector]:
    """One selector per method for the whole run (``reset`` starts each query; selectors that carry statistics
    across queries keep them; a batch's rows each play a copy), checked (a policy not on its training queries, a
    resumable state, trees on a target that takes them), and the methods warmed up when anything is left to decode
    (``warm``: batch 1 only; the batch-only methods are warmed by their batches)."""
    selectors = {m.name: m.make_selector() for m in methods}
    for name, selector in selectors.items():  # a trained policy must not be evaluated on its training queries
        if isinstance(selector, PolicySelector):
            check_not_trained_on(selector.policy, s.queries, where=f"the policy of method '{name}'")
    check_resumable(selectors, methods, todo, {m for _, m in records.done}, s.out)
    for name, selector in selectors.items():
        check_trees(selector, s.target, name)
    if todo and warm:
        s.warm_up(
            lambda prompt, lim, rng, m=m: s.decode(
                m.make_selector(), prompt, rng, replace(s.spec, limits=lim), query=s.queries[0]
            )
            for m in methods
            if not m.batch_only
        )
    return selectors


def write_summary(s: Session, cfg: DictConfig, records: Records, partial: bool = False) -> None:
    """summary.csv / summary.md (+ matrices, convergence, Spec-Bench answer files) from the run's records."""
    examples = records.examples()
    table = tables.summarize(examples)
    lossy = (
        f" (cascade rule {s.cascade.label}: lossy)"
        if s.cascade is not None and not s.cascade.lossless
        else ""
    )
    stopped = " (stopped early: the finished generations only)" if partial else ""
    tables.write_tables(
        table,
        s.out,
        title=f"specbench eval: {cfg.target.model} in {cfg.target.dtype}{lossy}{stopped}",
        notes=tables.EVAL_NOTES
        + tables.pairing_note(table)
        + f" Forks judged at tie tolerance {s.tie_tolerance:g} (target.tie_tolerance of this dtype).",
    )
    if not table.empty:
        tables.write_matrices(table, s.out)
    write_forks(examples, s.out)
    write_convergence(examples, s.out)
    if cfg.get("spec_bench_answers"):
        spec_bench.write_answers(
            examples, records.rounds(), s.out / "spec_bench", model_id=spec_bench.model_id(cfg)
        )
    tables.print_table(
        tables.compact(table), title=f"summary ({s.out}; every column in summary.csv / summary.md)"
    )
