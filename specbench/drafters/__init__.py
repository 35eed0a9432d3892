"""Drafters: one module per kind. ``build_pool`` instantiates a pool config against a target."""

from __future__ import annotations

from collections.abc import Mapping

from hydra.errors import InstantiationException
from hydra.utils import instantiate

from specbench.decoding.drafter import AUTOREGRESSIVE, AutoregressiveArm, Draft, Drafter
from specbench.drafters.base import ModelDrafter
from specbench.errors import SpecbenchError
from specbench.profiling import MEASURED, load_profile, measured_cost


def build_pool(target, drafters: Mapping, profile=None, measuring: bool = False) -> dict[str, Drafter]:
    """``{name: drafter config with _target_}`` -> ``{name: Drafter}``, plus the autoregressive arm.

    A drafter whose ``cost`` is ``measured`` gets its ``c_draft`` from ``profile`` (a ``profile.json`` of
    ``specbench profile`` or its run directory: config key ``profile_path``), checked against the target;
    with ``measuring`` (the profile command itself) it gets its kind's default cost instead.
    """
    pool: dict[str, Drafter] = {AUTOREGRESSIVE: AutoregressiveArm()}
    loaded_profile = None
    for name, cfg in (drafters or {}).items():
        if name == AUTOREGRESSIVE:
            raise SpecbenchError(f"'{AUTOREGRESSIVE}' is reserved for the no-draft arm",
                                 "rename that drafter in the pool config")
        if not isinstance(cfg, Mapping) or "_target_" not in cfg:
            raise SpecbenchError(f"drafter '{name}' in the pool has no _target_ (got {cfg!r})",
                                 "compose it from conf/drafter/ (e.g. /drafter@drafters.NAME: quantized)")
        extra = {}
        if cfg.get("cost") == MEASURED:  # read before instantiating: the builders take a number (or null)
            if not measuring and profile is not None and loaded_profile is None:
                loaded_profile = load_profile(profile)
            extra["cost"] = None if measuring else measured_cost(loaded_profile, name, target)
        try:
            pool[name] = instantiate(cfg, target=target, name=name, _convert_="all", **extra)
        except InstantiationException as exc:
            cause = exc.__cause__
            if isinstance(cause, SpecbenchError):
                raise cause from None
            raise SpecbenchError(f"could not build drafter '{name}': {exc}",
                                 "check its keys against conf/drafter/ and the builder's arguments") from exc
    return pool


__all__ = ["AUTOREGRESSIVE", "AutoregressiveArm", "Draft", "Drafter", "ModelDrafter", "build_pool"]
