"""Policy checkpoints: one ``torch.save`` of a plain dict, loadable with ``weights_only=True``."""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

from specbench.errors import SpecbenchError
from specbench.files import atomic_path
from specbench.policy.model import Policy, TrainResult
from specbench.policy.net import PolicyNet

log = logging.getLogger(__name__)
FORMAT = "specbench-policy"
VERSION = 1
log = logging.getLogger(__name__)


def _plain(value: Any, where: str) -> Any:
    """``value`` as tensors, lists, dicts (str keys), str, numbers, bools and None, for safe loading."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, torch.Tensor):
        return value.detach().cpu().clone()
    if isinstance(value, Path):
        return str(value)
    if isinstance(value, Mapping):
        return {str(k): _plain(v, f"{where}.{k}") for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v, f"{where}[{i}]") for i, v in enumerate(value)]
    if hasattr(value, "item") and callable(value.item):  # numpy scalars
        return _plain(value.item(), where)
    raise SpecbenchError(
        f"policy checkpoint: {where} has type {type(value).__name__}",
        "pass plain values (numbers, strings, lists, dicts), e.g. OmegaConf.to_container(cfg)",
    )


def save_checkpoint(
    path: str | Path,
    result_or_policy: TrainResult | Policy,
    *,
    arms: Sequence[str],
    embedding: Mapping[str, Any],
    alpha: float,
    config: Mapping[str, Any],
    training_queries: Sequence[str] = (),
    pool: Mapping[str, Any] | None = None,
) -> Path:
    """Write the policy (weights, standardization, arms, embedding spec, alpha, config, metrics) to ``path``.

    ``embedding`` describes how queries were embedded, e.g. ``{"pooling": "mean", "source":
    "decoder_last_hidden", "dim": 576, "target": "embedded:smollm2_135m"}``. ``training_queries``: the
    content fingerprints of every query the policy saw (training and validation), which
    ``check_not_trained_on`` compares with an evaluation slice. ``pool``: the drafter pool config the rows were
    collected with, which ``eval selector=policy`` uses under eval's default ``pool=auto``. Returns the path."""
    src = result_or_policy
    if not isinstance(src, (TrainResult, Policy)):
        raise SpecbenchError(
            f"policy checkpoint: cannot save a {type(src).__name__}",
            "pass the TrainResult of train_policy or a Policy",
        )
    arms = list(arms)
    if arms != list(src.arms):
        raise SpecbenchError(
            f"policy checkpoint: arms {arms} differ from the policy's {list(src.arms)}",
            "pass the arm names the policy was trained with, in order",
        )
    model: PolicyNet = src.model
    if "dim" in embedding and int(embedding["dim"]) != model.dim:
        raise SpecbenchError(
            f"policy checkpoint: embedding dim {embedding['dim']} but the policy reads {model.dim}",
            "pass the embedding spec used to build the training data",
        )
    metrics = src.metrics if isinstance(src, TrainResult) else src.meta.get("metrics", {})
    blob = {
        "format": FORMAT,
        "version": VERSION,
        "state_dict": {k: v.detach().cpu().clone() for k, v in model.state_dict().items()},
        "dim": model.dim,
        "hidden": list(model.hidden),
        "dropout": model.dropout,
        "n_arms": model.n_arms,
        "arms": arms,
        "mean": src.mean.detach().cpu().clone(),
        "std": src.std.detach().cpu().clone(),
        "embedding": _plain(dict(embedding), "embedding"),
        "alpha": float(alpha),
        "config": _plain(dict(config), "config"),
        "metrics": _plain(dict(metrics), "metrics"),
        "training_queries": sorted({str(f) for f in training_queries}),
        **({"pool": _plain(dict(pool), "pool")} if pool else {}),
    }
    path = Path(path)
    with atomic_path(path) as tmp:  # a temporary file, then os.replace: an interruption never tears it
        torch.save(blob, tmp)
    return path


def checkpoint_file(path: str | Path) -> Path:
    """``path`` itself, or the ``policy.pt`` of a train-policy run directory given instead of its checkpoint."""
    path = Path(path).expanduser()
    return path / "policy.pt" if path.is_dir() and (path / "policy.pt").is_file() else path


