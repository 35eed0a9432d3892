"""What ``decoding.batch_size`` may be, checked before any model loads (the command line's light check and eval's door
call ``check_batched``; this module imports no more than Hydra and OmegaConf): only ``specbench eval`` batches, greedy
and lossless, one turn a query, with the autoregressive method and ``fixed:<drafter>`` methods whose drafter kind
drafts per row (its builder's ``batches``). Each refusal names the method or key and the fix. The batched eval itself
is ``pipelines/batched.py``.
"""

from __future__ import annotations

from hydra.utils import get_object
from omegaconf import DictConfig, OmegaConf

from specbench.arms import AUTOREGRESSIVE
from specbench.errors import SpecbenchError

FIX = "decoding.batch_size=1 (one query at a time runs every method)"


def batch_size(cfg: DictConfig) -> int:
    return int(OmegaConf.select(cfg, "decoding.batch_size", default=1) or 1)


def check_batched(cfg: DictConfig, command: str = "eval") -> None:
    """Refuse, before any model loads, a batch size above 1 with what cannot batch yet."""
    size = batch_size(cfg)
    if size == 1:
        return
    if command != "eval":
        raise SpecbenchError(
            f"decoding.batch_size={size}: only `specbench eval` decodes in batches ({command} decodes one query at a "
            "time)",
            "drop decoding.batch_size (or set it to 1) for this command",
        )
    dec = cfg.decoding
    if float(dec.get("temperature") or 0) > 0:
        raise SpecbenchError(
            f"decoding.batch_size={size} decodes greedily only; decoding.temperature={dec.temperature} samples",
            f"set decoding.temperature=0, or {FIX}",
        )
    rule = OmegaConf.select(cfg, "cascade.rule", default=None)
    if rule not in (None, "none"):
        raise SpecbenchError(
            f"decoding.batch_size={size} verifies losslessly only; cascade.rule={rule} was given",
            f"set cascade=none, or {FIX}",
        )
    if (
        int(OmegaConf.select(cfg, "dataset.max_turns", default=1) or 1) > 1
        or int(cfg.get("conversation_length") or 1) > 1
    ):
        raise SpecbenchError(
            f"decoding.batch_size={size} decodes one turn a query; this run asks for several (dataset.max_turns or "
            "conversation_length above 1)",
            f"set dataset.max_turns=1 and conversation_length=1, or {FIX}",
        )
    drafters = OmegaConf.to_container(cfg.pool.drafters, resolve=False) if cfg.pool.get("drafters") else {}
    for spec in [str(m) for m in cfg.get("methods") or []]:
        names = (
            list(drafters)
            if spec == "fixed:*"
            else [spec.split(":", 1)[1]]
            if spec.startswith("fixed:")
            else []
        )
        if spec != AUTOREGRESSIVE and not names:
            raise SpecbenchError(
                f"method '{spec}' cannot run at decoding.batch_size={size}: a batch runs autoregressive and "
                "fixed:<drafter> methods (selectors choose per query or per round, which a batch does not do yet)",
                f"keep autoregressive and fixed:<drafter> methods in methods=[...], or {FIX}",
            )
        for name in names:
            if not _batches(drafters.get(name)):
                raise SpecbenchError(
                    f"method 'fixed:{name}' cannot run at decoding.batch_size={size}: drafter '{name}' is of a "
                    "kind that does not draft per row of a batch yet (prompt lookup and the retrieval drafter do)",
                    f"drop 'fixed:{name}' from methods, or {FIX}",
                )


def _batches(drafter) -> bool:
    target = drafter.get("_target_") if isinstance(drafter, dict) else None
    try:
        return bool(target) and bool(getattr(get_object(str(target)), "batches", False))
    except (ImportError, AttributeError, ValueError):
        return False


def check_queries(size: int, queries: int) -> None:
    if size > queries:
        raise SpecbenchError(
            f"decoding.batch_size={size} is larger than the {queries} queries this run decodes",
            f"set decoding.batch_size to at most {queries}, or read more queries (dataset.limit)",
        )
