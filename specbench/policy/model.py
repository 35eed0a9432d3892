"""The context-aware policy as it is stored and used: its training settings (``TrainConfig``), a training run's
result (``TrainResult``: the best validation epoch's net, its standardization, curves and metrics) and the
inference wrapper (``Policy``: embedding -> arm). Training itself is ``specbench.training.reinforce``."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Annotated, Any

import torch

from specbench.errors import SpecbenchError
from specbench.policy.net import PolicyNet
from specbench.policy.scores import RewardSpec
from specbench.validate import (
    COUNT,
    SEED,
    boolean,
    check_arguments,
    integer,
    list_of,
    nonempty_list_of,
    number,
    text,
)


@dataclass
class TrainConfig:
    """Policy-training settings (see the module docstring for the objective)."""

    hidden: Annotated[Sequence[int], nonempty_list_of(integer(1), note=" (MLP hidden sizes)")] = (64,)
    epochs: Annotated[int, COUNT] = 300
    lr: Annotated[float, number(0, low_open=True)] = 1e-2  # Adam
    batch_size: Annotated[int, COUNT] = 64
    entropy: Annotated[float, number(0, note=" (the entropy bonus's weight)")] = 0.0
    baseline: Annotated[str, text()] = "mean"  # "mean": batch mean of the sampled rewards; "none": 0
    weight_decay: Annotated[float, number(0)] = 0.0
    seed: Annotated[int, SEED] = 0
    val_fraction: Annotated[float, number(0, 1, high_open=True, note=" (held-out queries)")] = 0.2
    # cap on training queries (data-efficiency sweeps); validation set unchanged
    n_examples: Annotated[int | None, integer(1, null=True, note=" (null: every training query)")] = None
    standardize: Annotated[bool, boolean()] = (
        True  # standardize embeddings with the training set's mean / std
    )
    dropout: Annotated[float, number(0, 1, high_open=True)] = 0.0

    def check(self) -> None:
        """SpecbenchError for a setting its field's rule refuses (``train.<field>=...``, as the config check words
        it), or for a combination that cannot train."""
        check_arguments(TrainConfig, dataclasses.asdict(self), "train")
        bad = []
        if self.baseline == "mean" and int(self.batch_size) < 2:
            bad.append(
                "batch_size 1 with baseline=mean (the batch mean cancels every reward; use >= 2 or none)"
            )
        if self.baseline not in ("mean", "none"):
            bad.append(f"baseline {self.baseline!r} ('mean' or 'none')")
        if bad:
            raise SpecbenchError(
                "policy training config out of range: " + "; ".join(bad),
                "fix those settings (the allowed range follows each)",
            )


@dataclass(frozen=True, kw_only=True)
class TrainData:
    """train-policy's train.* beside TrainConfig's fields, which the pipeline reads itself: the arms a policy may
    pick (null: every arm of the rows) and whether rows missing an arm are kept."""

    arms: Annotated[list[str] | None, list_of(text(), null=True)]
    allow_incomplete: Annotated[bool, boolean()]
    # keep only the drafters whose measured acceptance over the rows is at most this (a pool rule; null: off)
    max_acceptance: Annotated[float | None, number(0, 1, null=True)] = None


@dataclass(frozen=True, kw_only=True)
class Sweep:
    """train-policy's sweep.*: the reward weights and training-set sizes swept (null: no sweep)."""

    alpha: Annotated[list[float] | None, list_of(number(0, 1), null=True)]
    n_examples: Annotated[list[int] | None, list_of(integer(1), null=True)]


# train-policy's own sections (conf/train_policy.yaml), by where they sit in its config
SECTIONS: dict[str, tuple[type, ...]] = {
    "train": (TrainConfig, TrainData),
    "reward": (RewardSpec,),
    "sweep": (Sweep,),
}


@dataclass
class Policy:
    """Inference wrapper: standardizes an embedding and picks an arm name. ``meta``: checkpoint metadata."""

    model: PolicyNet
    mean: torch.Tensor
    std: torch.Tensor
    arms: list[str]
    meta: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if len(self.arms) != self.model.n_arms:
            raise SpecbenchError(
                f"policy: {len(self.arms)} arm names {self.arms} for a net with {self.model.n_arms} outputs",
                "pass one name per policy output",
            )
        self.model.eval()

    @property
    def dim(self) -> int:
        """Embedding size the policy reads."""
        return self.model.dim

    def probs(self, embedding: torch.Tensor) -> torch.Tensor:
        """Arm probabilities ``[A]`` for one embedding ``[D]``."""
        x = torch.as_tensor(embedding).reshape(-1).to(self.mean.dtype)
        if x.numel() != self.dim:
            raise SpecbenchError(
                f"policy: embedding has {x.numel()} values but the policy reads {self.dim}",
                "embed queries with the target the policy was trained for",
            )
        return self.model.probs((x - self.mean) / self.std)

    def choose(
        self, embedding: torch.Tensor, sample: bool = False, generator: torch.Generator | None = None
    ) -> str:
        """The arm with the highest probability, or one sampled with ``generator`` (required then)."""
        p = self.probs(embedding)
        if not sample:
            return self.arms[int(p.argmax())]
        if generator is None:
            raise SpecbenchError("policy: sampling an arm needs a torch.Generator", "pass generator=...")
        return self.arms[int(torch.multinomial(p, 1, generator=generator))]


@dataclass
class TrainResult:
    """A trained policy (best validation epoch), its standardization, curves and validation metrics."""

    model: PolicyNet
    mean: torch.Tensor
    std: torch.Tensor
    arms: list[str]
    history: list[dict[str, float]]
    metrics: dict[str, Any]
    train_idx: torch.Tensor
    val_idx: torch.Tensor
    config: TrainConfig

    def policy(self) -> Policy:
        """The inference wrapper around this result's model."""
        return Policy(self.model, self.mean, self.std, list(self.arms), {"metrics": self.metrics})
