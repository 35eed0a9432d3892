"""``specbench reproduce``: every reproduction of a profile, end to end, into one root, then the report.

Each step is one of our commands with an experiment config and a fixed run directory under the
root (``<paper>/...``). A finished step leaves ``.done`` in its directory and is skipped on a
rerun; an interrupted one resumes through its command's own resume (eval, collect and cascades
skip finished generations). Profiles:

- ``cpu``: the CPU-scale plan on the embedded SmolLM2 with the specialist pool (``make reproduce-cpu``);
- ``tiny``: the same plan on the tiny random Llama with a few tokens per query (a dry run: everything
  but the weights, in a couple of minutes);
- ``paper``: the paper-scale experiments (GPU, hub; ``make reproduce-paper``), in the same directory
  layout where the papers overlap (``huang/...``, ``metasd/eval``, ``metasd/stream``) plus their own
  (``spec_bench/eval``, ``metasd/eagle``, ``metasd/multilingual/<language>``, ``cascades/<experiment>``).

The root records its profile's report layout (``reproduce.json``), so ``specbench report ROOT``
builds that layout's exhibits.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from hydra import compose, initialize_config_dir

from specbench.configs import conf_dir
from specbench.errors import SpecbenchError
from specbench.reproduction.exhibits import PAPER as PAPER_LAYOUT

log = logging.getLogger(__name__)
DONE = ".done"


@dataclass(frozen=True)
class Step:
    paper: str
    command: str  # a root config: eval | collect | train_policy | cascades
    run: str  # run directory, relative to the root
    overrides: tuple[str, ...] = ()  # {root} and {questions} are filled in


HUANG_ARMS = "train.arms=[eagle_translation,eagle_summarization]"
EXITS = "[early_exit_8,early_exit_16,early_exit_24]"

CPU: tuple[Step, ...] = (
    # Huang et al.: Table 1 (+ Fig. 3 from the same collection), Table 4, Table 6 (+ Fig. 2)
    Step("huang", "collect", "huang/collect", ("+experiment=reproduce_huang",)),
    Step("huang", "train_policy", "huang/policy", ("data={root}/huang/collect", "reward.source=measured", HUANG_ARMS,
                                                   "sweep.n_examples=[2,4,8,16,19]")),
    Step("huang", "eval", "huang/eval", ("+experiment=reproduce_huang", "dataset.offset=12", "dataset.limit=3",
                                         "selector=policy", "policy.checkpoint={root}/huang/policy/policy.pt")),
    Step("huang", "collect", "huang/math/collect", ("+experiment=reproduce_huang_math",)),
    Step("huang", "train_policy", "huang/math/policy", ("data={root}/huang/math/collect", "reward.source=measured")),
    Step("huang", "collect", "huang/depth/collect", ("+experiment=reproduce_huang_depth",)),
    Step("huang", "train_policy", "huang/depth/without_ar", ("data={root}/huang/depth/collect", "reward.source=measured",
                                                             f"train.arms={EXITS}")),
    Step("huang", "train_policy", "huang/depth/with_ar", ("data={root}/huang/depth/collect", "reward.source=measured")),
    Step("huang", "train_policy", "huang/depth/alpha", ("data={root}/huang/depth/collect", "reward.source=proxy",
                                                        "train.arms=[early_exit_8,early_exit_24]",
                                                        "sweep.alpha=[0,0.2,0.4,0.5,0.6,0.8,1]")),
    # MetaSD: main table (+ heads, convergence, switching cost), non-stationary stream
    Step("metasd", "eval", "metasd/eval", ("+experiment=reproduce_metasd",)),
    Step("metasd", "eval", "metasd/stream", ("+experiment=reproduce_metasd_stream",)),
    # Speculative cascades: quality vs speed, greedy and at temperature 1
    Step("cascades", "cascades", "cascades/greedy", ("+experiment=cascades_cpu_local",)),
    Step("cascades", "cascades", "cascades/sampling", ("+experiment=cascades_cpu_local", "decoding=sampling",
                                                       "decoding.temperature=1.0",
                                                       "rules=[chow,diff,opt,token_v1,token_v2,token_v3,lossy_sd]")),
)

# The dry run: the same plan on the tiny Llama (its eagle heads must be in $SPECBENCH_CACHE under the
# specialists' names), enough rows for a policy, a few tokens per generation.
DECODE_TINY = ("target=tiny_llama", "decoding.max_new_tokens=6", "warmup.max_new_tokens=2", "threads=1")
TINY: dict[str, tuple[str, ...]] = {
    "collect": (*DECODE_TINY, "collect.max_new_tokens=6", "dataset.limit=6"),
    "eval": (*DECODE_TINY, "dataset.limit=1"),
    "cascades": (*DECODE_TINY, "dataset.limit=1", "pool.drafters.early_exit_12.layers=1",
                 "pool.drafters.early_exit_16.layers=2", "pool.drafters.early_exit_20.layers=3"),
    "train_policy": ("train.epochs=5",),
    "huang/depth/collect": ("pool.drafters.early_exit_8.layers=1", "pool.drafters.early_exit_16.layers=2",
                            "pool.drafters.early_exit_24.layers=3", "dataset.limit=12"),
    "huang/math/collect": ("dataset.limit=12",),
}

# Paper scale: every experiment of `make reproduce-paper` (README "Paper-scale experiments"), the
# drafters built first by `make paper-drafters`. Collect and eval read disjoint splits (`splits`).
SPEC_BENCH = "dataset.path={questions}"
MEASURED = "collect.measure_speculative=true"
LANGUAGES = {"ja": "opus100_ja_en", "ru": "wmt16_ru_en", "de": "wmt16_de_en", "fr": "wmt14_fr_en", "zh": "wmt19_zh_en"}
CASCADES = tuple(run.name for run in PAPER_LAYOUT.cascades)  # conf/experiment/cascades_<name>.yaml
PAPER: tuple[Step, ...] = (
    Step("spec_bench", "eval", "spec_bench/eval", ("+experiment=spec_bench_vicuna", SPEC_BENCH)),
    # Huang et al.: Table 1 (+ Fig. 3), Table 4 (the paper's model family), Table 6 (+ Fig. 2)
    Step("huang", "collect", "huang/collect", ("+experiment=huang_t5", MEASURED)),
    Step("huang", "train_policy", "huang/policy", ("data={root}/huang/collect", "reward.source=measured",
                                                   "sweep.n_examples=[30,100,300,1000,3000]")),
    Step("huang", "eval", "huang/eval", ("+experiment=huang_t5", "selector=policy",
                                         "policy.checkpoint={root}/huang/policy/policy.pt")),
    Step("huang", "collect", "huang/math/collect", ("+experiment=huang_gsm8k", MEASURED)),
    Step("huang", "train_policy", "huang/math/policy", ("data={root}/huang/math/collect", "reward.source=measured")),
    Step("huang", "collect", "huang/depth/collect", ("+experiment=huang_early_exit", MEASURED)),
    Step("huang", "train_policy", "huang/depth/without_ar", ("data={root}/huang/depth/collect", "reward.source=measured",
                                                             "train.arms=[early_exit_4,early_exit_8,early_exit_12]")),
    Step("huang", "train_policy", "huang/depth/with_ar", ("data={root}/huang/depth/collect", "reward.source=measured")),
    Step("huang", "train_policy", "huang/depth/alpha", ("data={root}/huang/depth/collect", "reward.source=proxy",
                                                        "train.arms=[early_exit_4,early_exit_12]",
                                                        "sweep.alpha=[0,0.2,0.4,0.5,0.6,0.8,1]")),
    # MetaSD: black-box (main table, heads, convergence, switching cost), white-box, stream, multilingual
    Step("metasd", "eval", "metasd/eval", ("+experiment=metasd_vicuna", SPEC_BENCH)),
    Step("metasd", "eval", "metasd/eagle", ("+experiment=metasd_vicuna_eagle", SPEC_BENCH)),
    Step("metasd", "eval", "metasd/stream", ("+experiment=metasd_vicuna_stream", SPEC_BENCH)),
    *(Step("metasd", "eval", f"metasd/multilingual/{lang}", ("+experiment=metasd_vicuna_multilingual", f"dataset={name}"))
      for lang, name in LANGUAGES.items()),
    # Speculative cascades: each of the paper's task / model pairs, temperature sampling
    *(Step("cascades", "cascades", f"cascades/{name}", (f"+experiment=cascades_{name}",)) for name in CASCADES),
)


@dataclass(frozen=True)
class Profile:
    steps: tuple[Step, ...]
    layout: str  # the report layout (exhibits.LAYOUTS)
    overrides: dict[str, tuple[str, ...]] = field(default_factory=dict)  # by command or run directory


PROFILES = {"cpu": Profile(CPU, "cpu"), "tiny": Profile(CPU, "cpu", TINY), "paper": Profile(PAPER, "paper")}
QUESTIONS = "data/spec_bench/question.jsonl"  # Spec-Bench's question.jsonl (`make reproduce-paper` downloads it)


def overrides_of(step: Step, root: Path, profile: Profile, extra: list[str], questions: str = QUESTIONS) -> list[str]:
    """The step's overrides, the profile's, then ``extra`` (on the decoding commands: train-policy only reads rows)."""
    own = [o.format(root=root, questions=questions) for o in step.overrides]
    return [*own, *profile.overrides.get(step.command, ()), *profile.overrides.get(step.run, ()),
            *(extra if step.command != "train_policy" else ())]


def pipeline(command: str):
    from specbench.pipelines import cascades, collect, evaluate, train_policy

    return {"eval": evaluate.run, "collect": collect.run, "train_policy": train_policy.run, "cascades": cascades.run}[command]


def run(root: str | Path, profile: str = "cpu", papers: list[str] | None = None, extra: list[str] | None = None,
        questions: str = QUESTIONS, adapt: Callable[[Step, object], None] | None = None) -> Path:
    """Run every step of ``profile`` not done yet (in order), then write the report; return the report
    directory. ``adapt(step, cfg)``, when given, may change each composed config before it runs (the
    paper-scale dry run swaps in tiny stand-in models)."""
    from specbench.reproduction import render

    if profile not in PROFILES:
        raise SpecbenchError(f"unknown reproduce profile '{profile}'", f"use one of: {', '.join(PROFILES)}")
    prof = PROFILES[profile]
    steps = prof.steps
    known = {s.paper for s in steps}
    unknown = sorted(set(papers or []) - known)
    if unknown:
        raise SpecbenchError(f"unknown paper(s) {', '.join(unknown)}", f"use some of: {', '.join(sorted(known))}")
    root = Path(root)
    chosen = [s for s in steps if not papers or s.paper in papers]
    if any(SPEC_BENCH in s.overrides for s in chosen) and not Path(questions).is_file():
        raise SpecbenchError(f"no Spec-Bench question file {questions}",
                             "download it (`make data/spec_bench/question.jsonl`, from github.com/hemingkx/Spec-Bench) "
                             "or pass --questions <question.jsonl>")
    record = root / render.LAYOUT_FILE
    if render.recorded(root).get("profile") not in (profile, None):
        raise SpecbenchError(f"{root} holds the runs of another profile ({record})",
                             "use another --root for this profile, or delete that root to start over")
    root.mkdir(parents=True, exist_ok=True)
    record.write_text(json.dumps({"profile": profile, "layout": prof.layout}) + "\n", encoding="utf-8")
    started = time.perf_counter()
    for i, step in enumerate(chosen, 1):
        out = root / step.run
        if (out / DONE).exists():
            log.info("[%d/%d] %s: done before, skipped", i, len(chosen), step.run)
            continue
        overrides = overrides_of(step, root, prof, list(extra or []), questions)
        print(f"\n[{i}/{len(chosen)}] specbench {step.command.replace('_', '-')} {' '.join(overrides)}  -> {out}",
              flush=True)
        with initialize_config_dir(config_dir=conf_dir(), version_base=None):
            cfg = compose(config_name=step.command, overrides=overrides)
        if adapt is not None:
            adapt(step, cfg)
        t0 = time.perf_counter()
        pipeline(step.command)(cfg, out)
        (out / DONE).write_text(f"{time.perf_counter() - t0:.1f} s\n")
    print(f"\nreproduce: {len(chosen)} steps, {time.perf_counter() - started:.0f} s in this call", flush=True)
    return render.write(root)
