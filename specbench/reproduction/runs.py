"""Every run directory of ``specbench reproduce``, once: which command writes it and, per scale, with which
overrides. Exhibits (``catalog.py``) name the runs they read; the plans are derived from them (``steps_at``).

A run is one of our commands with an experiment config and a fixed directory under the root
(``<paper>/...``). The CPU and paper scales share a directory where the papers overlap (``huang/...``,
``metasd/eval``, ``metasd/stream``); each also has runs of its own (``cascades/greedy`` at CPU scale,
``spec_bench/eval``, ``metasd/eagle``, ``metasd/multilingual/<language>``, ``cascades/<experiment>`` at paper
scale). Overrides may hold ``{root}`` (the reproduce root: how a run names an upstream run it reads, through
:func:`under_root`) and ``{questions}`` (Spec-Bench's question file). A run declares the runs it reads (``reads``);
runs are declared upstream first, and a plan lists its runs in declaration order.

The files of a run directory that the reproduction reads or writes are named once, here (``RECORD_FILES``:
each command's per-item records).
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

# the record files' names live beside their writers (records.py); the plan reads them from here too
from specbench.records import CONFIG, EXAMPLES, ROUNDS, ROWS, SEEDS, SUMMARY  # noqa: F401

RUN_SCALES = (
    "cpu",
    "paper",
)  # the scales a run has overrides for (a report layout each; `--scale tiny` runs cpu's)

# ---------------------------------------------------------------- the files of a run directory
# `specbench reproduce`: a finished step (settings, upstream fingerprints, seconds, record count)
DONE = ".done"
# `specbench reproduce`: a step's settings, written when it starts (kept if it stops early)
STARTED = ".step.json"
ROOT_RECORD = "reproduce.json"  # `specbench reproduce`: the root's scale and report layout


@dataclass(frozen=True)
class RecordFile:
    """A command's per-item records: the file (one line per item) and what an item is."""

    name: str
    items: str


# The records of each command a step runs: counted into its `.done`, so the report can tell a step whose records
# were cut afterwards.
RECORD_FILES: dict[str, RecordFile] = {
    "eval": RecordFile(EXAMPLES, "generations"),
    "cascades": RecordFile(EXAMPLES, "generations"),
    "collect": RecordFile(ROWS, "collected queries"),
}


@dataclass(frozen=True)
class Step:
    """One step of a plan: a run at one scale."""

    paper: str
    command: str  # a root config: eval | collect | train_policy | cascades
    run: str  # run directory, relative to the root
    overrides: tuple[str, ...] = ()  # {root} and {questions} are filled in
    reads: tuple[str, ...] = ()  # the run directories of the upstream steps it reads

    @property
    def decodes(self) -> bool:
        """Whether the step decodes (loads a target and a pool); train_policy only reads collected rows, so the
        overrides of decoding and of a pool's drafters do not reach it."""
        return self.command != "train_policy"


_DECLARED = itertools.count()  # declaration order: an upstream run is declared before the runs that read it


@dataclass(frozen=True, eq=False)
class Run:
    """A run directory, the command that writes it, its overrides at each scale it runs at, and the runs it reads
    (their directories are in its overrides: ``{root}/<dir>``, :func:`under_root`)."""

    dir: str
    command: str
    at: Mapping[str, tuple[str, ...]] = field(default_factory=dict)  # scale -> overrides
    reads: tuple[Run, ...] = ()
    order: int = field(default_factory=lambda: next(_DECLARED), init=False, repr=False)

    @property
    def paper(self) -> str:
        return self.dir.split("/", 1)[0]

    def reads_at(self, scale: str) -> tuple[Run, ...]:
        """The runs it reads that run at ``scale``."""
        return tuple(r for r in self.reads if scale in r.at)

    def step(self, scale: str) -> Step:
        return Step(
            self.paper,
            self.command,
            self.dir,
            tuple(self.at[scale]),
            tuple(r.dir for r in self.reads_at(scale)),
        )


def under_root(run: Run, file: str = "") -> str:
    """``{root}/<run dir>[/file]``: how an override names an upstream run (filled in by the plan)."""
    return "{root}/" + run.dir + (f"/{file}" if file else "")


