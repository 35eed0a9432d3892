"""Online drafter-selection bandits on seeded synthetic reward streams (no models)."""

from __future__ import annotations

import math
import random
import statistics
from pathlib import Path

import pytest
from hydra.utils import instantiate
from omegaconf import OmegaConf

from specbench.errors import SpecbenchError
from specbench.pipelines.methods import make_selector
from specbench.selection import (
    EXP3,
    UCB,
    BanditSelector,
    DiscountedUCB,
    EpsilonGreedy,
    ExploreThenCommit,
    Feedback,
    Hedge,
    RandomSelector,
    SequentialHalving,
    SlidingWindowUCB,
)

ARMS = ["autoregressive", "a", "b", "c"]
MEANS = {"a": 0.3, "b": 0.5, "c": 0.8}  # "c" is the best drafter
CONF = Path(__file__).resolve().parents[2] / "conf" / "selector"
ALL = [
    UCB,
    EXP3,
    SequentialHalving,
    ExploreThenCommit,
    DiscountedUCB,
    SlidingWindowUCB,
    EpsilonGreedy,
    RandomSelector,
    Hedge,
]


def feedback(bd: float = 0.0, be: float = 0.0) -> Feedback:
    return Feedback(
        drafted=4, accepted=round(4 * be), n_max=4, be=be, bd=bd, t_draft=0.0, t_verify=0.0, t_switch=0.0
    )


# -- synthetic environments: (arm, round, rng) -> reward in [0, 1] -----------------------------------
def bernoulli(means=MEANS):
    return lambda arm, t, rng: float(rng.random() < means[arm])


def bd_like(means=MEANS, sd=0.05):
    """Dense, low-variance rewards (Block Divergence): clipped Gaussian around the mean."""
    return lambda arm, t, rng: min(1.0, max(0.0, rng.gauss(means[arm], sd)))


def _alpha_for(mean: float, n_max: int) -> float:
    """Per-token acceptance alpha whose E[accepted] / n_max = (1/n_max) sum_{j<=n_max} alpha^j equals mean."""
    lo, hi = 0.0, 1.0
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if sum(mid**j for j in range(1, n_max + 1)) / n_max < mean else (lo, mid)
    return lo


def be_like(means=MEANS, n_max=4):
    """Sparse rewards (Block Efficiency): accepted / n_max, accepted = leading run of Bernoulli(alpha)."""
    alphas = {arm: _alpha_for(m, n_max) for arm, m in means.items()}

    def reward(arm, t, rng):
        accepted = 0
        while accepted < n_max and rng.random() < alphas[arm]:
            accepted += 1
        return accepted / n_max

    return reward


def play(selector: BanditSelector, env, rounds: int, seed: int = 0) -> list[str]:
    """One query of ``rounds`` rounds; the reward goes in the field the selector reads."""
    rng = random.Random(10_000 + seed)
    selector.reset("query")
    picks = []
    for t in range(rounds):
        arm = selector.select()
        picks.append(arm)
        r = env(arm, t, rng)
        selector.update(arm, feedback(bd=r, be=r))
    return picks


def share(picks, arm="c") -> float:
    return sum(p == arm for p in picks) / len(picks)


def identification_round(picks, best="c", window=20, threshold=0.9) -> int:
    """First round after which every window of ``window`` picks plays ``best`` >= ``threshold`` of the time."""
    n = len(picks)
    ok = [share(picks[s : s + window], best) >= threshold for s in range(n - window + 1)]
    for t in range(len(ok)):
        if all(ok[t:]):
            return t
    return n


# -- UCB ---------------------------------------------------------------------------------------------
def test_ucb_plays_the_best_arm_late():
    picks = play(UCB(ARMS, seed=0), bernoulli(), 1000)
    assert set(picks[:3]) == {"a", "b", "c"}  # each arm once first
    assert share(picks[-200:]) > 0.8


