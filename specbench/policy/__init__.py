"""Context-aware drafter selection: an offline contextual-bandit policy from query embedding to arm (its net,
reward, stored form and inference wrapper; training is ``specbench.training.reinforce``)."""

from specbench.policy.checkpoint import (
    check_compatible,
    check_not_trained_on,
    load_checkpoint,
    save_checkpoint,
)
from specbench.policy.model import Policy, TrainConfig, TrainResult
from specbench.policy.net import PolicyNet
from specbench.policy.reward import check_alpha, check_arms_scored, reward, reward_matrix, usable_arms

__all__ = [
    "Policy",
    "PolicyNet",
    "TrainConfig",
    "TrainResult",
    "check_alpha",
    "check_arms_scored",
    "check_compatible",
    "check_not_trained_on",
    "load_checkpoint",
    "reward",
    "reward_matrix",
    "save_checkpoint",
    "usable_arms",
]
