"""Drafters: one module per kind. ``build_pool`` instantiates a pool config against a target."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Annotated

from hydra.errors import InstantiationException
from hydra.utils import get_object, instantiate
from omegaconf import DictConfig, OmegaConf

from specbench.decoding.drafter import AUTOREGRESSIVE, AutoregressiveArm, Draft, Drafter
from specbench.drafters.base import ModelDrafter
from specbench.errors import SpecbenchError
from specbench.profiling import MEASURED, load_profile, measured_cost
from specbench.validate import Rule, each, integer, nested, number, section, validate

# (a rule whose test reads module names sits outside the annotation: get_type_hints evaluates it in the class's scope)
COST = Rule(
    lambda v: v == MEASURED or number(0).ok(v),
    f"a finite number >= 0 or {MEASURED}",
    null=True,
    note=" (c_draft; null: the kind's own estimate; measured: profile_path's)",
)


@dataclass(frozen=True, kw_only=True)
class PoolEntry:
    """pool.drafters.<name>.*: the two keys build_pool reads itself and sets on the built drafter (every kind drafts
    a number of tokens a round and has a cost; a null cost keeps the estimate its builder made); each builder's own
    arguments are declared in its signature (validate.declared; the shared ones in drafters/base.py)."""

    draft_length: Annotated[int | None, integer(1, null=True, note=" (null: decoding.draft_length)")]
    cost: Annotated[float | str | None, COST]


@dataclass(frozen=True, kw_only=True)
class PoolSettings:
    """pool.*: the drafters by name (null: none), each composed from conf/drafter/."""

    drafters: Annotated[
        dict[str, PoolEntry] | None,
        each(nested(PoolEntry, null=True), null=True, note=" (drafter name -> its config; null: no drafter)"),
    ]


def build_pool(target, drafters: Mapping, profile=None, measuring: bool = False) -> dict[str, Drafter]:
    """``{name: drafter config with _target_}`` -> ``{name: Drafter}``, plus the autoregressive arm.

    A drafter whose ``cost`` is ``measured`` gets its ``c_draft`` from ``profile`` (a ``profile.json`` of
    ``specbench profile`` or its run directory: config key ``profile_path``), checked against the target;
    with ``measuring`` (the profile command itself) it gets its kind's default cost instead.
    A drafter's ``draft_length`` (null: ``decoding.draft_length``) is its own number of tokens per round,
    e.g. the best k that ``specbench profile profile.run=<eval dir>`` predicts for it.
    """
    pool: dict[str, Drafter] = {AUTOREGRESSIVE: AutoregressiveArm()}
    loaded_profile = None
    for name, cfg in (drafters or {}).items():
        if name == AUTOREGRESSIVE:
            raise SpecbenchError(
                f"'{AUTOREGRESSIVE}' is reserved for the no-draft arm",
                "rename that drafter in the pool config",
            )
        if not isinstance(cfg, Mapping) or "_target_" not in cfg:
            raise SpecbenchError(
                f"drafter '{name}' in the pool has no _target_ (got {cfg!r})",
                "compose it from conf/drafter/ (e.g. /drafter@drafters.NAME: quantized)",
            )
        values = OmegaConf.to_container(cfg, resolve=True) if isinstance(cfg, DictConfig) else dict(cfg)
        validate(
            OmegaConf.create({"pool": {"drafters": {name: values}}}),
            section("pool", PoolSettings),
            get_object,
        )
        draft_length, cost = cfg.get("draft_length"), cfg.get("cost")
        # the pool's settings, not the builder's (PoolEntry): set on the built drafter
        cfg = {k: cfg[k] for k in cfg if k not in ("draft_length", "cost")}
        if cost == MEASURED:  # read before the drafter loads: a profile of another target is refused first
            if not measuring and profile is not None and loaded_profile is None:
                loaded_profile = load_profile(profile)
            cost = None if measuring else measured_cost(loaded_profile, name, target)
        try:
            pool[name] = instantiate(cfg, target=target, name=name, _convert_="all")
        except InstantiationException as exc:
            cause = exc.__cause__
            if isinstance(cause, SpecbenchError):
                raise cause from None
            raise SpecbenchError(
                f"could not build drafter '{name}': {exc}",
                "check its keys against conf/drafter/ and the builder's arguments",
            ) from exc
        pool[name].draft_length = draft_length
        if cost is not None:  # null: the kind's own estimate, made by its builder
            pool[name].cost = float(cost)
    return pool


__all__ = ["AUTOREGRESSIVE", "AutoregressiveArm", "Draft", "Drafter", "ModelDrafter", "build_pool"]