def load_checkpoint(path: str | Path) -> Policy:
    """The ``Policy`` saved at ``path`` (or in the train-policy run directory ``path``); ``policy.meta`` holds
    everything else that was saved (dim, hidden, arms, embedding, alpha, config, metrics, format, version)."""
    path = checkpoint_file(path)
    if not path.is_file():
        what = "is a directory without policy.pt" if path.is_dir() else "does not exist"
        raise SpecbenchError(
            f"policy checkpoint {path} {what}",
            "run `specbench train-policy` first, or point to an existing checkpoint (its policy.pt, or "
            "the train-policy run directory that holds it)",
        )
    not_ours = SpecbenchError(
        f"{path} is not a specbench policy checkpoint", "point to a file written by `specbench train-policy`"
    )
    try:
        blob = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # pickle, zip or safe-load errors: not our file
        raise not_ours from e
    if not isinstance(blob, dict) or blob.get("format") != FORMAT:
        raise not_ours
    if blob.get("version") != VERSION:
        raise SpecbenchError(
            f"policy checkpoint {path} has format version {blob.get('version')}, "
            f"this specbench reads {VERSION}",
            "retrain with `specbench train-policy`",
        )
    try:
        model = PolicyNet(blob["dim"], blob["n_arms"], blob["hidden"], blob.get("dropout", 0.0))
        model.load_state_dict(blob["state_dict"])
        model = model.to(blob["mean"].dtype)
        meta = {k: v for k, v in blob.items() if k not in ("state_dict", "mean", "std")}
        return Policy(model, blob["mean"], blob["std"], list(blob["arms"]), meta)
    except (KeyError, RuntimeError, TypeError, AttributeError) as e:
        raise SpecbenchError(
            f"policy checkpoint {path} is damaged or incomplete ({e})",
            "retrain with `specbench train-policy`",
        ) from e


def check_compatible(
    policy: Policy, pool_arms: Sequence[str], embedding_dim: int, target: str | None = None
) -> None:
    """SpecbenchError unless every policy arm is in ``pool_arms``, the policy reads ``embedding_dim``
    and, when ``target`` (the run's target model) is given, the policy was trained on that target's
    embeddings (a checkpoint that records no target is accepted with a warning)."""
    trained_for = (policy.meta.get("embedding") or {}).get("target")
    if target is not None and trained_for is not None and str(trained_for) != str(target):
        raise SpecbenchError(
            f"the policy checkpoint was trained on the embeddings of target {trained_for}, but this "
            f"run's target is {target}: its choices would be read off another model's embeddings",
            f"run it with target.model={trained_for}, or collect and train a policy for {target} "
            "(specbench collect + specbench train-policy)",
        )
    if target is not None and trained_for is None:
        log.warning("the policy checkpoint records no target: cannot check it was trained for %s", target)
    target = trained_for or "unknown"
    missing = [a for a in policy.arms if a not in pool_arms]
    if missing:
        raise SpecbenchError(
            f"policy checkpoint chooses arms {missing} that are not in the drafter pool "
            f"(pool: {list(pool_arms)}; checkpoint arms: {list(policy.arms)})",
            "add the missing drafters to the pool, or retrain with `specbench train-policy` on this pool",
        )
    if int(embedding_dim) != policy.dim:
        raise SpecbenchError(
            f"policy checkpoint reads {policy.dim}-dim embeddings (trained for target {target}) "
            f"but this target's embeddings have {embedding_dim} dims",
            "use the target the checkpoint was trained for, or retrain with "
            "`specbench train-policy` on this target",
        )


def check_not_trained_on(policy: Policy, queries: Sequence, where: str = "the policy checkpoint") -> None:
    """SpecbenchError when an evaluation query was among the policy's training queries (same content
    fingerprint: the same input, whatever file, split or position it was read from). Checkpoints written
    before fingerprints were recorded cannot be checked (logged)."""
    seen = set(policy.meta.get("training_queries") or ())
    if not seen:
        log.warning(
            "%s records no training queries (written by an older specbench): cannot check that the "
            "evaluation queries are held out",
            where,
        )
        return
    overlap = [q.id for q in queries if q.fingerprint() in seen]
    if overlap:
        raise SpecbenchError(
            f"{len(overlap)} of the {len(queries)} evaluation queries were collected to train {where} "
            f"(e.g. {', '.join(overlap[:3])}): the evaluation would leak training queries",
            "evaluate on held-out queries: the split the policy was not collected on (dataset.split=test; the "
            "paper-scale experiments pick it by command), or dataset.offset past the collected rows",
        )
