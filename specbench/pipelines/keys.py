"""Every command's typed keys, joined where the commands live: ``validate.SCHEMA`` (the keys no class reads), the
``KEYS`` table of each module that reads settings (decoding, cascade, the pool's own two, the target, datasets, the
commands' own sections), the sections one command alone reads (``COMMANDS``: the two training commands' ``train.*``
mean different things), and, through each node's ``_target_``, the arguments each selector class and drafter
builder declares in its signature (``validate.declared``)."""

from __future__ import annotations

from hydra.utils import get_object
from omegaconf import DictConfig

from specbench import drafters
from specbench.decoding import cascade, sampling
from specbench.models import target
from specbench.pipelines import collect, profile, replay, trace
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
    collect.KEYS,  # collect.*, embedding.*
    profile.KEYS,  # profile.*
    trace.KEYS,  # trace.*
    replay.KEYS,  # replay.*, seeds, traces
)


# the sections one command reads (its config's name: train_policy, ...); the same key may mean another thing elsewhere
COMMANDS = {
    "train_policy": model.KEYS,  # train.* (TrainConfig's fields), reward.*, sweep.*
    "train_drafter": trainees.KEYS,  # drafter.*, its own train.*, eval_sets.*
}


def every_key(command: str | None = None) -> dict[str, Rule]:
    """Each typed key pattern of ``command`` (a config name or the command's spelling, ``train-policy``; None: the
    keys every command shares). The ``_target_`` classes' own keys are read per config."""
    own = COMMANDS.get(str(command).replace("-", "_")) if command else None
    return schema(*TABLES, *([own] if own else []))


def check(cfg: DictConfig, command: str | None = None) -> None:
    """``validate`` a composed config of ``command`` against its typed keys, the ``_target_`` classes' included."""
    validate(cfg, every_key(command), locate=get_object)
