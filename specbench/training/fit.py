"""The drafter's optimiser loop (``fit``), beside the policy's (``training/reinforce.py``).

A trainee (``training/trainees.py``: ``HeadTrainee``, ``ModelTrainee``, ``SmallTrainee``) owns its module, its
batches and its loss; ``fit`` owns what every trainee shares: AdamW, the learning-rate schedule, gradient
clipping at norm 1, a held-out pass per epoch, ``state.pt`` after every epoch (resumed to the same weights as
an uninterrupted run) and the time budget.
"""

from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass
from pathlib import Path

import torch
from tqdm.auto import tqdm

from specbench.files import atomic_path

log = logging.getLogger(__name__)

LR_SCHEDULES = ("constant", "linear")


def lr_factor(schedule: str, step: int, total: int) -> float:
    """The learning rate at optimiser ``step`` (0-based) of ``total``, as a fraction of ``train.lr``: constant 1;
    linear: from 1 down to ``1/total`` at the last step (a pure function of the step, so a resumed run follows
    the same schedule)."""
    if schedule == "linear":
        return 1.0 - step / max(total, 1)
    return 1.0


@dataclass(frozen=True)
class FitSpec:
    """How long and how fast: ``epochs`` in all (a resumed run counts the ones done), ``batch_size`` items per
    optimiser step, ``lr`` (``schedule``: ``LR_SCHEDULES``), ``seed`` (batches of epoch ``e`` are drawn with
    seed ``seed * 1000 + e``), ``time_budget_s`` (stop after the epoch that passes it; None: no budget)."""

    epochs: int
    batch_size: int
    lr: float
    schedule: str = "constant"
    seed: int = 0
    time_budget_s: float | None = None
    clip_norm: float = 1.0


def epochs_done(state_path: Path) -> int:
    """How many epochs the ``state.pt`` at ``state_path`` holds (0 when there is none)."""
    if not state_path.exists():
        return 0
    return int(torch.load(state_path, map_location="cpu", weights_only=False)["epoch"])


def fit(
    trainee, train_items: list, val_items: list, spec: FitSpec, state_path: Path, desc: str
) -> list[dict]:
    """Train ``trainee.module`` for the epochs of ``spec`` not yet in ``state_path`` (resumed from it), writing
    it after every epoch; returns the history, one row per epoch (mean training stats, ``val_*`` held-out
    stats, ``seconds``)."""
    params = [p for p in trainee.module.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=spec.lr, weight_decay=0.0)
    history: list[dict] = []
    epoch0 = 0
    if state_path.exists():
        state = torch.load(state_path, map_location="cpu", weights_only=False)
        trainee.module.load_state_dict(
            state["weights"] if "weights" in state else state["head"]
        )  # "head": older runs
        opt.load_state_dict(state["opt"])
        history, epoch0 = state["history"], state["epoch"]
        log.info("resuming %s after epoch %d", state_path.parent, epoch0)
    started = time.perf_counter()
    per_epoch = math.ceil(
        len(train_items) / spec.batch_size
    )  # optimiser steps per epoch (the schedule's unit)
    bar = tqdm(range(epoch0, spec.epochs), desc=desc, unit="epoch", initial=epoch0, total=spec.epochs)
    for epoch in bar:
        row = _epoch(trainee, opt, params, train_items, val_items, spec, epoch, per_epoch)
        history.append(row)
        bar.set_postfix(loss=f"{row['loss']:.3f}", top1=f"{row.get('val_top1', row['top1']):.3f}")
        with atomic_path(state_path) as tmp:  # never a torn state.pt: the last finished epoch survives Ctrl-C
            torch.save(
                {
                    "weights": trainee.module.state_dict(),
                    "opt": opt.state_dict(),
                    "history": history,
                    "epoch": epoch + 1,
                },
                tmp,
            )
        budget = spec.time_budget_s
        if budget is not None and time.perf_counter() - started > budget and epoch + 1 < spec.epochs:
            log.warning(
                "train.time_budget_s=%s reached after epoch %d of %d: stopping",
                budget,
                epoch + 1,
                spec.epochs,
            )
            break
    trainee.module.eval()
    return history


def _epoch(trainee, opt, params, train_items, val_items, spec: FitSpec, epoch: int, per_epoch: int) -> dict:
    """One epoch of optimiser steps, then the held-out pass: the epoch's history row."""
    epoch_started = time.perf_counter()
    gen = torch.Generator().manual_seed(spec.seed * 1_000 + epoch)
    trainee.start_epoch(spec.seed, epoch)
    stats = []
    for i, batch in enumerate(trainee.batches(train_items, gen)):
        if spec.schedule != "constant":
            for group in opt.param_groups:
                group["lr"] = spec.lr * lr_factor(
                    spec.schedule, epoch * per_epoch + i, spec.epochs * per_epoch
                )
        loss, s = trainee.loss(batch)
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, spec.clip_norm)
        opt.step()
        stats.append(s)
    row = {"epoch": epoch + 1, **{k: sum(s[k] for s in stats) / len(stats) for k in stats[0]}}
    if val_items:
        with torch.no_grad():
            _, vs = trainee.loss(trainee.whole(val_items), training=False)
        row.update({f"val_{k}": v for k, v in vs.items()})
    row["seconds"] = round(time.perf_counter() - epoch_started, 2)
    return row