def test_ucb_identifies_the_best_arm_sooner_with_dense_bd_rewards():
    # Same means, different noise: the dense BD-like reward pins the means down in a few pulls, the
    # sparse BE-like one needs many. (With beta = 1 UCB1 explores ~2 ln t / gap^2 times whatever the
    # variance, so the bonus, not the noise, sets when it settles; beta = 0.5 lets the noise show.)
    seeds = range(12)
    bd = statistics.mean(
        identification_round(play(UCB(ARMS, beta=0.5, seed=s), bd_like(), 300, s), threshold=0.8)
        for s in seeds
    )
    be = statistics.mean(
        identification_round(play(UCB(ARMS, beta=0.5, seed=s), be_like(), 300, s), threshold=0.8)
        for s in seeds
    )
    assert bd < 0.5 * be, (bd, be)


def test_sliding_window_and_discounted_ucb_recover_after_a_switch_faster_than_ucb():
    # At round 500 the worst drafter becomes the best and the old best stays decent: plain UCB keeps
    # trusting 500 rounds of old statistics; the window / discount forgets them. Same beta for all.
    after = {"a": 0.9, "b": 0.5, "c": 0.6}

    def env(arm, t, rng):
        return min(1.0, max(0.0, rng.gauss((MEANS if t < 500 else after)[arm], 0.05)))

    def recovery(make):
        return statistics.mean(share(play(make(s), env, 700, s)[500:700], "a") for s in range(16))

    ucb = recovery(lambda s: UCB(ARMS, beta=0.3, seed=s))
    sw = recovery(lambda s: SlidingWindowUCB(ARMS, window=100, beta=0.3, seed=s))
    du = recovery(lambda s: DiscountedUCB(ARMS, gamma=0.98, beta=0.3, seed=s))
    assert sw > ucb + 0.15 and du > ucb + 0.15, (sw, du, ucb)


# -- explore-then-commit and sequential halving ------------------------------------------------------
def test_etc_explores_round_robin_then_commits_to_the_best():
    runs = [play(ExploreThenCommit(ARMS, seed=s), bd_like(sd=0.1), 40, s) for s in range(50)]
    assert runs[0][:9] == ["a", "b", "c"] * 3  # m = 3 pulls each, round robin
    committed = [r[9:] == ["c"] * 31 for r in runs]
    assert sum(committed) >= 45


def test_etc_eliminates_clearly_worse_arms_early():
    sel = ExploreThenCommit(ARMS, m=50, delta=0.1)
    picks = play(sel, bd_like(means={"a": 0.05, "b": 0.1, "c": 0.95}, sd=0.02), 150)
    assert sel.committed == 2 and picks[-1] == "c"
    last_other = max(t for t, p in enumerate(picks) if p != "c")
    assert last_other < 90  # committed long before 3 * 50 exploration rounds
    no_elim = play(ExploreThenCommit(ARMS, m=50, delta=None), bd_like(sd=0.02), 150)
    assert share(no_elim[:150]) == pytest.approx(1 / 3)


def test_sequential_halving_schedule_and_commit():
    sel = SequentialHalving(ARMS, budget=24)
    picks = play(sel, bd_like(), 40)
    assert sel.phases == 2
    assert sorted(picks[:12]) == sorted(["a", "b", "c"] * 4)  # phase 1: 24 // (3 * 2) = 4 pulls each
    assert sorted(picks[12:24]) == sorted(["b", "c"] * 6)  # phase 2: 24 // (2 * 2) = 6 pulls each
    assert set(picks[24:]) == {"c"}


# -- EXP3 --------------------------------------------------------------------------------------------
def test_exp3_probabilities_stay_a_distribution():
    sel = EXP3(ARMS, gamma=0.1, seed=3)
    env, rng = bernoulli(), random.Random(0)
    sel.reset()
    for t in range(1000):
        arm = sel.select()
        sel.update(arm, feedback(bd=env(arm, t, rng)))
        p = sel.probabilities()
        assert len(p) == 3 and min(p) >= 0.0 and abs(sum(p) - 1.0) < 1e-6
    assert max(range(3), key=lambda i: p[i]) == 2  # it learned "c"
    extreme = EXP3(ARMS, gamma=0.01)
    for _ in range(5000):  # huge importance weights must not overflow
        extreme.update("a", feedback(bd=1.0))
    p = extreme.probabilities()
    assert min(p) >= 0.0 and abs(sum(p) - 1.0) < 1e-6


