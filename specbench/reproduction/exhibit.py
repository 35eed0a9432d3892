"""The types of the reproduction report: an ``Exhibit`` (one reproduced table or figure: our numbers, the published
ones beside them, the paper's claims judged), the ``ExhibitSpec`` that declares it (its key, its builder, the runs it
reads, the published values it sets beside ours), and a ``Layout`` (what one scale's runs hold: which drafter plays
which part, the notes that name the models)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from specbench.reproduction import verdicts as V
from specbench.reproduction.inputs import unfinished
from specbench.reproduction.published import Published
from specbench.reproduction.runs import Run

MIXED_TASKS = ("translation", "summarization", "math", "chat", "code")  # the mixed stream's five

SPECIALISTS = {f"eagle_{t}": t for t in MIXED_TASKS}

GENERALIST = "eagle_general"


@dataclass(frozen=True)
class MetaRun:
    """One MetaSD eval run: its directory, the pool's specialists (drafter -> its task) and generalist,
    and the paper's name for UCB-BD in the published table."""

    run: Run
    key: str
    title: str
    specialists: dict[str, str]
    generalist: str | None
    ucb_row: str = ""
    setting: str = ""


@dataclass(frozen=True)
class CascadeRun:
    """One cascades run and the quality axis its exhibit plots."""

    run: Run
    title: str
    quality: str  # a column of cascade_points: agreement | rouge2_summarization | quality
    quality_label: str  # how the page names the quality ("": each task's column from the run's curves)
    greedy: bool = False

    @property
    def name(self) -> str:
        return self.run.dir.rsplit("/", 1)[-1]


PAPER_REWARD_NOTE = (
    "the paper's: alpha * alignment (ROUGE-L of the drafter's own output to the target's) + (1 - alpha) * "
    "(1 - cost) (parameters relative to the largest arm), alpha 0.5."
)

ACCEPTANCE_REWARD_NOTE = (
    "the paper's reward, alpha * alignment + (1 - alpha) * (1 - cost) (parameters relative to the "
    "largest arm), alpha 0.5, with each arm's alignment measured as the acceptance of its drafts "
    "along the target's greedy output (accepted / drafted tokens of its speculative run of the "
    "query; 1 for the target itself): the draft heads draft on the target's features and cannot "
    "generate alone, so the paper's ROUGE-L of a drafter's own output does not exist for them."
)


@dataclass(frozen=True)
class Layout:
    """What one scale's runs hold: the parts each drafter plays and the notes that name the models."""

    name: str  # the scale whose runs it describes: cpu | paper (runs.RUN_SCALES)
    scale: str  # figure titles: "CPU scale" | "paper scale"
    huang_pair: dict[str, tuple[str, str]]  # Table 1: drafter -> (its task, the paper's row)
    huang_models: str
    alpha_arms: tuple[str, str]  # Fig. 2: (cheap, better aligned)
    alpha_note: str
    depth_note: str
    training_note: str
    metasd: tuple[MetaRun, ...]
    tasks: tuple[str, ...] | None = MIXED_TASKS  # MetaSD columns (None: the run's own tasks, in its order)
    task_columns: dict[str, str] = field(default_factory=dict)  # our task -> the paper's column name
    stream_note: str = ""  # how the task changes in the non-stationary run
    held_out: str = "the"  # how many held-out queries the live policy evals read ("16 per source", ...)
    table1_reward: str = PAPER_REWARD_NOTE  # what Huang et al.'s policies train on, per table
    table4_reward: str = PAPER_REWARD_NOTE
    table6_reward: str = PAPER_REWARD_NOTE

    def meta(self, key: str) -> MetaRun:
        """The MetaSD run behind the exhibit ``key`` (``metasd/main``, ``metasd/whitebox``)."""
        return next(m for m in self.metasd if m.key == key)


# whose claims an exhibit judges: the seeds' (the three papers) or this project's own (full information for heads, the
# switching penalty): each family is corrected by Holm on its own, so the seeds' family-wise error covers their claims
SEED, PROJECT = "seed", "project"
FAMILIES = (SEED, PROJECT)


@dataclass
class Exhibit:
    """A built exhibit; its key and runs are its spec's (set by ``ExhibitSpec.__call__``)."""

    title: str
    table: pd.DataFrame
    verdicts: list[V.Verdict]
    notes: str = ""
    plot: Callable[[Path], None] | None = None
    key: str = ""  # "<paper>/<name>": where its files go
    runs: list[str] = field(default_factory=list)
    family: str = SEED  # whose claims it judges (``FAMILIES``): Holm's correction runs within a family
    judged: bool = True  # False: its verdicts are shown, not judged into any statement (a robustness row)
    scoped: list = field(
        default_factory=list
    )  # a statements exhibit's statements listed, not judged at this scale
    premises: dict = field(
        default_factory=dict
    )  # a statements exhibit's measured premises: (premise, part) -> value


Builder = Callable[[Path, list[Published], "Layout"], Exhibit]


@dataclass(frozen=True)
class ExhibitSpec:
    """One reproduced table or figure, declared: its key (``<paper>/<name>``: where its files go), its builder
    (``(root, published, layout) -> Exhibit``), the runs it reads (the plans are derived from these: an exhibit
    is in a scale's report and plan when every one of its runs runs at that scale) and the published values it
    sets beside ours (``published.yaml`` exhibit keys)."""

    key: str
    build: Builder
    runs: tuple[Run, ...]
    published: tuple[str, ...] = ()
    # only these scales, though its runs run at others too (None: every one)
    scales: tuple[str, ...] | None = None
    family: str = (
        SEED  # SEED: a claim of the papers reproduced; PROJECT: this project's own (corrected apart)
    )

    def at(self, scale: str) -> bool:
        return (self.scales is None or scale in self.scales) and all(scale in r.at for r in self.runs)

    def __call__(self, root: Path, published: list[Published], layout: Layout) -> Exhibit:
        ex = self.build(root, published, layout)
        ex.key, ex.runs, ex.family = self.key, [r.dir for r in self.runs], self.family
        return ex


def mark_unfinished(ex: Exhibit, root: Path) -> Exhibit:
    """An exhibit built on an unfinished run says so in its title and notes, and judges none of its claims."""
    found = [f"{run}: {why}" if run not in why else why for run in ex.runs if (why := unfinished(root, run))]
    if not found:
        return ex
    why = "; ".join(found)
    ex.title = f"{ex.title} ({why})"
    ex.verdicts = [V.unfinished(v, why) for v in ex.verdicts]
    ex.notes = (
        f"**Unfinished run** ({why}): the numbers are those of the finished part only, so no claim is judged "
        f"on them; rerun `specbench reproduce` to finish it. {ex.notes}"
    )
    return ex
