"""What the config leaves to this machine, resolved once as a run opens: the target's dtype (``auto``, null or an
alias resolved to the one it computes in), the tie tolerance of greedy certification in that dtype, and the cascade
rule (``run_dir.start_run`` resolves the dtype into the saved config; ``core.Session.open`` reads the other two)."""

from __future__ import annotations

import logging

from omegaconf import DictConfig, open_dict

from specbench.decoding.cascade import Cascade
from specbench.decoding.certify import DEFAULT_TOLERANCE, tolerance_for
from specbench.errors import SpecbenchError
from specbench.models.devices import AUTO, auto_dtype, dtype_name, resolve_device

log = logging.getLogger(__name__)


def resolve_target_dtype(cfg: DictConfig) -> None:
    """Replace ``target.dtype`` (``auto``, null or an alias such as ``bf16``) by the dtype it resolves to on
    this machine (:func:`specbench.models.devices.auto_dtype`), so ``config.yaml``, the summaries and the
    checkpoints written from this config name the dtype the run computed in."""
    target = cfg.get("target")
    if not isinstance(target, DictConfig) or "dtype" not in target:
        return
    asked = target.get("dtype")
    name = dtype_name(asked, target.get("device"))
    if asked == AUTO:
        why = auto_dtype(resolve_device(target.get("device")))[1]
        log.info("target.dtype=auto resolves to %s: %s", name, why)
    with open_dict(cfg):
        target.dtype = name


def tie_tolerance_of(cfg: DictConfig) -> float:
    """The tie tolerance of the run's target in its (resolved) dtype: ``target.tie_tolerance.<dtype>``,
    else the generic default of that dtype (``certify.DEFAULT_TOLERANCE``)."""
    dtype = dtype_name(cfg.target.get("dtype"), cfg.target.get("device"))
    return tolerance_for(cfg.target.get("tie_tolerance"), dtype, DEFAULT_TOLERANCE.get(dtype, 1.0))


def check_acceptance(sampling, cascade: Cascade | None) -> None:
    """A sampled run's acceptance rule (``decoding.acceptance``) against its cascade, before any model loads: the
    lossy cascade rules verify against their own mixture, so only ``full`` goes with them."""
    if sampling.greedy or sampling.acceptance == "full" or cascade is None or cascade.lossless:
        return
    raise SpecbenchError(
        f"decoding.acceptance={sampling.acceptance} is a lossless rule; cascade={cascade.rule} verifies against "
        "its own mixture (lossy)",
        "drop the cascade to compare lossless rules, or keep decoding.acceptance=full with a cascade rule",
    )


def cascade_of(cfg: DictConfig) -> Cascade | None:
    """The run's cascade rule (``cascade=<rule> cascade.alpha=<a>``); None when the config has none."""
    c = cfg.get("cascade")
    return None if c is None else Cascade(rule=str(c.rule), alpha=float(c.alpha))