# -- shared behaviour --------------------------------------------------------------------------------
@pytest.mark.parametrize("cls", ALL)
def test_reset_clears_statistics_and_carry_over_decays_them(cls):
    sel = cls(ARMS, seed=1)
    play(sel, bernoulli(), 20)
    assert sum(sel.counts) > 0 and sel.t == 20
    sel.reset("next query")
    assert sel.counts == [0.0] * 3 and sel.sums == [0.0] * 3 and sel.t == 0
    if isinstance(sel, EXP3):
        assert sel.log_w == [0.0] * 3

    warm = cls(ARMS, seed=1, carry_over=True, decay=0.5)
    play(warm, bernoulli(), 20)
    counts, sums = list(warm.counts), list(warm.sums)
    log_w = list(getattr(warm, "log_w", []))
    warm.reset("next query")
    assert warm.counts == pytest.approx([0.5 * c for c in counts])
    assert warm.sums == pytest.approx([0.5 * s for s in sums])
    assert getattr(warm, "log_w", []) == pytest.approx([0.5 * w for w in log_w])
    assert warm.select() in {"a", "b", "c"}


@pytest.mark.parametrize("cls", ALL)
def test_same_seed_same_choices(cls):
    runs = [play(cls(ARMS, seed=7), bernoulli(), 200, seed=1) for _ in range(2)]
    assert runs[0] == runs[1]
    assert set(runs[0]) <= {"a", "b", "c"}


def test_random_selectors_depend_on_their_seed():
    for cls in (RandomSelector, EXP3):
        assert play(cls(ARMS, seed=1), bernoulli(), 100) != play(cls(ARMS, seed=2), bernoulli(), 100)


def test_arms_and_reward_choice():
    assert UCB(ARMS).candidates == ["a", "b", "c"]
    assert UCB(ARMS, include_autoregressive=True).candidates == ARMS
    assert UCB(ARMS, candidates=["c", "a"]).candidates == ["c", "a"]
    with pytest.raises(SpecbenchError, match="no arm named nope") as err:
        UCB(ARMS, candidates=["a", "nope"])
    assert "autoregressive, a, b, c" in err.value.fix
    with pytest.raises(SpecbenchError, match="unknown bandit reward"):
        UCB(ARMS, reward="rouge")
    with pytest.raises(SpecbenchError, match="no arm to play"):
        UCB(["autoregressive"])
    with pytest.raises(SpecbenchError, match=r"selector.decay=1.5: expected a finite number in \[0, 1\]"):
        make_selector({"_target_": "specbench.selection.UCB", "carry_over": True, "decay": 1.5}, ARMS)

    for reward, value in (("bd", 0.25), ("be", 0.75)):
        sel = UCB(ARMS, reward=reward)
        sel.update("a", feedback(bd=0.25, be=0.75))
        assert sel.sums[0] == value and sel.counts[0] == 1.0
    with pytest.raises(ValueError):
        UCB(ARMS).update("autoregressive", feedback())


def test_random_per_query_keeps_one_arm_per_query_and_varies_across_queries():
    sel = RandomSelector(ARMS, per_query=True, seed=3)
    firsts = set()
    for q in range(30):
        picks = play(sel, bernoulli(), 12, seed=q)
        assert len(set(picks)) == 1
        firsts.add(picks[0])
    assert firsts == set(sel.candidates)  # every arm is drawn for some query
    mixture = play(RandomSelector(ARMS, seed=3), bernoulli(), 60)
    assert set(mixture) == set(sel.candidates)  # the per-round mixture switches inside a query


