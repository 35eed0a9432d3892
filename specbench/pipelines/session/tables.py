"""The typed sections every command may hold, joined below the pipelines that read them: each section of a config
(``decoding``, ``cascade``, ``pool``, ``target``, ``dataset``; the training commands' own) mounted with the
dataclasses that declare its keys beside the code that reads them (``validate.section``: a field
``Annotated[type, rule]`` per key; the YAML under conf/ holds the defaults, as for a structured config in Hydra's
ConfigStore). ``train.*`` is two things: train-policy's ``TrainConfig``, train-drafter's ``Recipe``. A pipeline whose
config has a section of its own (``collect.*``, ``trace.*``, ...) passes its ``SECTIONS`` to ``start_run``;
``pipelines.keys`` joins every command's for the command line, the reproduction plan and the tests."""

from __future__ import annotations

from hydra.utils import get_object
from omegaconf import DictConfig

from specbench.decoding.cascade import Cascade
from specbench.decoding.sampling import DECODING
from specbench.drafters import PoolSettings
from specbench.models.target import TargetSettings, TemplateSets
from specbench.policy import model
from specbench.tasks.datasets import DatasetSettings
from specbench.training import recipe
from specbench.validate import Rule, Sections, schema, tables, validate

SHARED: Sections = {
    "decoding": DECODING,  # SamplingParams, Limits, SpecOptions
    "cascade": (Cascade,),
    "pool": (PoolSettings,),  # pool.drafters.<name>.draft_length / cost (a builder's own: its signature)
    "target": (TargetSettings,),
    "": (TemplateSets,),  # templates.<set>.<task kind>
    "dataset": (DatasetSettings,),
}

# the sections the commands of pipelines/ above these modules read, by command (its config's name)
COMMANDS: dict[str, Sections] = {
    "train_policy": model.SECTIONS,  # train.* (TrainConfig, TrainData), reward.* (RewardSpec), sweep.*
    "train_drafter": recipe.SECTIONS,  # drafter.*, its own train.* (Recipe), eval_sets.*
}


def command_name(command: str | None) -> str | None:
    """A command as its config is named (``train-policy`` -> ``train_policy``)."""
    return str(command).replace("-", "_") if command else None


def rules(own: Sections | None = None) -> dict[str, Rule]:
    """The shared sections' key patterns, and ``own``'s (a command's sections)."""
    return schema(*tables(SHARED), *tables(own or {}))


def check_config(cfg: DictConfig, own: Sections | None = None) -> None:
    """``validate`` ``cfg`` against the shared sections and ``own`` (the command's), the keys each ``_target_`` class
    declares included."""
    validate(cfg, rules(own), locate=get_object)