# ---------------------------------------------------------------- shared override blocks
# held-out queries per task cell of every CPU-scale live policy eval (issue 56: 48, so a speed claim against
# autoregressive decoding decides at the effects these heads have; the verdicts need at least 16)
HELD_OUT = 48
# Table 1's live eval: the n its policy-against-autoregressive interval needs after Holm at the effect seen before
# (issue 67: about 130 a task; rows 12-141 of each source, within XSum's first 200 of the seeded shuffle, which no
# head trained on)
TABLE1_HELD_OUT = 130
# the collections behind Table 4's policy (at least 100 math queries to train on) and Fig. 2 / Table 6 (at least 80,
# so Fig. 2's validation fifth holds 16+ queries): their held-out evals read the rows after them
MATH_COLLECTED = 120
DEPTH_COLLECTED = 100
# Table 4's pool rule, fixed before the runs: a drafter whose acceptance on the collection's math rows is above the
# break-even of a 4-token head draft on this CPU (a round costs 1.08 steps of verification + 4 x 0.07 of drafting =
# 1.36 steps, so it pays from 0.36 accepted tokens a round: 0.09 of those drafted) speeds math up, so Table 4's
# premise (drafting alone slows math) would fail by construction of the pool
MATH_MAX_ACCEPTANCE = 0.09
# The paper's reward: alpha * alignment + (1 - alpha) * (1 - parameter cost), alpha 0.5. Its alignment is the ROUGE-L
# of the drafter's own output to the target's wherever every arm can generate alone (the early exits; every paper-scale
# drafter). The CPU-scale draft heads cannot (they draft on the target's features), so CPU Tables 1 and 4 measure each
# arm's alignment as the acceptance of its drafts along the target's greedy output (reward.alignment=acceptance).
PAPER_REWARD = ("reward.source=proxy", "reward.alpha=0.5", "reward.cost=params")
ACCEPTANCE_REWARD = (*PAPER_REWARD, "reward.alignment=acceptance")
# the paper's reward with each arm's measured cost: its speculative run's seconds per token over the target's
SPEED_REWARD = ("reward.source=proxy", "reward.alpha=0.5", "reward.cost=speed")
MEASURED = "collect.measure_speculative=true"
SPEC_BENCH = "dataset.path={questions}"
EXITS_CPU = "[small,early_exit_16,early_exit_24,quantized]"  # depths 2 (the small drafter, trained), 16, 24 (untrained exits), 30 (int8)
EXITS_PAPER = "[early_exit_4,early_exit_8,early_exit_12]"


def policy_eval(
    experiment: str, policy: Run, offset: int | None = None, *extra: str, held_out: int = HELD_OUT
) -> tuple[str, ...]:
    """A live eval of the policy trained in ``policy``: at CPU scale on the ``held_out`` queries after the
    collected ones (``offset``, per source); at paper scale on the experiment's eval split (offset None)."""
    rows = (f"dataset.offset={offset}", f"dataset.limit={held_out}") if offset is not None else ()
    return (
        f"experiment={experiment}",
        *rows,
        "selector=policy",
        f"policy.checkpoint={under_root(policy, 'policy.pt')}",
        *extra,
    )


# ---------------------------------------------------------------- Spec-Bench (paper scale)
SPEC_BENCH_EVAL = Run("spec_bench/eval", "eval", {"paper": ("experiment=spec_bench_vicuna", SPEC_BENCH)})

# ---------------------------------------------------------------- Huang et al.
# Table 1 (+ Fig. 3 from the same collection), Table 4, Table 6 (+ Fig. 2); each policy evaluated live on
# held-out queries (CPU: the rows after the collected ones; paper: the test split)
HUANG_COLLECT = Run(
    "huang/collect",
    "collect",
    {"cpu": ("experiment=reproduce_huang",), "paper": ("experiment=huang_t5", MEASURED)},
)
HUANG_POLICY = Run(
    "huang/policy",
    "train_policy",
    {
        "cpu": (
            f"data={under_root(HUANG_COLLECT)}",
            *ACCEPTANCE_REWARD,
            "train.arms=[eagle_translation,eagle_summarization]",
            "sweep.n_examples=[2,4,8,16,19]",
        ),
        "paper": (
            f"data={under_root(HUANG_COLLECT)}",
            *PAPER_REWARD,
            "train.arms=[t5_small,t5_small_xsum]",
            "sweep.n_examples=[30,100,300,1000,3000]",
        ),
    },
    reads=(HUANG_COLLECT,),
)
HUANG_EVAL = Run(
    "huang/eval",
    "eval",
    {
        "cpu": policy_eval("reproduce_huang", HUANG_POLICY, 12, held_out=TABLE1_HELD_OUT),
        "paper": policy_eval("huang_t5", HUANG_POLICY),
    },
    reads=(HUANG_POLICY,),
)
HUANG_MATH_COLLECT = Run(
    "huang/math/collect",
    "collect",
    {"cpu": ("experiment=reproduce_huang_math",), "paper": ("experiment=huang_gsm8k", MEASURED)},
)
HUANG_MATH_POLICY = Run(
    "huang/math/policy",
    "train_policy",
    {
        "cpu": (
            f"data={under_root(HUANG_MATH_COLLECT)}",
            *ACCEPTANCE_REWARD,
            f"train.max_acceptance={MATH_MAX_ACCEPTANCE}",
        ),
        "paper": (f"data={under_root(HUANG_MATH_COLLECT)}", *PAPER_REWARD),
    },
    reads=(HUANG_MATH_COLLECT,),
)
HUANG_MATH_POLICY_SPEED = Run(  # Table 4's policy trained on measured costs (replayed: no live eval)
    "huang/math/policy_speed",
    "train_policy",
    {
        "cpu": (
            f"data={under_root(HUANG_MATH_COLLECT)}",
            *SPEED_REWARD,
            "reward.alignment=acceptance",
            f"train.max_acceptance={MATH_MAX_ACCEPTANCE}",
        ),
        "paper": (f"data={under_root(HUANG_MATH_COLLECT)}", *SPEED_REWARD),
    },
    reads=(HUANG_MATH_COLLECT,),
)
HUANG_MATH_EVAL = Run(
    "huang/math/eval",
    "eval",
    {
        "cpu": policy_eval("reproduce_huang_math", HUANG_MATH_POLICY, MATH_COLLECTED),
        "paper": policy_eval("huang_gsm8k", HUANG_MATH_POLICY),
    },
    reads=(HUANG_MATH_POLICY,),
)
HUANG_DEPTH_COLLECT = Run(
    "huang/depth/collect",
    "collect",
    {"cpu": ("experiment=reproduce_huang_depth",), "paper": ("experiment=huang_early_exit", MEASURED)},
)


