"""Every command's typed keys, joined where the commands live: ``validate.SCHEMA`` (the keys no class reads), the
shared sections (``session.tables``: decoding, cascade, the pool's own two, the target, datasets), each command's
own sections (``SECTIONS``: the two training commands' ``train.*`` mean different things; ``collect.*``,
``profile.*``, ``trace.*``, ``replay.*`` declared by dataclasses beside the pipelines that read them), and, through
each node's ``_target_``, the arguments each selector class and drafter builder declares in its signature
(``validate.declared``). What the command line, the reproduction plan and the tests check a config against; a
pipeline's door (``start_run``) checks the same with its own section."""

from __future__ import annotations

from omegaconf import DictConfig

from specbench.pipelines import collect, profile, replay, trace
from specbench.pipelines.session.tables import COMMANDS, check_config, command_name, rules
from specbench.validate import Rule, Sections

# each command's own section, by command (its config's name)
SECTIONS: dict[str, Sections] = {
    **COMMANDS,
    "collect": collect.SECTIONS,  # collect.*, embedding.*
    "profile": profile.SECTIONS,  # profile.*
    "trace": trace.SECTIONS,  # trace.*
    "replay": replay.SECTIONS,  # replay.*, seeds, traces
}


def every_key(command: str | None = None) -> dict[str, Rule]:
    """Each typed key pattern of ``command`` (a config name or the command's spelling, ``train-policy``; None: the
    keys every command shares). The ``_target_`` classes' own keys are read per config."""
    return rules(SECTIONS.get(command_name(command) or ""))


def check(cfg: DictConfig, command: str | None = None) -> None:
    """``validate`` a composed config of ``command`` against its typed keys, the ``_target_`` classes' included."""
    check_config(cfg, SECTIONS.get(command_name(command) or ""))
