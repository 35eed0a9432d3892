"""Every experiment config composes with the commands it is meant for (no model is loaded, nothing
is downloaded): paper-scale configs are for users with GPUs and hub access, so this is the check
that they stay runnable as the code changes. Also: the shared run directories of every command,
and ``specbench.configs.load_option`` (a group option read by name, as Hydra composes it)."""

from __future__ import annotations

from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from specbench.configs import conf_dir, group_options, load_option
from specbench.errors import SpecbenchError
from tests.experiments import commands_for, experiments

EXPERIMENTS = experiments()
# root config -> its run directories: outputs/<name>/<time>, outputs/multirun/<name>/<time>/<job>
RUN_NAMES = {
    "eval": "eval",
    "bench": "bench",
    "cascades": "cascades",
    "collect": "collect",
    "profile": "profile",
    "train_policy": "policy",
    "trace": "trace",
    "replay": "replay",
}
# every group whose options are plain configs (experiments are _global_ and hydra/ is Hydra's)
GROUPS = sorted(
    p.name for p in Path(conf_dir()).iterdir() if p.is_dir() and p.name not in ("experiment", "hydra")
)


def compose_config(config_name: str | None, overrides: list[str], hydra: bool = False):
    with initialize_config_dir(config_dir=conf_dir(), version_base=None):
        return compose(config_name=config_name, overrides=overrides, return_hydra_config=hydra)


@pytest.mark.parametrize("name", EXPERIMENTS)
def test_experiment_composes(name):
    for command in commands_for(name):
        cfg = compose_config(command, [f"experiment={name}"])
        # resolve everything but the values a user must supply (???)
        container = OmegaConf.to_container(cfg, resolve=False)
        assert container["target"]["model"]
        if command == "train_drafter":
            assert cfg.name and cfg.drafter.kind, f"{name}: a drafter recipe names its checkpoint and kind"
            continue
        assert cfg.pool.drafters is not None or name.endswith("none")
        for key, drafter in (cfg.pool.drafters or {}).items():
            assert "_target_" in drafter, f"{name}: drafter {key} has no _target_"
        if command == "eval":
            methods = list(cfg.methods)
            assert "autoregressive" in methods
            for spec in methods:
                if spec.startswith("selector:"):
                    assert spec.split(":", 1)[1] in group_options("selector"), f"{name}: {spec}"
        if command == "cascades":
            assert cfg.drafter_arm in cfg.pool.drafters, (
                f"{name}: drafter_arm {cfg.drafter_arm} not in the pool"
            )
            for rule in cfg.rules:
                assert list(cfg.alphas[rule]), f"{name}: rule {rule} has no alphas"
            # issue 56: every cascade verdict is paired with the sequential cascade, so each config runs it
            assert "sequential" in cfg.rules, (
                f"{name}: no sequential cascade (its verdicts would be unpaired)"
            )


@pytest.mark.parametrize("root, run_name", sorted(RUN_NAMES.items()))
def test_run_directories_per_command(root, run_name):
    """conf/hydra/run_dirs.yaml, shared: each command keeps its own folder under outputs/."""
    cfg = compose_config(root, [], hydra=True)
    assert cfg.run_name == run_name
    assert cfg.hydra.run.dir.startswith(f"outputs/{run_name}/")
    assert cfg.hydra.sweep.dir.startswith(f"outputs/multirun/{run_name}/")
    assert OmegaConf.to_container(cfg.hydra.sweep, resolve=False)["subdir"] == "${hydra.job.num}"
    assert cfg.hydra.job.chdir is False


@pytest.mark.parametrize(
    "name",
    [n for n in EXPERIMENTS if "hydra" in OmegaConf.load(Path(conf_dir()) / "experiment" / f"{n}.yaml")],
)
def test_experiment_run_directory_overrides_the_shared_one(name):
    for command in commands_for(name):
        cfg = compose_config(command, [f"experiment={name}"], hydra=True)
        assert cfg.hydra.run.dir.startswith(f"outputs/{name}/")
        assert cfg.hydra.sweep.dir.startswith(f"outputs/multirun/{RUN_NAMES[command]}/")


@pytest.mark.parametrize("group, name", [(g, n) for g in GROUPS for n in group_options(g)])
def test_load_option_is_what_hydra_composes(group, name):
    """load_option(group, name) == the `group` node Hydra composes for `group=name` (selector
    options include selector/base/bandit through their defaults; pools include drafters)."""
    mine = OmegaConf.to_container(load_option(group, name), resolve=False)
    composed = compose_config(None, [f"+{group}={name}"])
    assert mine == OmegaConf.to_container(composed[group], resolve=False)
    assert "defaults" not in mine


def test_selector_options_share_the_bandit_base():
    assert "base" not in group_options("selector") and "bandit" not in group_options("selector")
    base = OmegaConf.to_container(OmegaConf.load(Path(conf_dir()) / "selector" / "base" / "bandit.yaml"))
    bandits = [
        n
        for n in group_options("selector")
        if n
        not in (
            "fixed",
            "policy",
            "router",
            "router_tree",
            "router_sam",
            "router_suffix",
            "budget",
            "budget_by_task",
            "budget_by_query",
            "budget_kept",
        )
    ]
    assert len(bandits) == 16  # 13 bandits (ucb_carry too), hedge, and the tree subset selectors
    for name in bandits:
        cfg = load_option("selector", name)
        assert set(base) <= set(cfg), name
        assert cfg._target_.startswith("specbench.selection.")
    assert load_option("selector", "ucb").reward == "bd"
    assert load_option("selector", "ucb_be").reward == "be"
    assert load_option("selector", "ucb_full_info").full_information is True
    assert load_option("selector", "exp3").full_information is False


def test_load_option_unknown_name():
    with pytest.raises(SpecbenchError, match="no selector config named 'nope'"):
        load_option("selector", "nope")


def _splits(dataset) -> set[str]:
    return {str(src.split) for src in (dataset.sources or {}).values() if src is not None}


@pytest.mark.parametrize(
    "name",
    [
        n
        for n in EXPERIMENTS
        if n.startswith("huang")
        and not n.startswith("huang_cpu")
        and {"collect", "eval"} <= set(commands_for(n))
    ],
)  # huang_fig3: trace and collect
def test_context_aware_experiments_collect_and_evaluate_disjoint_splits_at_one_length(name):
    """huang_*: collect reads the train splits and eval the test splits (disjoint queries), and both decode
    the same number of new tokens."""
    collected, evaluated = (compose_config(c, [f"experiment={name}"]) for c in ("collect", "eval"))
    assert _splits(collected.dataset) == {"train"} and _splits(evaluated.dataset) == {"test"}
    assert (
        collected.collect.max_new_tokens or collected.decoding.max_new_tokens
    ) == evaluated.decoding.max_new_tokens


def test_gemma_cascades_use_few_shot_prompts_and_a_27b_target():
    nine, big = (
        compose_config("cascades", [f"experiment={n}"])
        for n in ("cascades_gemma_gsm8k", "cascades_gemma27b_gsm8k")
    )
    assert nine.dataset.n_shot == big.dataset.n_shot == 8
    assert (nine.target.model, big.target.model) == ("google/gemma-2-9b-it", "google/gemma-2-27b-it")
    assert big.pool.drafters.gemma_2b.model == "google/gemma-2-2b-it"
