"""Offline drafter-selection policy: rewards, REINFORCE on seeded synthetic contexts, evaluation, checkpoints."""

from __future__ import annotations

import pytest
import torch

from specbench.errors import SpecbenchError
from specbench.policy import (
    Policy,
    TrainConfig,
    check_arms_scored,
    check_compatible,
    load_checkpoint,
    reward,
    reward_matrix,
    save_checkpoint,
    usable_arms,
)
from specbench.training.reinforce import evaluate_choices, split_indices, train_policy

ARMS = ["autoregressive", "draft_a", "draft_b"]
MEANS = torch.tensor(
    [
        [0.8, 0.5, 0.2],  # cluster 0: autoregressive is best
        [0.2, 0.5, 0.8],
    ]
)  # cluster 1: draft_b is best
BEST = torch.tensor([0, 2])
FAST = dict(epochs=25, batch_size=32, lr=1e-2, hidden=(16,))


def clusters(
    n: int, seed: int, dim: int = 8, noise: float = 0.1
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Two Gaussian clusters (centres -1 and +1 in every coordinate, unit spread) with noisy rewards.
    Returns embeddings [n, dim], rewards [n, 3] and each point's cluster."""
    g = torch.Generator().manual_seed(seed)
    c = torch.randint(0, 2, (n,), generator=g)
    X = (2.0 * c[:, None] - 1.0) + torch.randn(n, dim, generator=g)
    R = MEANS[c] + noise * torch.randn(n, 3, generator=g)
    return X, R, c


@pytest.fixture(scope="module")
def trained():
    X, R, _ = clusters(300, seed=1)
    return train_policy(X, R, TrainConfig(**FAST), ARMS)


# -- rewards ---------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "alpha, expected", [(0.0, 0.8), (0.3, 0.3 * 0.6 + 0.7 * 0.8), (0.5, 0.7), (1.0, 0.6)]
)
def test_reward_by_hand(alpha, expected):
    assert reward(0.6, 0.2, alpha) == pytest.approx(expected)
    assert reward(1.0, 1.0, alpha) == pytest.approx(alpha)  # autoregressive: alignment 1, cost 1


def test_reward_matrix_by_hand_keeps_nan():
    alignment = torch.tensor([[1.0, 0.6, float("nan")], [1.0, 0.2, 0.9]])
    cost = torch.tensor([[1.0, 0.2, 0.1], [1.0, 0.5, 0.3]])
    R = reward_matrix(alignment, cost, 0.3)
    want = torch.tensor([[0.3, 0.74, float("nan")], [0.3, 0.3 * 0.2 + 0.7 * 0.5, 0.3 * 0.9 + 0.7 * 0.7]])
    assert torch.allclose(R, want, equal_nan=True)
    assert torch.isnan(reward_matrix(alignment, cost, 0.0)[0, 2])  # NaN even when alignment has weight 0
    assert torch.allclose(reward(alignment[1], cost[1], 0.3), want[1])
    assert usable_arms(R) == [0, 1]


@pytest.mark.parametrize("alpha", [-0.1, 1.5, float("nan")])
def test_alpha_out_of_range(alpha):
    with pytest.raises(SpecbenchError, match="alpha"):
        reward(0.5, 0.5, alpha)
    with pytest.raises(SpecbenchError, match="alpha"):
        reward_matrix(torch.ones(2, 2), torch.ones(2, 2), alpha)


def test_reward_matrix_bad_input():
    with pytest.raises(SpecbenchError, match="shape"):
        reward_matrix(torch.ones(2, 3), torch.ones(2, 2), 0.5)
    with pytest.raises(SpecbenchError, match="alignment outside"):
        reward_matrix(torch.full((1, 2), 1.5), torch.ones(1, 2), 0.5)


# -- REINFORCE --------------------------------------------------------------------------------------
def test_learns_context_dependent_arm(trained):
    X, _, c = clusters(200, seed=2)
    policy = trained.policy()
    chosen = torch.tensor([ARMS.index(policy.choose(x)) for x in X])
    assert (chosen == BEST[c]).float().mean() >= 0.95
    m = trained.metrics
    assert m["policy"] > m["best_single"] + 0.1 and m["policy"] > m["random"] + 0.1
    assert m["share"]["draft_a"] < 0.05  # never best
    assert trained.history[m["best_epoch"] - 1]["val_reward"] == pytest.approx(m["policy"])


