"""Every experiment config, run on the tiny in-process models: the refactor-regression fixture.

Each experiment of ``conf/experiment`` is composed against the root config of each command it is
meant for (``eval``, ``collect``, ``cascades``); then its target, pool and dataset are swapped for
tiny ones of the same family (decoder-only or encoder-decoder) and it runs greedily on one query
per task with a few new tokens. What must not change when the code is reshaped is recorded:
output ids and the counts of every generation (rounds, drafted, accepted, target calls, switches,
the arm of every round). Timing is not recorded.

    python -m tests.regression.capture --scenario KEY   # recaptures one scenario, printing what changed
    python -m tests.regression.capture --new            # captures the scenarios the fixture does not have yet
    python -m tests.regression.capture --all            # rewrites every scenario (only on purpose)

The fixture was captured before the pipeline refactor of issue 10; experiments added since
(``specialists_cost``) were captured when they were added.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf, open_dict

from specbench.configs import conf_dir

FIXTURE = Path(__file__).with_name("fixture.json")
ENCODER_DECODER = ("huang_t5", "cascades_t5")


def experiments() -> list[str]:
    """Every experiment but the CPU reproduction's (``reproduce_*``): those name the specialist heads,
    which the tiny swap cannot stand in for; ``tests/integration/test_reproduce.py`` runs them all."""
    return sorted(
        p.stem
        for p in (Path(conf_dir()) / "experiment").glob("*.yaml")
        if not p.stem.startswith("reproduce_")
    )


def commands_for(name: str) -> list[str]:
    if name.startswith(
        ("drafter", "trace", "routing")
    ):  # train-drafter recipes decode nothing: the paper-scale dry run covers
        return []  # them; traces (and the routing streams' traces) are tested by tests/integration/test_replay.py
    if name.startswith("cascades"):
        return ["cascades"]
    if name.startswith("huang"):
        return ["collect", "eval"]
    return ["eval"]


def tiny_config(name: str, command: str):
    """The experiment composed for ``command`` with tiny target, pool and dataset."""
    t5 = name.startswith(ENCODER_DECODER)
    with initialize_config_dir(config_dir=conf_dir(), version_base=None):
        cfg = compose(config_name=command, overrides=[f"experiment={name}"])
        tiny = compose(
            config_name=command,
            overrides=[
                f"target={'tiny_t5' if t5 else 'tiny_llama'}",
                f"pool={'tiny_t5_hf' if t5 else 'tiny_llama_hf'}",
                "dataset=embedded",
                *FOUR_TASKS,
            ],
        )
    with open_dict(cfg):
        cfg.target = tiny.target
        cfg.pool = tiny.pool
        cfg.dataset = tiny.dataset
        cfg.dataset.limit = 1
        cfg.decoding = tiny.decoding
        cfg.decoding.max_new_tokens = 12
        cfg.warmup.max_new_tokens = 2
        cfg.threads = None
        cfg.run_name = tiny.run_name  # where the run's folder goes: no part of its results
        if command == "cascades":
            cfg.drafter_arm = "tiny_draft"
            cfg.tasks = None
        if command == "collect":
            cfg.collect.max_new_tokens = 12
        if "policy" in cfg:
            cfg.policy.checkpoint = None
        stand_in_drafters(cfg)
    return cfg


def stand_in_drafters(cfg) -> None:
    """Methods and a composed selector that name drafters the tiny pool lacks (the shipped heads) name its
    model drafter ``tiny_draft`` instead (fixed:eagle_general -> fixed:tiny_draft, tree:prompt_lookup+eagle_math
    -> tree:prompt_lookup+tiny_draft, a router's fallback)."""
    arms = set(cfg.pool.get("drafters") or {})

    def sub(name: str) -> str:
        return name if name in arms or name in ("*", "autoregressive") else "tiny_draft"

    methods = []
    for m in (str(x) for x in cfg.get("methods") or []):
        if m.startswith("fixed:"):
            m = "fixed:" + sub(m[6:])
        elif m.startswith("tree:"):
            m = "tree:" + "+".join(dict.fromkeys(sub(x) for x in m[5:].split("+")))
        methods.append(m)
    if "methods" in cfg:
        cfg.methods = list(dict.fromkeys(methods))
    if cfg.get("selector") is not None and cfg.selector.get("fallback"):
        cfg.selector.fallback = sub(str(cfg.selector.fallback))
    common = cfg.get(
        "selector_overrides"
    )  # the candidates every selector:<name> method plays (metasd_seed_cpu)
    if common is not None and common.get("candidates") is not None:
        common.candidates = list(dict.fromkeys(sub(str(a)) for a in common.candidates))
    # a retrieval drafter the tiny pool lacks (the suffix drafter): prompt lookup stands in
    if (
        cfg.get("selector") is not None and "costs" in cfg.selector
    ):  # a cost-model budget: given costs, no clock
        cfg.selector.costs = {"verify": [0.01, 0.001], "draft": {a: 0.002 for a in arms}}
    for key in ("retrieval", "lookup"):
        if cfg.get("selector") is not None and cfg.selector.get(key) and str(cfg.selector[key]) not in arms:
            cfg.selector[key] = "prompt_lookup"
    for m in (str(x) for x in cfg.get("methods") or []):  # selector:<name> methods naming such drafters
        if m.startswith("selector:"):
            from specbench.configs import load_option

            option = load_option("selector", m[9:])
            own = {
                k: ("prompt_lookup" if k != "fallback" else sub(str(option[k])))
                for k in ("retrieval", "lookup", "fallback")
                if option.get(k) and str(option[k]) not in arms
            }
            if (
                "costs" in option
            ):  # a cost-model budget: given costs, no clock (as the selector method's above)
                own["costs"] = {"verify": [0.01, 0.001], "draft": {a: 0.002 for a in arms}}
            if own:
                cfg.selector_overrides = {**(cfg.get("selector_overrides") or {}), m[9:]: own}


# The fixture's scenarios were captured on the embedded suite's first four tasks; the code task (HumanEval,
# added with issue 20) has a scenario of its own (CODE), so every older capture stays comparable.
FOUR_TASKS = ("~dataset.sources.code",)
CODE = {"code_llama/eval": ("tiny_llama", "tiny_llama_hf"), "code_t5/eval": ("tiny_t5", "tiny_t5_hf")}


def code_config(key: str):
    target, pool = CODE[key]
    with initialize_config_dir(config_dir=conf_dir(), version_base=None):
        cfg = compose(
            config_name="eval",
            overrides=[
                f"target={target}",
                f"pool={pool}",
                "dataset=embedded",
                "dataset.limit=2",
                "~dataset.sources.translation",
                "~dataset.sources.summarization",
                "~dataset.sources.math",
                "~dataset.sources.chat",
                "decoding.max_new_tokens=24",
                "warmup.max_new_tokens=2",
                "methods=[autoregressive,fixed:*,selector:ucb]",
            ],
        )
    with open_dict(cfg):
        cfg.threads = None
    return cfg


GEN_KEYS = (
    "query_id",
    "method",
    "output_ids",
    "rounds",
    "drafted",
    "accepted",
    "target_calls",
    "switches",
    "stop",
)


# Scenarios of their own (not experiments): long enough for the bandits to leave exploration (96 tokens at
# draft length 2: 30-50 rounds a query), and different from each other (family, decoding, selectors).
LONG_SELECTORS = [
    "autoregressive",
    "selector:ucb",
    "selector:exp3",
    "selector:hedge",
    "selector:discounted_ucb",
    "selector:sequential_halving",
    "selector:etc",
]
LONG = {
    "long_bandits_llama/eval": ("tiny_llama", "tiny_llama_hf", "greedy"),
    "long_bandits_llama_sampling/eval": ("tiny_llama", "tiny_llama_hf", "sampling"),
    "long_bandits_t5/eval": ("tiny_t5", "tiny_t5_hf", "greedy"),
}


def sampled(key: str) -> bool:
    """Whether a scenario samples (its outputs depend on the CPU's rounding, not only on the code)."""
    return key in LONG and LONG[key][2] == "sampling"


def long_config(key: str):
    target, pool, decoding = LONG[key]
    with initialize_config_dir(config_dir=conf_dir(), version_base=None):
        cfg = compose(
            config_name="eval",
            overrides=[
                f"target={target}",
                f"pool={pool}",
                "dataset=embedded",
                *FOUR_TASKS,
                f"decoding={decoding}",
                "dataset.limit=1",
                "decoding.max_new_tokens=96",
                "decoding.draft_length=2",
                "warmup.max_new_tokens=2",
                f"methods=[{','.join(LONG_SELECTORS)}]",
            ],
        )
    with open_dict(cfg):
        cfg.threads = None
    return cfg


def unique_scenarios(names: list[str] | None = None) -> dict[str, object]:
    """``{"<experiment>/<command>": tiny config}``, one per distinct tiny config (many experiments
    differ only in what the tiny swap replaces), then the long bandit scenarios (:data:`LONG`). Of experiments
    with one tiny config, the one the fixture already records names it, so a new experiment that adds no new
    config does not rename a recorded scenario."""
    recorded = (
        {key.split("/", 1)[0] for key in json.loads(FIXTURE.read_text())} if FIXTURE.exists() else set()
    )
    seen, out = set(), {}
    for name in sorted(names or experiments(), key=lambda n: (n not in recorded, n)):
        for command in commands_for(name):
            cfg = tiny_config(name, command)
            key = command + OmegaConf.to_yaml(cfg)
            if key not in seen:
                seen.add(key)
                out[f"{name}/{command}"] = cfg
    if names is None:
        out.update((key, long_config(key)) for key in LONG)
        out.update((key, code_config(key)) for key in CODE)
    return out


def versions() -> dict[str, str]:
    """The library versions a capture ran with (recorded in the fixture as ``_meta``)."""
    import platform

    import torch
    import transformers

    return {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
    }


def run_scenario(cfg, command: str, out: Path) -> dict:
    if command == "collect":
        from specbench.pipelines import collect

        collect.run(cfg, out)
        rows = [
            json.loads(x) for f in sorted(out.glob("rows*.jsonl")) for x in f.read_text().splitlines() if x
        ]
        return {
            r["query_id"]: {
                "target": r["target"]["tokens"],
                "arms": {
                    a: {k: v for k, v in rec.items() if k in ("new_tokens", "text", "spec_calls")}
                    | (
                        {"spec": {k: rec["spec"][k] for k in ("target_calls", "new_tokens", "exact_match")}}
                        if rec.get("spec")
                        else {}
                    )
                    for a, rec in sorted(r["arms"].items())
                },
            }
            for r in rows
        }
    if command == "cascades":
        from specbench.pipelines import cascades as pipeline
    else:
        from specbench.pipelines import evaluate as pipeline
    pipeline.run(cfg, out)
    examples = [json.loads(x) for x in (out / "examples.jsonl").read_text().splitlines() if x]
    rounds = [json.loads(x) for x in (out / "rounds.jsonl").read_text().splitlines() if x]
    arms: dict[tuple, list] = {}
    for r in rounds:
        arms.setdefault((r["query_id"], r["method"]), []).append(r["arm"])
    return {
        f"{e['query_id']}|{e['method']}": {
            **{k: e.get(k) for k in GEN_KEYS},
            "arms": arms.get((e["query_id"], e["method"]), []),
        }
        for e in examples
    }


def capture(names: list[str] | None = None, keys: list[str] | None = None) -> dict:
    """The records of every scenario (or of the scenario ``keys`` only)."""
    import torch

    torch.set_num_threads(1)
    result = {}
    for key, cfg in unique_scenarios(names).items():
        if keys is not None and key not in keys:
            continue
        with tempfile.TemporaryDirectory() as tmp:
            result[key] = run_scenario(cfg, key.split("/")[1], Path(tmp))
    return result
