"""What ``decoding.batch_size`` may be, checked before any model loads (the command line's light check and eval's
door call ``check_batched``; this module imports no more than Hydra and OmegaConf): only ``specbench eval`` batches,
lossless (greedy or sampling), one turn a query, with the autoregressive method and ``fixed:<drafter>`` methods
whose drafter kind drafts per row (its builder's ``batches``), ``goodput:<drafter>`` for those drafters (with the
batch budget), ``tree:<a>+<b>`` over such drafters, selector methods whose selector chooses arms, routes or token
trees over such a pool (one selector a row; not cost-model plans), and ``hf:generate``; ``goodput:`` and
``hf:generate`` run only in batches, so a batch size of 1 refuses them. Each refusal names the method or key and the
fix. The batched eval itself is ``pipelines/waves.py``.
"""

from __future__ import annotations

from hydra.utils import get_object
from omegaconf import DictConfig, OmegaConf

from specbench.arms import AGAIN, AUTOREGRESSIVE, BATCH_ONLY, GOODPUT, HF_GENERATE
from specbench.errors import SpecbenchError

FIX = "decoding.batch_size=1 (one query at a time runs every method)"


WAVE = 4  # a wave's queries by default: this many times the batch size (``batch_wave``)


def batch_size(cfg: DictConfig) -> int:
    return int(OmegaConf.select(cfg, "decoding.batch_size", default=1) or 1)


def batch_wave(cfg: DictConfig) -> int:
    """The queries a method decodes in one go (``decoding.batch_wave``; null: ``WAVE`` times the batch size): at most
    ``decoding.batch_size`` of them at once, a finished query's row going to the next waiting one (continuous
    batching); methods take turns wave by wave. A wave of the batch size decodes static batches."""
    size, wave = batch_size(cfg), OmegaConf.select(cfg, "decoding.batch_wave", default=None)
    wave = WAVE * size if wave is None else int(wave)
    if wave < size:
        raise SpecbenchError(
            f"decoding.batch_wave={wave} is smaller than decoding.batch_size={size}: a wave holds at least one batch",
            f"set decoding.batch_wave to at least {size} (or null: {WAVE} x the batch size)",
        )
    return wave


def drafter_of(method: str) -> str:
    """The drafter a batched method drafts with: ``<drafter>`` of ``fixed:<drafter>`` or ``goodput:<drafter>``,
    else the autoregressive arm."""
    for prefix in ("fixed:", GOODPUT):
        if method.startswith(prefix):
            return method[len(prefix) :]
    return AUTOREGRESSIVE