def test_training_is_deterministic(trained):
    X, R, _ = clusters(300, seed=1)
    again = train_policy(X, R, TrainConfig(**FAST), ARMS)
    for (k, a), b in zip(trained.model.state_dict().items(), again.model.state_dict().values()):
        assert torch.equal(a, b), k
    other = train_policy(X, R, TrainConfig(**{**FAST, "seed": 7, "epochs": 2}), ARMS)
    assert not torch.equal(other.model.layers[0].weight, trained.model.layers[0].weight)


def test_standardization_uses_training_rows(trained):
    X, _, _ = clusters(300, seed=1)
    assert torch.allclose(trained.mean, X[trained.train_idx].mean(0))
    assert torch.allclose(trained.std, X[trained.train_idx].std(0, unbiased=False))
    assert set(trained.train_idx.tolist()).isdisjoint(trained.val_idx.tolist())
    assert len(trained.train_idx) + len(trained.val_idx) == 300 and len(trained.val_idx) == 60


def test_nan_arm_never_chosen_where_unscored():
    X, _, c = clusters(120, seed=3)
    R = torch.full((120, 3), 0.6)  # every scored choice earns 0.6; a sampled NaN arm would count as 0
    R[c == 1, 2] = float("nan")
    R[c == 0, 1] = float("nan")
    res = train_policy(X, R, TrainConfig(**{**FAST, "epochs": 5, "val_fraction": 0.5}), ARMS)
    assert all(h["train_reward"] == pytest.approx(0.6) for h in res.history)  # never sampled where NaN
    assert res.metrics["unscored"] == 0 and res.metrics["policy"] == pytest.approx(0.6)  # nor chosen greedily


def test_all_nan_arm_raises_with_name():
    X, R, _ = clusters(20, seed=4)
    R[:, 1] = float("nan")
    with pytest.raises(SpecbenchError, match="cannot score arm draft_a") as e:
        train_policy(X, R, TrainConfig(**FAST), ARMS)
    assert "reward.source=measured" in str(e.value)
    with pytest.raises(SpecbenchError, match="draft_a"):
        check_arms_scored(R, ARMS)


def test_n_examples_caps_training_set_only():
    X, R, _ = clusters(100, seed=5)
    cfg = TrainConfig(**{**FAST, "epochs": 1})
    small = train_policy(X, R, TrainConfig(**{**FAST, "epochs": 1, "n_examples": 10}), ARMS)
    full = train_policy(X, R, cfg, ARMS)
    assert len(small.train_idx) == 10 and small.metrics["n_train"] == 10
    assert torch.equal(small.val_idx, full.val_idx) and len(full.train_idx) == 80
    assert set(small.train_idx.tolist()) <= set(full.train_idx.tolist())


@pytest.mark.parametrize(
    "X, R, cfg, match",
    [
        (torch.zeros(0, 4), torch.zeros(0, 3), TrainConfig(), "empty"),
        (torch.zeros(5, 4), torch.zeros(4, 3), TrainConfig(), "5 embeddings but 4 reward rows"),
        (torch.zeros(5, 4), torch.zeros(5, 3), TrainConfig(n_examples=0), "n_examples"),
        (torch.zeros(5, 4), torch.zeros(5, 3), TrainConfig(baseline="max"), "baseline"),
    ],
)
def test_bad_training_input(X, R, cfg, match):
    with pytest.raises(SpecbenchError, match=match) as e:
        train_policy(X, R, cfg, ARMS)
    assert e.value.fix


def test_split_indices():
    tr, va = split_indices(10, 0.2, seed=0)
    assert len(va) == 2 and sorted(tr.tolist() + va.tolist()) == list(range(10))
    assert torch.equal(va, split_indices(10, 0.2, seed=0)[1])
    assert len(split_indices(3, 0.01, seed=0)[1]) == 1  # at least one validation point
    assert len(split_indices(1, 0.5, seed=0)[1]) == 0 and len(split_indices(10, 0.0, seed=0)[1]) == 0


