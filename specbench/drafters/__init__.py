"""Drafters: one module per kind. ``build_pool`` instantiates a pool config against a target."""

from __future__ import annotations

from collections.abc import Mapping

from hydra.errors import InstantiationException
from hydra.utils import instantiate

from specbench.decoding.drafter import AUTOREGRESSIVE, AutoregressiveArm, Draft, Drafter
from specbench.drafters.base import ModelDrafter
from specbench.errors import SpecbenchError


def build_pool(target, drafters: Mapping) -> dict[str, Drafter]:
    """``{name: drafter config with _target_}`` -> ``{name: Drafter}``, plus the autoregressive arm."""
    pool: dict[str, Drafter] = {AUTOREGRESSIVE: AutoregressiveArm()}
    for name, cfg in (drafters or {}).items():
        if name == AUTOREGRESSIVE:
            raise SpecbenchError(f"'{AUTOREGRESSIVE}' is reserved for the no-draft arm",
                                 "rename that drafter in the pool config")
        if not isinstance(cfg, Mapping) or "_target_" not in cfg:
            raise SpecbenchError(f"drafter '{name}' in the pool has no _target_ (got {cfg!r})",
                                 "compose it from conf/drafter/ (e.g. /drafter@drafters.NAME: quantized)")
        try:
            pool[name] = instantiate(cfg, target=target, name=name, _convert_="all")
        except InstantiationException as exc:
            cause = exc.__cause__
            if isinstance(cause, SpecbenchError):
                raise cause from None
            raise SpecbenchError(f"could not build drafter '{name}': {exc}",
                                 "check its keys against conf/drafter/ and the builder's arguments") from exc
    return pool


__all__ = ["AUTOREGRESSIVE", "AutoregressiveArm", "Draft", "Drafter", "ModelDrafter", "build_pool"]