def test_switch_cost_cuts_switches_between_close_arms():
    """Two arms 0.02 apart with noisy rewards: plain UCB keeps switching, the switching-cost variant
    stays on one arm far longer (same seeded environment)."""
    means = {"a": 0.50, "b": 0.52, "c": 0.51}
    env = bd_like(means, sd=0.15)
    switches = lambda picks: sum(x != y for x, y in zip(picks, picks[1:]))  # noqa: E731
    plain = switches(play(UCB(ARMS, beta=0.5), env, 300))
    sticky = switches(play(UCB(ARMS, beta=0.5, switch_cost=0.1), env, 300))
    assert sticky < plain / 3, (sticky, plain)
    with pytest.raises(SpecbenchError, match="selector.switch_cost=-1: expected a finite number >= 0"):
        make_selector({"_target_": "specbench.selection.UCB", "switch_cost": -1}, ARMS)


# -- configs -----------------------------------------------------------------------------------------
BANDIT_CONFS = [
    "ucb",
    "ucb_be",
    "exp3",
    "sequential_halving",
    "explore_commit",
    "discounted_ucb",
    "sliding_window_ucb",
    "epsilon_greedy",
    "random",
    "ucb_full_info",
    "random_per_query",
    "ucb_switch",
    "hedge",
    "ucb_carry",
]


TREE_CONFS = ["tree_ucb", "tree_hedge", "router", "router_tree"]


# the rounds built from drafts (the cost-model budget, the published router rules on the retrieval drafter): their
# tests need real drafters (tests/integration/test_dynamic_trees.py, test_selectors_lossless.py, test_replay.py)
ROUND_BUILDER_CONFS = [
    "budget",
    "budget_by_task",
    "budget_by_query",
    "budget_kept",
    "router_sam",
    "router_suffix",
]


def test_every_bandit_config_is_tested():
    from specbench.configs import aliases

    assert {p.stem for p in CONF.glob("*.yaml")} - {"fixed", "policy"} - set(aliases("selector")) == set(
        BANDIT_CONFS
    ) | set(TREE_CONFS) | set(ROUND_BUILDER_CONFS)


def test_an_older_selector_name_composes_the_renamed_option():
    """selector/etc.yaml was renamed explore_commit.yaml: the old name still composes the same selector (Hydra's
    selector=etc, methods: [selector:etc]), is not listed as an option of its own, and a run recorded under it
    compares equal to one of the new name (a resume or a reproduce rerun is not refused for the rename)."""
    from specbench.configs import aliases, group_options, load_option
    from specbench.pipelines.methods import load_selector_config
    from specbench.pipelines.session.run_dir import compared_settings, differences

    assert aliases("selector") == {"etc": "explore_commit"}
    assert "etc" not in group_options("selector") and "explore_commit" in group_options("selector")
    assert load_option("selector", "etc") == load_option("selector", "explore_commit")
    assert load_selector_config("etc") == load_selector_config("explore_commit")
    old = compared_settings({"methods": ["autoregressive", "selector:etc"]})
    new = compared_settings({"methods": ["autoregressive", "selector:explore_commit"]})
    assert differences(old, new) == []
    assert differences(old, compared_settings({"methods": ["selector:ucb"]}))  # a real change still counts


@pytest.mark.parametrize("stem", TREE_CONFS)
def test_tree_and_router_configs_instantiate_and_learn(stem):
    """The tree selectors keep prompt lookup in every tree and add the arm of best reward; the router
    routes to prompt lookup or to the fallback UCB's arm."""
    from specbench.configs import load_option
    from specbench.selection import Feedback, Route

    cfg = load_option("selector", stem)
    scfg = {k: v for k, v in OmegaConf.to_container(cfg, resolve=True).items() if k != "name"}
    arms = ["autoregressive", "prompt_lookup", "a", "b", "c"]
    sel = instantiate(scfg, arms=arms)
    means = {"prompt_lookup": 0.2, "a": 0.3, "b": 0.8, "c": 0.5}
    rng = random.Random(0)
    picks = []
    for _ in range(80):
        choice = sel.select()
        if stem.startswith("router"):
            assert isinstance(choice, Route) and choice.first == "prompt_lookup"
            assert choice.min_match == (1 if stem == "router" else 2)
            arm = choice.then if stem == "router" else choice.then[1]
            assert stem == "router" or choice.then == ("prompt_lookup", arm)
            sel.update(arm, Feedback(4, 0, 4, 0.0, min(1.0, max(0.0, rng.gauss(means[arm], 0.1))), 0, 0, 0))
        else:
            assert choice[0] == "prompt_lookup" and len(choice) == 2
            arm = choice[1]
            sel.update_tree(
                {
                    m: Feedback(4, 0, 4, 0.0, min(1.0, max(0.0, rng.gauss(means[m], 0.1))), 0, 0, 0)
                    for m in choice
                }
            )
        picks.append(arm)
    # the router's UCB sees only the rounds it plays (bandit feedback): it explores longer
    assert picks[-30:].count("b") >= (18 if stem.startswith("router") else 24), picks


