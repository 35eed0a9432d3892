"""``specbench reproduce``: every CPU-scale reproduction, end to end, into one root, then the report.

Each step is one of our commands with an experiment config and a fixed run directory under the
root (``<paper>/...``). A finished step leaves ``.done`` in its directory and is skipped on a
rerun; an interrupted one resumes through its command's own resume (eval, collect and cascades
skip finished generations). ``profile=tiny`` runs the same plan on the tiny random Llama with a
few tokens per query (a dry run: everything but the weights, in a couple of minutes).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from pathlib import Path

from hydra import compose, initialize_config_dir

from specbench.configs import conf_dir
from specbench.errors import SpecbenchError

log = logging.getLogger(__name__)
DONE = ".done"


@dataclass(frozen=True)
class Step:
    paper: str
    command: str  # a root config: eval | collect | train_policy | cascades
    run: str  # run directory, relative to the root
    overrides: tuple[str, ...] = ()


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
PROFILES = {"cpu": {}, "tiny": TINY}


def overrides_of(step: Step, root: Path, profile: dict, extra: list[str]) -> list[str]:
    return [*(o.format(root=root) for o in step.overrides), *profile.get(step.command, ()),
            *profile.get(step.run, ()), *extra]


def pipeline(command: str):
    from specbench.pipelines import cascades, collect, evaluate, train_policy

    return {"eval": evaluate.run, "collect": collect.run, "train_policy": train_policy.run, "cascades": cascades.run}[command]


def run(root: str | Path, profile: str = "cpu", papers: list[str] | None = None, extra: list[str] | None = None,
        steps: tuple[Step, ...] = CPU) -> Path:
    """Run every step not done yet (in order), then write the report; return the report directory."""
    from specbench.reproduction import render

    if profile not in PROFILES:
        raise SpecbenchError(f"unknown reproduce profile '{profile}'", f"use one of: {', '.join(PROFILES)}")
    known = {s.paper for s in steps}
    unknown = sorted(set(papers or []) - known)
    if unknown:
        raise SpecbenchError(f"unknown paper(s) {', '.join(unknown)}", f"use some of: {', '.join(sorted(known))}")
    root = Path(root)
    chosen = [s for s in steps if not papers or s.paper in papers]
    started = time.perf_counter()
    for i, step in enumerate(chosen, 1):
        out = root / step.run
        if (out / DONE).exists():
            log.info("[%d/%d] %s: done before, skipped", i, len(chosen), step.run)
            continue
        overrides = overrides_of(step, root, PROFILES[profile], list(extra or []))
        print(f"\n[{i}/{len(chosen)}] specbench {step.command.replace('_', '-')} {' '.join(overrides)}  -> {out}",
              flush=True)
        with initialize_config_dir(config_dir=conf_dir(), version_base=None):
            cfg = compose(config_name=step.command, overrides=overrides)
        t0 = time.perf_counter()
        pipeline(step.command)(cfg, out)
        (out / DONE).write_text(f"{time.perf_counter() - t0:.1f} s\n")
    print(f"\nreproduce: {len(chosen)} steps, {time.perf_counter() - started:.0f} s in this call", flush=True)
    return render.write(root)