def depth_policy(directory: str, reward: tuple[str, ...], drafters_only: bool) -> Run:
    """A Table 6 policy trained on the depth collection with ``reward``: over the drafters only (``drafters_only``:
    without the autoregressive arm) or over every collected arm."""
    data = f"data={under_root(HUANG_DEPTH_COLLECT)}"
    return Run(
        directory,
        "train_policy",
        {
            scale: (data, *reward, *((f"train.arms={exits}",) if drafters_only else ()))
            for scale, exits in (("cpu", EXITS_CPU), ("paper", EXITS_PAPER))
        },
        reads=(HUANG_DEPTH_COLLECT,),
    )


HUANG_WITHOUT_AR = depth_policy("huang/depth/without_ar", PAPER_REWARD, drafters_only=True)
HUANG_WITH_AR = depth_policy("huang/depth/with_ar", PAPER_REWARD, drafters_only=False)
HUANG_EVAL_WITHOUT_AR = Run(
    "huang/depth/eval_without_ar",
    "eval",
    {
        "cpu": policy_eval("reproduce_huang_depth", HUANG_WITHOUT_AR, DEPTH_COLLECTED),
        "paper": policy_eval("huang_early_exit", HUANG_WITHOUT_AR),
    },
    reads=(HUANG_WITHOUT_AR,),
)
HUANG_EVAL_WITH_AR = Run(
    "huang/depth/eval_with_ar",
    "eval",
    {
        "cpu": policy_eval(
            "reproduce_huang_depth", HUANG_WITH_AR, DEPTH_COLLECTED, "methods=[autoregressive,selector]"
        ),
        "paper": policy_eval("huang_early_exit", HUANG_WITH_AR, None, "methods=[autoregressive,selector]"),
    },
    reads=(HUANG_WITH_AR,),
)
# Table 6 and Fig. 2 with each arm's measured cost (its speculative seconds per token over the target's, from the
# collection's measured runs) in place of the paper's parameter count: replayed on the validation queries
HUANG_WITHOUT_AR_SPEED = depth_policy("huang/depth/without_ar_speed", SPEED_REWARD, drafters_only=True)
HUANG_WITH_AR_SPEED = depth_policy("huang/depth/with_ar_speed", SPEED_REWARD, drafters_only=False)


def alpha_sweep(directory: str, *cost: str) -> Run:
    """Fig. 2's sweep over alpha (one policy per alpha) between the cheap and the better-aligned drafter; ``cost``:
    the reward's cost overrides (none: the paper's parameter count)."""
    return Run(
        directory,
        "train_policy",
        {
            scale: (
                f"data={under_root(HUANG_DEPTH_COLLECT)}",
                "reward.source=proxy",
                *cost,
                f"train.arms={arms}",
                "sweep.alpha=[0,0.2,0.4,0.5,0.6,0.8,1]",
            )
            for scale, arms in (("cpu", "[small,quantized]"), ("paper", "[early_exit_4,early_exit_12]"))
        },
        reads=(HUANG_DEPTH_COLLECT,),
    )