@pytest.mark.parametrize("stem", BANDIT_CONFS)
def test_selector_configs_instantiate(stem):
    from specbench.configs import load_option

    cfg = load_option("selector", stem)  # the file with its defaults (the shared bandit knobs) applied
    assert cfg.reward == ("be" if stem == "ucb_be" else "bd")
    name = cfg.name
    assert name == {
        "ucb": "ucb-bd",
        "ucb_be": "ucb-be",
        "random": "random",
        "ucb_full_info": "ucb-bd-fi",
        "ucb_carry": "ucb-bd-carry",
    }.get(stem, name)
    scfg = {k: v for k, v in OmegaConf.to_container(cfg, resolve=True).items() if k != "name"}
    sel = instantiate(scfg, arms=ARMS)
    assert isinstance(sel, BanditSelector) and sel.candidates == ["a", "b", "c"]
    assert sel.full_information == (stem in ("ucb_full_info", "hedge"))
    picks = play(sel, bd_like(), 60)
    assert set(picks) <= {"a", "b", "c"} and sel.t == 60
    if stem not in ("random", "random_per_query"):
        assert share(picks[-20:]) >= 0.5
    assert sel.carry_over == (stem == "ucb_carry")


@pytest.mark.parametrize(
    "overrides, name, reward, candidates",
    [
        (["selector=ucb"], "ucb-bd", "bd", ["a", "b", "c"]),
        (
            ["selector=ucb", "selector.reward=be"],
            "ucb-be",
            "be",
            ["a", "b", "c"],
        ),  # the name follows the reward
        (["selector=etc", "selector.candidates=[c,a]"], "etc-bd", "bd", ["c", "a"]),
    ],
)
def test_composed_selector_through_parse_methods(overrides, name, reward, candidates):
    from hydra import compose, initialize_config_dir

    from specbench.pipelines.methods import parse_methods

    with initialize_config_dir(config_dir=str(CONF.parent), version_base=None):
        cfg = compose(config_name="eval", overrides=overrides)
    method = parse_methods(["selector"], dict.fromkeys(ARMS), cfg.selector)[-1]
    sel = method.make_selector()
    assert method.name == name and sel.reward == reward and sel.candidates == candidates


def test_a_named_selector_before_the_composed_one_does_not_replace_it():
    """methods=[selector:ucb, selector]: the composed selector (here the router) keeps its own config (it was
    once silently replaced by the last selector:<name>'s, then dropped as a duplicate name)."""
    from hydra import compose, initialize_config_dir

    from specbench.pipelines.methods import parse_methods

    with initialize_config_dir(config_dir=str(CONF.parent), version_base=None):
        cfg = compose(config_name="eval", overrides=["selector=router", "selector.fallback=a"])
    arms = ["autoregressive", "prompt_lookup", "a", "b"]
    methods = parse_methods(
        ["selector:ucb", "selector", "selector:exp3"], dict.fromkeys(arms), cfg.selector, cfg
    )
    assert [m.name for m in methods] == ["autoregressive", "ucb-bd", "router", "exp3-bd"]
    router = methods[2].make_selector()
    assert type(router).__name__ == "Router" and router.fallback == "a"


