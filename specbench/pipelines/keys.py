"""Every command's typed keys, joined where the commands live: ``validate.SCHEMA`` (the keys no class reads), the
``KEYS`` table of each module that reads settings (decoding, cascade, the pool's own two, the target, datasets, the
training recipes, the commands' own sections), and, through each node's ``_target_``, the arguments each selector
class and drafter builder declares in its signature (``validate.declared``)."""

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
    model.KEYS,  # train-policy: train.*, reward.*, sweep.*
    trainees.KEYS,  # train-drafter: drafter.*, its own train.*, eval_sets.*
    collect.KEYS,  # collect.*, embedding.*
    profile.KEYS,  # profile.*
    trace.KEYS,  # trace.*
    replay.KEYS,  # replay.*, seeds, traces
)


def every_key() -> dict[str, Rule]:
    """Each typed key pattern of every command (the ``_target_`` classes' own keys are read per config)."""
    return schema(*TABLES)


def check(cfg: DictConfig) -> None:
    """``validate`` a composed config of any command against every typed key, the ``_target_`` classes' included."""
    validate(cfg, every_key(), locate=get_object)