HUANG_ALPHA = alpha_sweep("huang/depth/alpha")
HUANG_ALPHA_SPEED = alpha_sweep("huang/depth/alpha_speed", "reward.cost=speed")

# ---------------------------------------------------------------- MetaSD
# CPU: the main table's mixed stream (+ heads, bandits, variance, convergence, full information, switching
# costs) and the non-stationary stream; paper: black-box, white-box, stream, multilingual
METASD_EVAL = Run(
    "metasd/eval",
    "eval",
    {"cpu": ("experiment=reproduce_metasd",), "paper": ("experiment=metasd_vicuna", SPEC_BENCH)},
)
METASD_EAGLE = Run("metasd/eagle", "eval", {"paper": ("experiment=metasd_vicuna_eagle", SPEC_BENCH)})
# the seed's own kind of pool, live: the five task specialists the only arms (issue 67)
METASD_SEED_LIVE = Run("metasd/seed_live", "eval", {"cpu": ("experiment=metasd_seed_cpu",)})
# token trees and the router on the white-box pool + prompt lookup (this project's multi-drafter methods)
METASD_TREES = Run("metasd/trees", "eval", {"paper": ("experiment=metasd_vicuna_trees", SPEC_BENCH)})
METASD_STREAM = Run(
    "metasd/stream",
    "eval",
    {
        "cpu": ("experiment=reproduce_metasd_stream",),
        "paper": ("experiment=metasd_vicuna_stream", SPEC_BENCH),
    },
)
LANGUAGES = {
    "ja": "opus100_ja_en",
    "ru": "wmt16_ru_en",
    "de": "wmt16_de_en",
    "fr": "wmt14_fr_en",
    "zh": "wmt19_zh_en",
}
METASD_MULTILINGUAL = {
    lang: Run(
        f"metasd/multilingual/{lang}",
        "eval",
        {"paper": ("experiment=metasd_vicuna_multilingual", f"dataset={name}")},
    )
    for lang, name in LANGUAGES.items()
}

# ---------------------------------------------------------------- speculative cascades
# CPU: quality vs speed, greedy and at temperature 1 (one point per rule: 16 queries cannot separate sampled quality
# finely); paper: each of the paper's task / model pairs
# greedy: translation on 64 queries (its separability premise decides whether it can be judged), and summarization
# on every XSum row the small drafter did not train on after the 16 the grid and metric were chosen on (rows 16-199 of
# the seeded shuffle: 184; issue 67 asked for about 350, which XSum's 200 held-out rows cannot give)
CASCADES_GREEDY = Run(
    "cascades/greedy", "cascades", {"cpu": ("experiment=cascades_cpu_local", "tasks=[translation]")}
)
CASCADES_SUMMARIZATION = Run(
    "cascades/summarization",
    "cascades",
    {"cpu": ("experiment=cascades_cpu_local", "tasks=[summarization]", "dataset.limit=184")},
)
CASCADES_SAMPLING = Run(
    "cascades/sampling",
    "cascades",
    {
        "cpu": (
            "experiment=cascades_cpu_local",
            "decoding=sampling",
            "decoding.temperature=1.0",
            "rules=[token_v3,lossy_sd,sequential]",
            "alphas.token_v3=[0.6]",
            "alphas.lossy_sd=[0.5]",
            "alphas.sequential=[0.6]",
            "dataset.limit=16",  # its speed verdicts are far from their threshold at 16 queries a task
        )
    },
)
PAPER_CASCADES = (
    "t5_wmt",
    "t5_xsum",
    "t5_cnndm",
    "gemma_gsm8k",
    "gemma27b_gsm8k",
)  # conf/experiment/cascades_<name>.yaml
CASCADES_PAPER = {
    name: Run(f"cascades/{name}", "cascades", {"paper": (f"experiment=cascades_{name}",)})
    for name in PAPER_CASCADES
}


def in_order(runs: Iterable[Run]) -> tuple[Run, ...]:
    """``runs`` (once each) in declaration order: upstream runs first."""
    return tuple(sorted(dict.fromkeys(runs), key=lambda r: r.order))


def steps_at(needed: Iterable[Run], scale: str) -> tuple[Step, ...]:
    """The plan at ``scale`` that writes every run of ``needed`` and the upstream runs they read, in declaration
    order (upstream runs first); a run without overrides at ``scale`` is left out."""
    chosen: set[Run] = set()
    todo = [r for r in needed if scale in r.at]
    while todo:
        run = todo.pop()
        if run not in chosen:
            chosen.add(run)
            todo.extend(run.reads_at(scale))
    return tuple(r.step(scale) for r in in_order(chosen))
