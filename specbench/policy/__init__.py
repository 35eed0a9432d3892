"""Context-aware drafter selection: an offline contextual-bandit policy from query embedding to arm."""

from specbench.policy.checkpoint import check_compatible, check_not_trained_on, load_checkpoint, save_checkpoint
from specbench.policy.net import PolicyNet
from specbench.policy.reward import check_alpha, check_arms_scored, reward, reward_matrix, usable_arms
from specbench.policy.train import Policy, TrainConfig, TrainResult, evaluate_choices, split_indices, train_policy

__all__ = ["Policy", "PolicyNet", "TrainConfig", "TrainResult", "check_alpha", "check_arms_scored",
           "check_compatible", "check_not_trained_on", "evaluate_choices", "load_checkpoint", "reward", "reward_matrix",
           "save_checkpoint", "split_indices", "train_policy", "usable_arms"]