def check_batched(cfg: DictConfig, command: str = "eval") -> None:
    """Refuse, before any model loads, a batch size above 1 with what cannot batch yet, and the batch-only methods
    at batch size 1."""
    size = batch_size(cfg)
    if size == 1:
        only = [str(m) for m in cfg.get("methods") or [] if str(m).startswith(BATCH_ONLY)]
        if only:
            raise SpecbenchError(
                f"method '{only[0]}' runs only in batches (decoding.batch_size above 1); this run decodes one "
                "query at a time",
                "set decoding.batch_size=<2 or more> (specbench eval), or use fixed:<drafter> or "
                "selector:budget at batch size 1",
            )
        return
    if command != "eval":
        raise SpecbenchError(
            f"decoding.batch_size={size}: only `specbench eval` decodes in batches ({command} decodes one query at a "
            "time)",
            "drop decoding.batch_size (or set it to 1) for this command",
        )
    batch_wave(cfg)
    sampled = float(cfg.decoding.get("temperature") or 0) > 0
    if sampled and HF_GENERATE in [str(m) for m in cfg.get("methods") or []]:
        raise SpecbenchError(
            f"method '{HF_GENERATE}' is Hugging Face's batched greedy decoding; decoding.temperature="
            f"{cfg.decoding.temperature} samples",
            f"drop '{HF_GENERATE}' from methods, or set decoding.temperature=0",
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
    _check_methods(cfg, size)


def _check_methods(cfg: DictConfig, size: int) -> None:
    """Each method of a batched run: one that batches, with drafters that draft per row."""
    drafters = OmegaConf.to_container(cfg.pool.drafters, resolve=False) if cfg.pool.get("drafters") else {}
    for given in [str(m) for m in cfg.get("methods") or []]:
        spec = given.removeprefix(AGAIN)  # an A/A method batches as the method it runs again
        prefix = "fixed:" if spec.startswith("fixed:") else GOODPUT if spec.startswith(GOODPUT) else None
        if spec in (AUTOREGRESSIVE, HF_GENERATE):
            continue
        if prefix:
            names = list(drafters) if spec == "fixed:*" else [drafter_of(spec)]
            why = "drafter '{}' is of a kind"
        elif spec == "selector" or spec.startswith("selector:"):
            _check_selector(cfg, spec, size)
            names, why = list(drafters), "its selector may play drafter '{}', of a kind"
        elif spec.startswith("tree:"):
            listed = spec.split(":", 1)[1]
            names = list(drafters) if listed == "*" else [m.strip() for m in listed.split("+") if m.strip()]
            why = "its tree has drafter '{}', of a kind"
        else:
            raise SpecbenchError(
                f"method '{spec}' cannot run at decoding.batch_size={size}: a batch runs autoregressive, "
                f"fixed:<drafter>, {GOODPUT}<drafter>, tree:<a>+<b>, selector methods (but cost-model plans), and "
                f"{HF_GENERATE}",
                f"keep those methods in methods=[...], or {FIX}",
            )
        for name in names:
            if name not in drafters:
                raise unknown_drafter(spec, name, list(drafters))
            if not _batches(drafters.get(name)):
                raise SpecbenchError(
                    f"method '{spec}' cannot run at decoding.batch_size={size}: {why.format(name)} that does not "
                    "draft per row of a batch yet (prompt lookup, the retrieval drafter, draft heads and HF, small "
                    "and early-exit drafters do, as chains; dynamic draft trees and quantized drafters do not)",
                    f"drop '{spec}' from methods (or the drafter from the pool), or {FIX}",
                )


def unknown_drafter(spec: str, name: str, drafters: list[str]) -> SpecbenchError:
    """A method naming a drafter the pool lacks: said so, with the pool's drafters and the nearest name (as at
    batch size 1), not as a kind that cannot batch."""
    import difflib

    close = difflib.get_close_matches(name, drafters, n=1)
    return SpecbenchError(
        f"method '{spec}': no drafter '{name}' in the pool (its drafters: {', '.join(drafters) or 'none'})",
        (f"did you mean '{close[0]}'? " if close else "")
        + "name one of the pool's drafters, or add it to the pool (pool.drafters.<name>=...)",
    )


def _check_selector(cfg: DictConfig, spec: str, size: int) -> None:
    """A selector method batches when its selector chooses each round's drafters from what the row itself saw (its
    own rounds, or its prompt's embedding: the policy), as one arm, a route or a token tree: no cost-model plans, no
    side observations, no statistics carried across queries (a batch's rows decode together, not one after
    another)."""
    from specbench.configs import load_option

    scfg = cfg.get("selector") if spec == "selector" else load_option("selector", spec.split(":", 1)[1])
    if scfg is None:
        return
    try:
        cls = get_object(str(scfg.get("_target_")))
    except (ImportError, AttributeError, ValueError):
        return  # an unknown class is named by the method check
    reason = (
        "it builds each round with a cost model (a plan), which costs a forward as if the row were alone"
        if getattr(cls, "plans", False)
        else "it learns from side observations (full_information)"
        if scfg.get("full_information")
        else "it carries statistics across queries (carry_over), and a batch's rows decode together"
        if scfg.get("carry_over")
        else None
    )
    if reason:
        raise SpecbenchError(
            f"method '{spec}' cannot run at decoding.batch_size={size}: {reason}",
            f"use a selector that chooses arms, routes or token trees (ucb, exp3, router, tree_ucb, ...), or {FIX}",
        )


def _batches(drafter) -> bool:
    """Whether a drafter config's kind drafts per row of a batch (its builder's ``batches``: True, or ``"chains"`` for
    kinds whose dynamic draft tree does not batch, so a config with a ``tree`` does not)."""
    target = drafter.get("_target_") if isinstance(drafter, dict) else None
    try:
        kind = getattr(get_object(str(target)), "batches", False) if target else False
    except (ImportError, AttributeError, ValueError):
        return False
    return bool(kind) and not (kind == "chains" and drafter.get("tree"))


def check_queries(size: int, queries: int) -> None:
    if size > queries:
        raise SpecbenchError(
            f"decoding.batch_size={size} is larger than the {queries} queries this run decodes",
            f"set decoding.batch_size to at most {queries}, or read more queries (dataset.limit)",
        )