# -- full-information feedback (early-exit arms observed without being played) ----------------------
@pytest.mark.parametrize("cls", [UCB, DiscountedUCB, SlidingWindowUCB, ExploreThenCommit])
def test_side_observations_spare_the_bad_observed_arm(cls):
    """Arm "a" (mean 0.3) is an early exit whose BD arrives every round for free: with full
    information the selector has no need to play it, and plays it far less than without."""
    env = bd_like()

    def run(full_information: bool, seeds=range(10)) -> float:
        plays = 0
        for seed in seeds:
            sel = cls(ARMS, full_information=full_information, seed=seed)
            sel.reset()
            rng = random.Random(20_000 + seed)
            for t in range(60):
                arm = sel.select()
                plays += arm == "a"
                sel.update(arm, feedback(bd=env(arm, t, rng)))
                if arm != "a":
                    sel.observe("a", env("a", t, rng))
        return plays / len(seeds)

    assert run(True) < run(False)
    assert run(True) <= 1.0


def test_side_observations_count_but_do_not_advance_rounds():
    sel = UCB(ARMS, full_information=True)
    sel.reset()
    sel.update("b", feedback(bd=0.5))
    sel.observe("a", 0.25)
    sel.observe("autoregressive", 0.9)  # not a candidate: ignored
    assert sel.t == 1
    assert sel.counts == [1.0, 1.0, 0.0] and sel.sums == [0.25, 0.5, 0.0]
    off = UCB(ARMS)
    off.reset()
    off.observe("a", 0.25)  # full_information off: ignored
    assert off.counts == [0.0, 0.0, 0.0]


def test_full_information_needs_bd_and_a_selector_that_can_use_it():
    with pytest.raises(SpecbenchError, match="full_information needs reward: bd"):
        UCB(ARMS, reward="be", full_information=True)
    with pytest.raises(SpecbenchError, match="exp3 does not take full_information"):
        EXP3(ARMS, full_information=True)


# -- Hedge -------------------------------------------------------------------------------------------
def full_information_play(sel, env, rounds, seed):
    """A query in which every arm's reward is observed every round (played or as a side observation)."""
    rng = random.Random(30_000 + seed)
    sel.reset()
    picks = []
    for t in range(rounds):
        arm = sel.select()
        picks.append(arm)
        rewards = {a: env(a, t, rng) for a in sel.candidates}
        sel.update(arm, feedback(bd=rewards[arm]))
        for a, r in rewards.items():
            if a != arm:
                sel.observe(a, r)
    return picks


def test_hedge_finds_the_best_arm_with_full_information():
    for seed in range(5):
        picks = full_information_play(
            Hedge(ARMS, eta=0.5, full_information=True, seed=seed), bernoulli(), 200, seed
        )
        assert share(picks[-100:]) > 0.9, seed


def test_hedge_weights_follow_the_cumulative_losses():
    sel = Hedge(ARMS, eta=1.0, full_information=True)
    sel.reset()
    sel.select()
    sel.update("a", feedback(bd=0.0))  # losses this round: a 1, b 1 - 0.5 (imputed prior), c 0.0
    sel.observe("c", 1.0)
    sel.select()  # folds the round in
    assert sel.losses == [1.0, 0.5, 0.0]
    p = sel.probabilities()
    assert p[2] > p[1] > p[0] and sum(p) == pytest.approx(1.0)
    assert p[2] / p[0] == pytest.approx(math.exp(1.0))
    with pytest.raises(SpecbenchError, match="selector.eta=0: expected a finite number > 0"):
        make_selector({"_target_": "specbench.selection.Hedge", "eta": 0}, ARMS)


def test_hedge_settles_on_the_best_arm_sooner_with_full_information():
    seeds = range(12)
    with_fi = statistics.mean(
        identification_round(
            full_information_play(Hedge(ARMS, eta=0.5, full_information=True, seed=s), bernoulli(), 200, s)
        )
        for s in seeds
    )
    without = statistics.mean(
        identification_round(play(Hedge(ARMS, eta=0.5, seed=s), bernoulli(), 200, s)) for s in seeds
    )
    assert with_fi < without
