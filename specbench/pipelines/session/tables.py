"""The typed settings every command may hold, joined below the pipelines that read them: the ``KEYS`` tables of
decoding, cascade, the pool's own two keys, the target and datasets, and the sections of the two training commands
(``train.*`` is two things: train-policy's ``TrainConfig``, train-drafter's own). A pipeline whose config has a
section of its own (``collect.*``, ``trace.*``, ...) passes its ``KEYS`` to ``start_run``; ``pipelines.keys`` joins
every command's for the command line, the reproduction plan and the tests."""

from __future__ import annotations

from collections.abc import Mapping

from hydra.utils import get_object
from omegaconf import DictConfig

from specbench import drafters
from specbench.decoding import cascade, sampling
from specbench.models import target
from specbench.policy import model
from specbench.tasks import datasets
from specbench.training import trainees
from specbench.validate import Rule, schema, validate

TABLES = (
    sampling.KEYS,  # decoding.*
    cascade.KEYS,  # cascade.*
    drafters.KEYS,  # pool.drafters.<name>.draft_length / cost
    target.KEYS,  # target.*
    datasets.KEYS,  # dataset.*
)

# the sections the commands of pipelines/ above these modules read, by command (its config's name)
COMMANDS: dict[str, Mapping[str, Rule]] = {
    "train_policy": model.KEYS,  # train.* (TrainConfig's fields), reward.*, sweep.*
    "train_drafter": trainees.KEYS,  # drafter.*, its own train.*, eval_sets.*
}


def command_name(command: str | None) -> str | None:
    """A command as its config is named (``train-policy`` -> ``train_policy``)."""
    return str(command).replace("-", "_") if command else None


def rules(own: Mapping[str, Rule] | None = None) -> dict[str, Rule]:
    """The shared tables' key patterns, and ``own`` (a command's section)."""
    return schema(*TABLES, *([own] if own else []))


def check_config(cfg: DictConfig, own: Mapping[str, Rule] | None = None) -> None:
    """``validate`` ``cfg`` against the shared tables and ``own`` (the command's section), the keys each
    ``_target_`` class declares included."""
    validate(cfg, rules(own), locate=get_object)
