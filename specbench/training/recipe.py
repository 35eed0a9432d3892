"""What ``specbench train-drafter`` trains on and how: its own config sections (``drafter.*``: which drafter;
``train.*``: the recipe; ``eval_sets``: the held-out sets), the training precision, and the training sequences (the
prompt as ``eval`` builds it, then the reference or the target's own greedy answer: ``training/responses.py``). The
trainees that learn from them are ``training/trainees.py``."""

from __future__ import annotations

import contextlib
import logging
from dataclasses import dataclass
from typing import Annotated

import torch
from omegaconf import DictConfig

from specbench.errors import SpecbenchError
from specbench.models.devices import resolve_dtype
from specbench.tasks import Prompter
from specbench.tasks.datasets import SelectedSource
from specbench.training.distill import Example, shared_prefix
from specbench.validate import COUNT, SEED, boolean, each, integer, list_of, nested, number, text


@dataclass(frozen=True, kw_only=True)
class DrafterShape:
    """train-drafter's drafter.* (conf/train_drafter.yaml holds the defaults): which drafter is trained."""

    kind: Annotated[str, text()]  # eagle | hf | small, checked by the trainee
    layers: Annotated[int, COUNT]
    vocab: Annotated[int | None, integer(1, null=True, note=" (null: the full vocabulary)")]
    model: Annotated[str | None, text(null=True)]


@dataclass(frozen=True, kw_only=True)
class Recipe:
    """train-drafter's train.* (train-policy's train.* is another command's section: policy/model.py's
    TrainConfig)."""

    epochs: Annotated[int, integer(0, note=" (0: the drafter as it starts, measured)")]
    lr: Annotated[float | None, number(0, low_open=True, null=True, note=" (null: the kind's default)")]
    batch_size: Annotated[int, COUNT]
    seed: Annotated[int, SEED]
    loss: Annotated[str, text()]
    responses: Annotated[str, text()]
    max_new_tokens: Annotated[int, COUNT]
    max_input_tokens: Annotated[int, COUNT]
    max_tokens: Annotated[int, COUNT]
    seq_len: Annotated[int, COUNT]
    time_budget_s: Annotated[float | None, number(0, null=True, low_open=True)]
    feature_weight: Annotated[float, number(0)]
    ce_weight: Annotated[float, number(0)]
    top_k: Annotated[int, COUNT]
    unroll: Annotated[int, integer(1, 16)]
    unroll_weights: Annotated[list[float] | None, list_of(number(0), null=True)]
    feature_noise: Annotated[float, number(0)]
    val_examples: Annotated[int, integer(0)]
    prompt_positions: Annotated[bool, boolean()]
    precision: Annotated[str, text()]
    lr_schedule: Annotated[str, text()]
    generate_batch: Annotated[int, COUNT]
    generate_only: Annotated[bool, boolean()]


@dataclass(frozen=True, kw_only=True)
class HeldOutSets:
    """train-drafter's eval_sets: the held-out sets of held_out_metrics, task -> a source (null: switched off)."""

    eval_sets: Annotated[
        dict[str, SelectedSource | None],
        each(
            nested(SelectedSource, null=True, note=" (null: that set switched off)"),
            null=True,
            note=" (task -> a held-out source)",
        ),
    ]


# train-drafter's own sections (conf/train_drafter.yaml), by where they sit in its config
SECTIONS: dict[str, tuple[type, ...]] = {"drafter": (DrafterShape,), "train": (Recipe,), "": (HeldOutSets,)}

log = logging.getLogger(__name__)


PRECISIONS = ("auto", "float32", "bfloat16")


def training_precision(cfg: DictConfig) -> str:
    """``train.precision``: float32, or bfloat16 (autocast: bf16 matrix products, float32 weights, optimiser
    and losses); auto: bfloat16 when the teacher (the target) runs in bfloat16 (``target.dtype: auto`` picks
    it where the hardware computes it natively), else float32 (an fp32 target trains its drafters in fp32)."""
    value = str(cfg.train.get("precision") or "float32")
    if value not in PRECISIONS:
        raise SpecbenchError(
            f"train.precision must be one of {', '.join(PRECISIONS)}, got '{value}'",
            "auto: bf16 autocast where the hardware has native bf16; float32: full precision",
        )
    if value == "auto":
        return "bfloat16" if target_dtype_name(cfg) == "bfloat16" else "float32"
    return value


def target_dtype_name(cfg: DictConfig) -> str:
    """The teacher's dtype as a canonical name (``float32``, ``bfloat16``, ...; ``auto`` resolved)."""
    return str(resolve_dtype(cfg.target.get("dtype"), cfg.target.get("device"))).removeprefix("torch.")


def examples_of(
    queries,
    prompter: Prompter,
    tokenizer,
    responses: dict[str, list[int]] | None,
    max_tokens: int,
    prompt_positions: bool = False,
) -> list[Example]:
    """Prompt + response sequences; queries without a reference are skipped (logged) with reference responses.
    ``prompt_positions``: the head also learns the prompt tokens after the prompts' shared opening (the chat
    template's fixed system text is learned once per sequence at most, never counted as data)."""
    out = []
    if responses is None:
        missing = [q.id for q in queries if not q.reference]
        if missing and len(missing) == len(queries):
            raise SpecbenchError(
                f"no query of the dataset has a reference response to train on (e.g. {missing[0]})",
                "use a dataset with references, or train.responses=target",
            )
        if missing:
            log.warning(
                "%d of %d queries have no reference response and are skipped", len(missing), len(queries)
            )
        queries = [q for q in queries if q.reference]
    for q in queries:
        prompt = prompter(q)
        if responses is not None:
            response = responses[q.id]
        else:
            response = tokenizer(q.reference, add_special_tokens=False)["input_ids"]
        ids = (prompt + response)[:max_tokens]
        if len(ids) - len(prompt) >= 2:
            out.append(Example(ids=ids, start=len(prompt)))
    if prompt_positions and out:
        fixed = shared_prefix([ex.ids[: ex.start] for ex in out]) if len(out) > 1 else 0
        for ex in out:
            ex.learn = min(fixed + 1, ex.start)
    return out


def learned_tokens(examples: list[Example]) -> int:
    """Tokens the head learns to predict (response tokens, plus prompt tokens with train.prompt_positions)."""
    return int(sum(len(e.ids) - (e.start if e.learn is None else e.learn) for e in examples))


def autocast(precision: str, device: torch.device):
    """bf16 autocast for ``precision`` bfloat16 (weights, optimiser state and losses stay float32)."""
    if precision == "bfloat16":
        return torch.autocast(device_type=device.type, dtype=torch.bfloat16)
    return contextlib.nullcontext()