# -- evaluation -------------------------------------------------------------------------------------
def test_evaluate_choices_by_hand():
    R = torch.tensor([[0.9, 0.5, 0.1], [0.2, 0.6, float("nan")], [0.3, 0.1, 0.8]])
    m = evaluate_choices(R, torch.tensor([0, 0, 2]))
    assert m["policy"] == pytest.approx((0.9 + 0.2 + 0.8) / 3)
    assert m["oracle"] == pytest.approx((0.9 + 0.6 + 0.8) / 3)
    # column means (NaN-aware): 0.4667, 0.4, 0.45 -> arm 0
    assert m["best_single"] == pytest.approx((0.9 + 0.2 + 0.3) / 3) and m["best_single_arm"] == 0
    assert m["random"] == pytest.approx((0.5 + 0.4 + 0.4) / 3)
    assert m["accuracy"] == pytest.approx(2 / 3)
    on_nan = evaluate_choices(R, torch.tensor([0, 2, 2]))
    assert on_nan["unscored"] == 1 and on_nan["policy"] == pytest.approx(0.85)


# -- inference and checkpoints -------------------------------------------------------------------------
def test_policy_choose_and_probs(trained):
    policy = trained.policy()
    x = torch.full((8,), 1.0)
    p = policy.probs(x)
    assert p.shape == (3,) and p.sum().item() == pytest.approx(1.0)
    assert policy.choose(x) == "draft_b" and policy.choose(-x) == "autoregressive"
    draws = [policy.choose(x, sample=True, generator=torch.Generator().manual_seed(s)) for s in range(5)]
    assert draws == [
        policy.choose(x, sample=True, generator=torch.Generator().manual_seed(s)) for s in range(5)
    ]
    with pytest.raises(SpecbenchError, match="reads 8"):
        policy.probs(torch.zeros(5))
    with pytest.raises(SpecbenchError, match="Generator"):
        policy.choose(x, sample=True)


def test_dropout_and_entropy_are_seeded():
    X, R, _ = clusters(60, seed=8)
    cfg = TrainConfig(**{**FAST, "epochs": 3, "dropout": 0.3, "entropy": 0.1, "baseline": "none"})
    a, b = train_policy(X, R, cfg, ARMS), train_policy(X, R, cfg, ARMS)
    assert torch.equal(a.model.layers[-1].weight, b.model.layers[-1].weight)
    assert [h["train_reward"] for h in a.history] == [h["train_reward"] for h in b.history]


EMB = {"pooling": "mean", "source": "decoder_last_hidden", "dim": 8, "target": "embedded:toy"}


def test_checkpoint_round_trip(trained, tmp_path):
    path = save_checkpoint(
        tmp_path / "a" / "b" / "policy.pt",
        trained,
        arms=ARMS,
        embedding=EMB,
        alpha=0.5,
        config={"policy": {"hidden": (16,), "lr": 0.01}},
    )
    loaded = load_checkpoint(path)
    X, _, _ = clusters(10, seed=6)
    for x in X:
        assert torch.allclose(loaded.probs(x), trained.policy().probs(x))
    assert loaded.arms == ARMS and loaded.meta["alpha"] == 0.5 and loaded.meta["embedding"] == EMB
    assert loaded.meta["config"]["policy"]["hidden"] == [16]
    assert loaded.meta["metrics"]["best_single_arm"] == trained.metrics["best_single_arm"]
    # issue 34: the train-policy run directory is accepted for its policy.pt; an empty directory says what it lacks
    assert load_checkpoint(path.parent).arms == ARMS
    with pytest.raises(SpecbenchError, match="is a directory without policy.pt"):
        load_checkpoint(tmp_path / "a")
    blob = torch.load(path, weights_only=True)  # safe-loadable
    assert blob["format"] == "specbench-policy" and blob["dim"] == 8
    again = tmp_path / "again.pt"
    save_checkpoint(again, loaded, arms=ARMS, embedding=EMB, alpha=0.5, config={})
    assert torch.allclose(load_checkpoint(again).probs(X[0]), loaded.probs(X[0]))


