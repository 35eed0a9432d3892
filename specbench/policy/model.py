"""The context-aware policy as it is stored and used: its training settings (``TrainConfig``), a training run's
result (``TrainResult``: the best validation epoch's net, its standardization, curves and metrics) and the
inference wrapper (``Policy``: embedding -> arm). Training itself is ``specbench.training.reinforce``."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from specbench.errors import SpecbenchError
from specbench.policy.net import PolicyNet
from specbench.validate import COUNT, SEED, Rule, boolean, integer, list_of, number, text

# train-policy (conf/train_policy.yaml): TrainConfig's train.* (epochs, lr, batch_size and seed are train-drafter's
# too: one rule each, here), the reward (reward.py, scores.py: RewardSpec) and the sweeps
KEYS: dict[str, Rule] = {
    "train.arms": list_of(text(), null=True),
    "train.hidden": list_of(integer(1)),
    "train.epochs": integer(0),
    "train.lr": number(0, low_open=True, null=True, note=" (train-drafter: null is the kind's default)"),
    "train.batch_size": COUNT,
    "train.entropy": number(0),
    "train.baseline": text(),
    "train.weight_decay": number(0),
    "train.dropout": number(0, 1),
    "train.seed": SEED,
    "train.val_fraction": number(0, 1),
    "train.n_examples": integer(1, null=True),
    "train.standardize": boolean(),
    "train.allow_incomplete": boolean(),
    "reward.alpha": number(0, 1),
    "reward.cost": text(),
    "reward.source": text(),
    "reward.alignment": text(),
    "sweep.alpha": list_of(number(0, 1), null=True),
    "sweep.n_examples": list_of(integer(1), null=True),
}


@dataclass
class TrainConfig:
    """Policy-training settings (see the module docstring for the objective)."""

    hidden: Sequence[int] = (64,)
    epochs: int = 300
    lr: float = 1e-2  # Adam
    batch_size: int = 64
    entropy: float = 0.0  # entropy-bonus weight
    baseline: str = "mean"  # "mean": batch mean of the sampled rewards; "none": 0
    weight_decay: float = 0.0
    seed: int = 0
    val_fraction: float = 0.2
    # cap on training queries (data-efficiency sweeps); validation set unchanged
    n_examples: int | None = None
    standardize: bool = True  # standardize embeddings with the training set's mean / std
    dropout: float = 0.0

    def check(self) -> None:
        """SpecbenchError for any setting out of range."""
        bad = []
        if int(self.epochs) < 1:
            bad.append(f"epochs {self.epochs} (>= 1)")
        if not float(self.lr) > 0:
            bad.append(f"lr {self.lr} (> 0)")
        if int(self.batch_size) < 1:
            bad.append(f"batch_size {self.batch_size} (>= 1)")
        if self.baseline == "mean" and int(self.batch_size) < 2:
            bad.append(
                "batch_size 1 with baseline=mean (the batch mean cancels every reward; use >= 2 or none)"
            )
        if not float(self.entropy) >= 0:
            bad.append(f"entropy {self.entropy} (>= 0)")
        if self.baseline not in ("mean", "none"):
            bad.append(f"baseline {self.baseline!r} ('mean' or 'none')")
        if not float(self.weight_decay) >= 0:
            bad.append(f"weight_decay {self.weight_decay} (>= 0)")
        if not 0.0 <= float(self.val_fraction) < 1.0:
            bad.append(f"val_fraction {self.val_fraction} (in [0, 1))")
        if self.n_examples is not None and int(self.n_examples) < 1:
            bad.append(f"n_examples {self.n_examples} (>= 1, or null for all)")
        if not list(self.hidden) or any(int(h) < 1 for h in self.hidden):
            bad.append(f"hidden {list(self.hidden)} (a non-empty list of sizes >= 1)")
        if not 0.0 <= float(self.dropout) < 1.0:
            bad.append(f"dropout {self.dropout} (in [0, 1))")
        if bad:
            raise SpecbenchError(
                "policy training config out of range: " + "; ".join(bad),
                "fix those settings (the allowed range follows each)",
            )


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