def test_checkpoint_errors(trained, tmp_path):
    with pytest.raises(SpecbenchError, match="missing.pt") as e:
        load_checkpoint(tmp_path / "missing.pt")
    assert "specbench train-policy" in str(e.value)
    junk = tmp_path / "junk.pt"
    junk.write_text("not a checkpoint")
    with pytest.raises(SpecbenchError, match="not a specbench policy checkpoint"):
        load_checkpoint(junk)
    other = tmp_path / "other.pt"
    torch.save({"weights": torch.zeros(2)}, other)
    with pytest.raises(SpecbenchError, match="not a specbench policy checkpoint"):
        load_checkpoint(other)
    with pytest.raises(SpecbenchError, match="arms"):
        save_checkpoint(tmp_path / "x.pt", trained, arms=ARMS[::-1], embedding=EMB, alpha=0.5, config={})


def test_check_compatible(trained, tmp_path):
    policy = load_checkpoint(
        save_checkpoint(tmp_path / "p.pt", trained, arms=ARMS, embedding=EMB, alpha=0.5, config={})
    )
    check_compatible(policy, ["draft_b", "draft_a", "autoregressive", "extra"], 8)  # superset pool is fine
    with pytest.raises(SpecbenchError) as e:
        check_compatible(policy, ["autoregressive", "draft_a", "lookup"], 8)
    assert "draft_b" in e.value.problem and "lookup" in e.value.problem
    with pytest.raises(SpecbenchError) as e:
        check_compatible(policy, ARMS, 576)
    assert "576" in e.value.problem and "8" in e.value.problem and "embedded:toy" in e.value.problem
    assert isinstance(policy, Policy)


def test_the_measured_cost_is_each_arms_speculative_time_over_the_targets():
    """Issue 43: ``reward.cost=speed`` costs an arm by its measured speculative seconds per token over the target's
    (1 / its speedup; the target's own arm 1), so a drafter that slows decoding costs more than the target
    although it has fewer parameters; rows without that measurement are refused, not scored on parameters."""
    from specbench.policy.scores import cost_matrix

    rows = [
        {
            "arms": {
                "autoregressive": {"cost_params": 1.0},
                "small": {"cost_params": 0.1, "spec": {"speedup": 0.8}},
                "head": {"cost_params": 0.05, "spec": {"speedup": 1.25}},
            }
        }
    ]
    arms = ["autoregressive", "small", "head"]
    speed = cost_matrix(rows, arms, "speed")[0].tolist()
    assert speed == pytest.approx(
        [1.0 / 1.25, 1.25 / 1.25, 0.8 / 1.25]
    )  # each / the largest (the small one's)
    assert cost_matrix(rows, arms, "params")[0].tolist() == pytest.approx([1.0, 0.1, 0.05])
    del rows[0]["arms"]["head"]["spec"]
    with pytest.raises(SpecbenchError, match="no measured speculative run of head"):
        cost_matrix(rows, arms, "speed")


def test_eval_default_pool_becomes_the_policys_own_and_a_chosen_pool_stays(trained, tmp_path):
    """pool=auto (eval's default) carries ``from_policy``: with a policy whose checkpoint keeps its collection's
    pool, the eval runs on that pool; a pool chosen by name has no such key and is kept; the key never reaches the
    run's config."""
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    from specbench.configs import conf_dir
    from specbench.pipelines.evaluate import use_policy_pool

    own = {"drafters": {"prompt_lookup": {"_target_": "specbench.drafters.prompt_lookup.build"}}}
    path = save_checkpoint(
        tmp_path / "policy.pt", trained, arms=ARMS, embedding=EMB, alpha=0.5, config={}, pool=own
    )
    with initialize_config_dir(config_dir=str(conf_dir()), version_base=None):
        default, chosen = (
            compose("eval", overrides=[*extra, "selector=policy", f"policy.checkpoint={path}"])
            for extra in ([], ["pool=tiny"])
        )
        no_policy = compose("eval")
    assert default.pool.from_policy is True and "from_policy" not in chosen.pool
    use_policy_pool(default)
    assert OmegaConf.to_container(default.pool) == own
    tiny = OmegaConf.to_container(chosen.pool)
    use_policy_pool(chosen)
    assert OmegaConf.to_container(chosen.pool) == tiny
    heads = {k: v for k, v in OmegaConf.to_container(no_policy.pool).items() if k != "from_policy"}
    use_policy_pool(no_policy)  # no policy: the default pool, without the key
    assert OmegaConf.to_container(no_policy.pool) == heads and "eagle_general" in heads["drafters"]
