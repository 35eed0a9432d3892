"""Verdicts that can fail honestly: paired per-query data, a seeded bootstrap interval, held / not held / inconclusive /
not judged, on small synthetic fixtures (pure numpy / pandas: no model is loaded)."""

from __future__ import annotations

import json
import math
import re

import numpy as np
import pandas as pd
import pytest

from specbench.reproduction import compare as C
from specbench.reproduction import inputs as R
from specbench.reproduction import intervals as CI
from specbench.reproduction import verdicts as V
from specbench.reproduction.layouts import CPU
from tests.unit.test_reproduction import write_examples as _write_examples

STATS = re.compile(
    r"^\*\*(held|not held|inconclusive|not judged)\*\*: .+ \((n < 16; )?n=\d+, .+ -?\d+\.\d{3}, "
    r"[\d.]+% CI \[-?\d+\.\d{3}, -?\d+\.\d{3}\]"
)


def timed(speedup: float, n: int = 16, noise: float = 0.05, seed: int = 1):
    """(base, method): per-query (seconds, tokens) of a baseline and of a method ``speedup`` times faster,
    each query's ratio scattered by ``noise``."""
    rng = np.random.default_rng(seed)
    tokens = rng.integers(20, 60, n).astype(float)
    base = tokens * 0.05 * (1 + 0.3 * rng.random(n))
    method = base / speedup * (1 + noise * rng.standard_normal(n))
    return (list(method), list(tokens)), (list(base), list(tokens))


def test_a_verdict_flips_from_held_to_not_held_when_the_numbers_cross():
    fast, base = timed(1.2)
    v = V.faster("a is faster than b", fast, base, ("a", "b"))
    assert v.held is True and v.interval[0] > 1 and v.n == 16
    slow, base = timed(0.8)
    v = V.faster("a is faster than b", slow, base, ("a", "b"))
    assert v.held is False and v.interval[1] < 1
    # an "at least x of y" claim: held above the threshold, not held entirely below it
    near, base = timed(0.99, noise=0.01)
    assert V.faster("c", near, base, threshold=0.95, at_least=True).held is True
    far, base = timed(0.85, noise=0.01)
    assert V.faster("c", far, base, threshold=0.95, at_least=True).held is False


def test_it_becomes_not_judged_when_n_shrinks():
    fast, base = timed(1.2, n=3)
    v = V.faster("a is faster than b", fast, base)
    assert v.held is None and v.reason == V.N_SMALL and v.n == 3 and f"fewer than {CI.MIN_N}" in v.detail
    assert v.line().startswith("**not judged**: a is faster than b (n < 16; n=3, ")
    # enough queries but too noisy for the effect: the interval straddles 1, so inconclusive (not "n too small")
    noisy, base = timed(1.05, n=16, noise=0.3, seed=3)
    v = V.faster("a is faster than b", noisy, base)
    assert v.held is None and v.interval[0] < 1 < v.interval[1] and v.reason == V.INCONCLUSIVE
    assert v.mark == "inconclusive" and v.line().startswith("**inconclusive**: a is faster than b (n=16, ")
    # the same straddling interval below 16 queries is not judged
    few, base = timed(1.05, n=15, noise=0.3, seed=3)
    assert V.faster("a is faster than b", few, base).mark == "not judged"
    # the same claim on many queries of the same effect and noise is judged
    many, base = timed(1.2, n=400, noise=0.3, seed=3)
    assert V.faster("a is faster than b", many, base).held is True


def test_a_tie_is_never_held():
    fast, base = timed(1.0, noise=0.0)
    v = V.faster("a is faster than b", fast, base)  # exactly equal on every query
    assert v.effect == pytest.approx(1.0) and v.held is False
    tie = V.greater_mean("more", [1.0] * 16, [1.0] * 16, "difference")
    assert tie.held is False
    # a noisy tie: faster on half the queries, slower by as much on the others (the totals are equal)
    secs = [
        1.0 + d
        for d in (
            -0.2,
            0.2,
            -0.1,
            0.1,
            -0.3,
            0.3,
            -0.05,
            0.05,
            -0.15,
            0.15,
            -0.25,
            0.25,
            -0.1,
            0.1,
            -0.2,
            0.2,
        )
    ]
    v = V.faster("a is faster than b", (secs, [10.0] * 16), ([1.0] * 16, [10.0] * 16))
    assert v.effect == pytest.approx(1.0) and v.held is None and v.interval[0] < 1 < v.interval[1]
    assert v.mark == "inconclusive"
    # an at-least claim exactly at its threshold is not held either (no tolerance turns > into >=)
    at, base = timed(0.95, noise=0.0)
    assert V.faster("c", at, base, threshold=0.95, at_least=True).held is not True
    # a majority needs more than half: 1 of 2, or 8 of 16, is no majority
    assert V.majority("m", [1.0, 0.0]).held is not True
    assert V.majority("m", [1.0] * 8 + [0.0] * 8).held is not True
    assert V.majority("m", [1.0] * 16).held is True


def test_the_interval_is_reproducible():
    fast, base = timed(1.1, noise=0.2, seed=7)
    a, b = V.faster("c", fast, base), V.faster("c", fast, base)
    assert a.interval == b.interval and a.line() == b.line()
    for interval in ("percentile", "expanded", "bca"):  # a resampled interval: the seed is what fixes it
        boot = CI.Bootstrap(interval=interval)
        again = V.faster("c", fast, base, boot=boot), V.faster("c", fast, base, boot=boot)
        assert again[0].interval == again[1].interval
        other = V.faster("c", fast, base, boot=CI.Bootstrap(seed=CI.SEED + 1, interval=interval))
        assert other.interval != again[0].interval
    point, lo, hi = CI.bootstrap({"x": [1.0, 2.0, 3.0, 4.0]}, CI.mean_of("x"))
    assert (point, lo, hi) == CI.bootstrap({"x": [1.0, 2.0, 3.0, 4.0]}, CI.mean_of("x"))
    assert point == 2.5 and lo < point < hi


def test_every_verdict_line_shows_n_effect_and_interval():
    fast, base = timed(1.2)
    slow, _ = timed(0.8)
    small, small_base = timed(1.2, n=3)
    lines = [
        V.faster("held", fast, base),
        V.faster("not held", slow, base),
        V.faster("small", small, small_base),
        V.non_inferior("kept", fast, base, 0.03),
        V.greater_mean("fewer", [3.0, 2, 4, 5], [1.0, 1, 2, 2], "switches"),
        V.all_of("both", [("x", V.faster("", fast, base)), ("y", V.faster("", slow, base))]),
        V.any_of("either", [("x", V.faster("", fast, base)), ("y", V.faster("", slow, base))]),
    ]
    for v in lines:
        assert STATS.search(v.line()), v.line()
    assert "non-inferiority margin 3% (stated)" in lines[3].line()
    # not pairable, missing: still n (0) and what would be estimated, and why
    for v in (
        V.unpaired("c", "only aggregates", "speedup ratio"),
        V.missing("c", "examples.jsonl", "speedup ratio"),
    ):
        assert v.held is None and "n=0, speedup ratio not estimated" in v.line()


def test_claims_of_several_parts():
    fast, base = timed(1.2)
    slow, _ = timed(0.8)
    small, small_base = timed(1.2, n=3)
    held, failed, unjudged = (
        V.faster("", fast, base),
        V.faster("", slow, base),
        V.faster("", small, small_base),
    )
    assert V.all_of("c", [("a", held), ("b", held)]).held is True
    assert V.all_of("c", [("a", held), ("b", failed)]).held is False
    assert V.all_of("c", [("a", held), ("b", unjudged)]).held is None
    assert V.any_of("c", [("a", failed), ("b", held)]).held is True
    assert V.any_of("c", [("a", failed), ("b", failed)]).held is False
    assert V.any_of("c", [("a", failed), ("b", unjudged)]).held is None
    assert V.bonferroni(1) == pytest.approx(0.95) and V.bonferroni(10) == pytest.approx(0.995)


# ---------------------------------------------------------------- exhibits on per-query fixture runs
def write_examples(path, speedups, n=16, **kw):
    """``tests/unit/test_reproduction.py``'s writer, 16 queries per task by default (``intervals.MIN_N``)."""
    return _write_examples(path, speedups, n=n, **kw)


def test_the_loader_pairs_per_query_and_keeps_the_last_record(tmp_path):
    write_examples(tmp_path / "run", {"math": {"fixed:a": 1.5}}, n=4)
    with (tmp_path / "run" / "examples.jsonl").open("a") as f:  # a resumed query, a torn last line
        f.write(
            json.dumps(
                {
                    "query_id": "math-0",
                    "task": "math",
                    "method": "fixed:a",
                    "seconds": 99.0,
                    "new_tokens": 20,
                    "target_calls": 20,
                }
            )
            + "\n"
            + '{"query_id": "math-1", "ta'
        )
    ex = R.load_examples(tmp_path, "run")
    assert len(ex) == 8 and ex[(ex.query_id == "math-0") & (ex.method == "fixed:a")].seconds.item() == 99.0
    p = C.paired(ex, ["autoregressive", "fixed:a"], "math")
    assert (
        list(p["fixed:a"].index)
        == list(p["autoregressive"].index)
        == ["math-0", "math-1", "math-2", "math-3"]
    )
    assert R.load_examples(tmp_path, "nothing").empty
    v = C.faster_on(R.load_examples(tmp_path, "nothing"), "c", "fixed:a", "autoregressive", run="nothing")
    assert v.held is None and "nothing/examples.jsonl" in v.line()


def test_heads_judge_the_specialists_only_and_the_generalist_on_its_own_line(tmp_path):
    from specbench.reproduction.metasd import metasd_heads

    run = tmp_path / "metasd" / "eval"
    run.mkdir(parents=True)
    mats = {
        "math": {"eagle_math": 2.0, "eagle_chat": 1.5, "eagle_general": 2.5},
        "chat": {"eagle_math": 1.4, "eagle_chat": 1.9, "eagle_general": 1.6},
    }
    pd.DataFrame(
        [
            {"task": t, "method": f"fixed:{d}", "speedup": 1.0, "mat": m, "acceptance_rate": 0.5}
            for t, row in mats.items()
            for d, m in row.items()
        ]
    ).to_csv(run / "summary.csv", index=False)
    extra = {f"fixed:{d}": (lambda i, d=d: {}) for d in mats["math"]}
    write_examples(run, {t: {f"fixed:{d}": 1.0 for d in row} for t, row in mats.items()}, extra=extra)
    # set each drafter's target calls from its MAT on the query's task
    lines = [json.loads(x) for x in (run / "examples.jsonl").read_text().splitlines()]
    for rec in lines:
        if rec["method"].startswith("fixed:"):
            rec["target_calls"] = round(rec["new_tokens"] / mats[rec["task"]][rec["method"][6:]])
    (run / "examples.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))
    ex = metasd_heads(tmp_path, [], CPU)
    (among,) = ex.verdicts  # issue 67: the seed claims the off-task drop among the specialists only
    # the generalist has the highest MAT on math, but the claim is among the specialists: held
    assert (
        "among the specialists" in among.claim and among.held is True and "eagle_general" not in among.detail
    )
    assert among.key == "metasd/heads#diagonal"


def test_huang_aggregates_are_not_judged_and_table6_pairs_each_policy_with_its_own_run(tmp_path):
    from specbench.reproduction.huang import huang_fig2, huang_fig3, huang_table6

    pol = tmp_path / "huang" / "policy"
    pol.mkdir(parents=True)
    pd.DataFrame(
        {
            "n_examples": [8, 64],
            "val_reward": [0.5, 0.5],
            "oracle_reward": [0.6, 0.6],
            "speedup_replayed": [0.589, 0.589],
            "oracle_speedup": [0.7, 0.7],
        }
    ).to_csv(pol / "data_efficiency.csv", index=False)
    fig3 = huang_fig3(tmp_path, [], CPU).verdicts[0]
    assert fig3.held is None and fig3.reason == V.NO_PAIRS  # was held on 0.589 against 0.589

    def live(with_ar: float, without: float):
        """The two live evals, each policy's speedup over its own run's autoregressive decoding."""
        for arm, sp in (("eval_with_ar", with_ar), ("eval_without_ar", without)):
            d = tmp_path / "huang" / "depth" / arm
            d.mkdir(parents=True, exist_ok=True)
            pd.DataFrame(
                [
                    {"task": t, "method": m, "speedup": v}
                    for t in ("summarization", "all")
                    for m, v in (("autoregressive", 1.0), ("policy", sp))
                ]
            ).to_csv(d / "summary.csv", index=False)
            write_examples(d, {"summarization": {"policy": sp}}, seed=len(arm))

    live(1.0, 0.6)  # with the AR arm the policy decodes at AR speed; without it, the exits slow it down
    v = huang_table6(tmp_path, [], CPU).verdicts[0]
    assert v.held is True and v.n == 16 and v.effect == pytest.approx(1 / 0.6, rel=0.02)
    assert "each over its run's autoregressive" in v.line()  # two processes: never paired across them
    live(0.6, 1.0)
    assert huang_table6(tmp_path, [], CPU).verdicts[0].held is False

    sweep = tmp_path / "huang" / "depth" / "alpha"
    sweep.mkdir(parents=True)
    cheap, aligned = CPU.alpha_arms  # the layout's (cheap, better-aligned) arms
    pd.DataFrame(
        {
            "alpha": [0.0, 1.0],
            "val_reward": [0.5, 0.7],
            "speedup_replayed": [0.6, 0.8],
            f"share_{cheap}": [0.5, 0.0],
            f"share_{aligned}": [0.5, 1.0],
        }
    ).to_csv(sweep / "alpha_sweep.csv", index=False)
    # issue 67: the shift of the choice with alpha, paired per validation query, not the endpoints' majorities
    assert huang_fig2(tmp_path, [], CPU).verdicts[0].reason == V.NO_PAIRS  # no per-query choices: not judged

    def choices(n: int, moved: int):
        """``n`` validation queries on the cheap arm at alpha 0; at alpha 1, ``moved`` of them on the aligned one."""
        pd.DataFrame(
            [{"alpha": 0.0, "query_id": f"v{i}", "arm": cheap} for i in range(n)]
            + [{"alpha": 1.0, "query_id": f"v{i}", "arm": aligned if i < moved else cheap} for i in range(n)]
        ).to_csv(sweep / "alpha_sweep_queries.csv", index=False)
        return huang_fig2(tmp_path, [], CPU).verdicts[0]

    assert choices(2, 2).held is None  # n too small
    assert choices(40, 1).held is not True  # one query of 40 moved: no shift shown
    v = choices(40, 30)
    assert v.held is True and v.key == "huang/fig2#shift" and v.effect == pytest.approx(0.75)


def test_switching_is_judged_per_query(tmp_path):
    from specbench.reproduction.metasd import metasd_switching

    run = tmp_path / "metasd" / "eval"
    run.mkdir(parents=True)
    pd.DataFrame(
        [
            {"task": "all", "method": m, "speedup": 1.0, "switches": s, "mat": 1.5}
            for m, s in (("ucb-bd", 40), ("ucb-switch-bd", 39))
        ]
    ).to_csv(run / "summary.csv", index=False)
    # one switch fewer in total, on one query: not evidence of fewer switches
    sw = {"ucb-bd": lambda i: {"switches": 5 + (i == 0)}, "ucb-switch-bd": lambda i: {"switches": 5}}
    write_examples(run, {"math": {"ucb-bd": 1.2, "ucb-switch-bd": 1.2}}, extra=sw)
    fewer, speed, etc_fewer, etc_speed = metasd_switching(tmp_path, [], CPU).verdicts
    assert fewer.held is not True
    # the same speed is not "faster": no margin turns a tie into a held claim
    assert "is faster than UCB-BD" in speed.claim and speed.held is not True and speed.n == 16
    assert "margin" not in speed.line() and "> 1" in speed.line()
    assert (
        etc_fewer.held is None and "explore-then-commit" in etc_fewer.line()
    )  # not run here: missing, not judged
    assert etc_speed.held is None and "explore-then-commit" in etc_speed.line()
    sw = {
        "ucb-bd": lambda i: {"switches": 6 + i % 3},
        "ucb-switch-bd": lambda i: {"switches": 1 + i % 2},
        "etc-bd": lambda i: {"switches": 1 + i % 2},
    }
    write_examples(run, {"math": {"ucb-bd": 1.2, "ucb-switch-bd": 1.32, "etc-bd": 1.0}}, extra=sw)
    fewer, speed, etc_fewer, etc_speed = metasd_switching(tmp_path, [], CPU).verdicts
    assert fewer.held is True and speed.held is True  # 1.32 against 1.2: faster
    assert speed.effect == pytest.approx(1.1, rel=0.01) and speed.interval[0] > 1
    assert (
        etc_fewer.held is False and etc_speed.held is False
    )  # as many switches as UCB with the penalty; 1.0 < 1.2
    write_examples(run, {"math": {"ucb-bd": 1.2, "ucb-switch-bd": 1.0, "etc-bd": 1.32}}, extra=sw)
    fewer, speed, etc_fewer, etc_speed = metasd_switching(tmp_path, [], CPU).verdicts
    assert speed.held is False and speed.interval[1] < 1  # 1.0 against 1.2: slower
    assert etc_speed.held is True and etc_speed.effect == pytest.approx(1.1, rel=0.01)


def test_cascades_compare_each_family_at_the_targets_quality(tmp_path):
    """Per task: the fastest speculative-cascade point whose quality reaches the target's is set against the fastest
    such lossy-SD and sequential-cascade points, paired per query; points below the target's quality do not count."""
    from specbench.reproduction.cascade_exhibits import CPU_CASCADES, cascades

    run = tmp_path / "cascades" / "greedy"
    run.mkdir(parents=True)

    def verdict(methods, quality):
        pd.DataFrame(
            [
                {
                    "task": "summarization",
                    "method": m,
                    "rule": m.split("@")[0],
                    "alpha": 0.3,
                    "speedup": sp,
                    "quality": quality.get(m, 5.0),
                    "metric": "rouge2",
                    "mat": 2.0,
                }
                for m, sp in methods.items()
            ]
        ).to_csv(run / "curves.csv", index=False)
        write_examples(
            run,
            {"summarization": methods},
            quality={m: {"rouge2": quality.get(m, 5.0)} for m in ["autoregressive", *methods]},
            calls_by_speed=True,  # the verdict's axis: tokens per target call
        )
        return cascades(tmp_path, [], CPU, CPU_CASCADES[0])

    methods = {"sd": 1.1, "drafter_alone": 3.0, "chow@0.3": 1.4, "opt@0.9": 2.5, "sequential@0.3": 1.2}
    ex = verdict(methods, {"opt@0.9": 2.0})  # opt is fastest but loses quality: it does not count
    v, curve = (
        ex.verdicts
    )  # greedy: the curve's quality side too (no baseline within 10% of chow's calls here)
    assert (
        v.key == "cascades/greedy#at-quality:summarization"
        and curve.key == "cascades/greedy#curve:summarization"
    )
    assert curve.held is None and curve.mark == "not judged"
    assert v.held is True and "chow@0.3 vs sd" in v.detail and "chow@0.3 vs sequential@0.3" in v.detail
    assert "opt@0.9" not in v.detail.split("; ", 1)[1] and "tokens_per_target_call" in ex.table
    assert set(ex.table.family) >= {"speculative cascade", "lossy SD", "sequential cascade"}
    # the sequential cascade is faster than the best speculative point: not held
    methods["sequential@0.3"] = 1.6
    assert verdict(methods, {"opt@0.9": 2.0}).verdicts[0].held is not True
    # no speculative point reaches the target's quality: not held
    assert verdict(methods, {"chow@0.3": 4.0, "opt@0.9": 2.0}).verdicts[0].held is False


def test_convergence_and_the_stream_are_judged_per_query(tmp_path):
    from specbench.reproduction.metasd import metasd_stream
    from specbench.reproduction.metasd_rounds import metasd_convergence

    run = tmp_path / "metasd" / "eval"
    run.mkdir(parents=True)
    pd.DataFrame(
        {"method": ["ucb-bd", "ucb-be"], "round": [0, 0], "share": [0.8, 0.4], "n": [16, 16]}
    ).to_csv(run / "convergence.csv", index=False)
    write_examples(
        run, {"math": {"fixed:eagle_math": 1.5, "fixed:eagle_chat": 1.0, "ucb-bd": 1.4, "ucb-be": 1.3}}
    )

    def rounds(bd_hits: int, be_hits: int):
        with (run / "rounds.jsonl").open("w") as f:
            for i in range(16):
                for method, hits in (("ucb-bd", bd_hits), ("ucb-be", be_hits)):
                    for r in range(10):
                        arm = "eagle_math" if r < hits + (i % 2) else "eagle_chat"
                        f.write(
                            json.dumps(
                                {
                                    "query_id": f"math-{i}",
                                    "task": "math",
                                    "method": method,
                                    "round": r,
                                    "arm": arm,
                                }
                            )
                            + "\n"
                        )

    rounds(8, 4)
    v = metasd_convergence(tmp_path, [], CPU).verdicts[0]
    assert v.held is True and v.n == 16 and v.effect == pytest.approx(0.4)
    rounds(4, 8)
    assert metasd_convergence(tmp_path, [], CPU).verdicts[0].held is False

    stream = tmp_path / "metasd" / "stream"
    stream.mkdir(parents=True)
    pd.DataFrame(
        [
            {"task": t, "method": m, "speedup": 1.0, "mat": 1.5}
            for t in ("math", "all")
            for m in ("ucb-bd", "ducb-bd", "swucb-bd")
        ]
    ).to_csv(stream / "summary.csv", index=False)
    write_examples(stream, {"math": {"ucb-bd": 1.0, "ducb-bd": 1.2, "swucb-bd": 0.9}})
    v = metasd_stream(tmp_path, [], CPU).verdicts[0]
    assert v.held is True and "Bonferroni" in v.detail and "D-UCB" in v.line()
    write_examples(stream, {"math": {"ucb-bd": 1.0, "ducb-bd": 0.8, "swucb-bd": 0.9}})
    assert metasd_stream(tmp_path, [], CPU).verdicts[0].held is False


def _rounds(path, per_method, n=16, rounds=10, **fields):
    """rounds.jsonl: for each method, ``per_method[method](i, r)`` -> the arm of round ``r`` of query ``i``
    (plus ``fields[name](method, i, r)``)."""
    with (path / "rounds.jsonl").open("w") as f:
        for i in range(n):
            for method, arm_of in per_method.items():
                for r in range(rounds):
                    rec = {
                        "query_id": f"math-{i}",
                        "task": "math",
                        "method": method,
                        "round": r,
                        "arm": arm_of(i, r),
                    }
                    rec.update({k: fn(method, i, r) for k, fn in fields.items()})
                    f.write(json.dumps(rec) + "\n")


def test_bandits_and_full_information_are_judged_per_query(tmp_path):
    from specbench.reproduction.metasd_rounds import metasd_bandits, metasd_full_info

    run = tmp_path / "metasd" / "eval"
    speedups = {
        "fixed:eagle_math": 1.5,
        "fixed:eagle_chat": 1.0,
        "ucb-bd": 1.4,
        "exp3-bd": 1.1,
        "halving-bd": 1.2,
        "random": 1.15,
        "ucb-bd-fi": 1.3,
    }
    write_examples(run, {"math": speedups})
    pd.DataFrame(
        [
            {"task": t, "method": m, "speedup": v, "mat": 1.5}
            for t in ("math", "all")
            for m, v in speedups.items()
        ]
    ).to_csv(run / "summary.csv", index=False)
    best = lambda hits: lambda i, r: "eagle_math" if r < hits + i % 2 else "eagle_chat"  # noqa: E731
    _rounds(
        run,
        {
            "ucb-bd": best(6),
            "exp3-bd": best(2),
            "halving-bd": best(3),
            "random": best(4),
            "ucb-bd-fi": best(9),
        },
    )
    faster, sooner, uniform = metasd_bandits(tmp_path, [], CPU).verdicts
    assert faster.held is True and "Bonferroni" in faster.detail and "EXP3" in faster.detail
    assert sooner.held is True and uniform.held is True
    reaches, speed = metasd_full_info(tmp_path, [], CPU).verdicts
    assert reaches.held is True  # 9 of 10 first rounds on the best arm against 6
    assert speed.held is False and "full information" in speed.line()  # its replays cost more than they win
    # EXP3 now converges sooner than UCB: the convergence claim flips
    _rounds(
        run,
        {
            "ucb-bd": best(2),
            "exp3-bd": best(6),
            "halving-bd": best(3),
            "random": best(4),
            "ucb-bd-fi": best(1),
        },
    )
    assert metasd_bandits(tmp_path, [], CPU).verdicts[1].held is False
    assert metasd_full_info(tmp_path, [], CPU).verdicts[0].held is False


def test_reward_variance_is_compared_on_the_same_rounds(tmp_path):
    from specbench.reproduction.metasd_rounds import metasd_variance

    run = tmp_path / "metasd" / "eval"
    run.mkdir(parents=True)
    noisy = lambda method, i, r: float(r % 2)  # noqa: E731  BE jumps between 0 and 1 from round to round
    smooth = lambda method, i, r: 0.5 + 0.01 * (r % 3) + 0.001 * i  # noqa: E731
    drafters = {"fixed:eagle_math": lambda i, r: "eagle_math", "fixed:eagle_chat": lambda i, r: "eagle_chat"}
    _rounds(run, drafters, drafted=lambda m, i, r: 4, be=noisy, bd=smooth)
    v = metasd_variance(tmp_path, [], CPU).verdicts[0]
    assert v.held is True and v.n == 16 and v.effect > 0.2
    _rounds(run, drafters, drafted=lambda m, i, r: 4, be=smooth, bd=noisy)
    assert metasd_variance(tmp_path, [], CPU).verdicts[0].held is False
    # rounds that did not draft (autoregressive, an empty prompt-lookup draft) carry no reward to compare
    _rounds(run, drafters, drafted=lambda m, i, r: 0, be=noisy, bd=smooth)
    assert metasd_variance(tmp_path, [], CPU).verdicts[0].held is None


def test_table4_judges_the_live_policy_against_the_best_drafter_and_autoregressive(tmp_path):
    from specbench.reproduction.huang import huang_table4

    run = tmp_path / "huang" / "math" / "eval"

    def table4(speedups):
        write_examples(run, {"math": speedups})
        pd.DataFrame(
            [
                {"task": t, "method": m, "speedup": v}
                for t in ("math", "all")
                for m, v in {"autoregressive": 1.0, **speedups}.items()
            ]
        ).to_csv(run / "summary.csv", index=False)
        return huang_table4(tmp_path, [], CPU)

    # issue 67: the premise (drafting alone slows math) is no verdict of the exhibit: it is measured on the
    # collection's rows (premises.py); the comparator is the best of the drafters the policy was trained on
    policy = tmp_path / "huang" / "math" / "policy"
    policy.mkdir(parents=True)
    (policy / "metrics.json").write_text(json.dumps({"arms": ["autoregressive", "eagle_math", "quantized"]}))
    ex = table4({"fixed:eagle_math": 0.9, "fixed:quantized": 0.7, "fixed:eagle_code": 1.2, "policy": 0.99})
    faster, holds = ex.verdicts
    assert faster.key == "huang/table4#vs-drafting" and holds.key == "huang/table4#holds"
    assert (
        faster.held is True and "eagle_math" in faster.line()
    )  # against the best drafter alone of its pool, not the int8 one, nor a drafter it was not given
    assert faster.effect == pytest.approx(0.99 / 0.9, rel=0.02)
    assert "0.95x of autoregressive" in holds.claim and holds.n == 16
    assert holds.held is True and holds.effect == pytest.approx(
        0.99, abs=0.02
    )  # 0.99 of autoregressive: at least 0.95
    assert "replayed" in ex.table.columns  # train-policy's replayed figures stay beside, labelled

    # the best drafter now beats autoregressive decoding, and a policy at 0.9x fails both parts
    faster, holds = table4({"fixed:eagle_math": 1.1, "fixed:quantized": 0.7, "policy": 0.9}).verdicts
    assert faster.held is False and holds.held is False


def test_the_per_query_oracle_takes_the_fastest_arm_of_each_query():
    rows = []
    for q in range(20):  # arm a is faster on even queries, b on odd ones; the policy plays a throughout
        a, b = (1.0, 1.5) if q % 2 == 0 else (1.5, 1.0)
        rows += [
            {"query_id": f"q{q}", "task": "t", "method": m, "seconds": s, "new_tokens": 10.0, "process": "p"}
            for m, s in (("fixed:a", a), ("fixed:b", b), ("policy", a))
        ]
    ex = pd.DataFrame(rows)
    with_o = C.with_oracle(ex, ["fixed:a", "fixed:b"])
    oracle = with_o[with_o.method == C.ORACLE].set_index("query_id").seconds
    assert len(oracle) == 20 and (oracle == 1.0).all()
    assert len(with_o) == len(ex) + 20 and (with_o[with_o.method != C.ORACLE] == ex).all().all()
    held = C.faster_on(
        with_o, "the policy holds 0.95 of the oracle", "policy", C.ORACLE, threshold=0.95, at_least=True
    )
    assert held.held is False and held.effect == pytest.approx(
        20 / 25
    )  # slower on half the queries: 1.5 s vs 1 s
    assert C.faster_on(with_o, "", "policy", C.ORACLE, threshold=0.6, at_least=True).held is True


def test_a_verdict_carries_the_p_value_of_its_interval():
    """p < 0.05 exactly when the 95% interval lies above the threshold (two-sided equivalent), on the same resamples."""
    for speedup, noise, seed in ((1.2, 0.05, 1), (1.05, 0.3, 3), (1.03, 0.05, 4), (0.9, 0.05, 5)):
        fast, base = timed(speedup, n=24, noise=noise, seed=seed)
        v = V.faster("a is faster than b", fast, base)
        assert 0 < v.p <= 1
        assert (v.held is True) == (v.p < 0.05), (speedup, v.p, v.interval)


def test_holm_flips_a_borderline_held_verdict_to_inconclusive():
    """One claim held at its own level (p about 0.03) among three tested claims: Holm's first threshold is
    0.05 / 3, so it is not rejected and reads inconclusive; a claim far from its null stays held."""
    strong, base = timed(1.3, n=24, noise=0.02, seed=1)
    clear = V.faster("clearly faster", strong, base)
    border = None
    for seed in range(200):  # a borderline effect: held alone, with p between 0.05 / 3 and 0.05
        cand = V.faster("barely faster", *timed(1.04, n=24, noise=0.08, seed=seed))
        if cand.held is True and 0.05 / 2 < cand.p < 0.05:
            border = cand
            break
    assert border is not None
    failed = V.faster("slower", *timed(0.8, n=24, noise=0.05, seed=2))
    assert clear.held is True and failed.held is False and clear.p < 0.05 / 3
    out = V.holm([border, clear, failed])
    assert out[1].held is True and "Holm over 3 tested claims" in out[1].detail
    assert out[0].held is None and out[0].mark == "inconclusive"
    assert "not after the family-wise correction" in out[0].line()
    assert out[2].held is False
    # alone (a family of one) the same borderline claim stays held
    assert V.holm([border])[0].held is True
    # untested verdicts (too few queries) are not part of the family and come back unchanged
    few = V.faster("few", *timed(1.3, n=4))
    assert V.holm([few, border])[0] == few and V.holm([few, border])[1].held is True


def test_again_runs_a_method_a_second_time_under_its_own_name():
    from specbench.errors import SpecbenchError
    from specbench.pipelines.methods import parse_methods

    pool = {"autoregressive": None, "prompt_lookup": None, "eagle_math": None}
    names = [
        m.name
        for m in parse_methods(["fixed:*", "again:autoregressive", "again:fixed:prompt_lookup"], pool, None)
    ]
    assert names == [
        "autoregressive",
        "fixed:prompt_lookup",
        "fixed:eagle_math",
        "again:autoregressive",
        "again:fixed:prompt_lookup",
    ]
    methods = {m.name: m for m in parse_methods(["again:fixed:prompt_lookup"], pool, None)}
    assert methods["again:fixed:prompt_lookup"].make_selector().select() == "prompt_lookup"
    for bad in ("again:", "again:again:autoregressive", "again:fixed:nope"):
        with pytest.raises(SpecbenchError):
            parse_methods([bad], pool, None)


@pytest.mark.slow  # 38 s
def test_aa_pairs_give_a_noise_floor_a_false_positive_rate_and_explain_small_held_effects(tmp_path):
    """Two runs of one method differ only by noise: the floor brackets 1, the machinery rarely calls either faster,
    and a held verdict whose effect lies inside the floor is counted as one an A/A difference could explain."""
    from specbench.reproduction.noise import aa_exhibit, explained

    run = tmp_path / "metasd" / "eval"
    write_examples(
        run,
        {
            "math": {"fixed:prompt_lookup": 1.5, "again:fixed:prompt_lookup": 1.5},
            "code": {"fixed:prompt_lookup": 1.5, "again:fixed:prompt_lookup": 1.5},
        },
        n=40,
        noise=0.05,
    )
    ex = aa_exhibit(tmp_path, [], CPU)
    t = ex.table
    assert (
        set(t.subset) == {16, 32, 48, 80} and (t.method == "prompt_lookup").all() and (t.queries == 80).all()
    )
    assert t[t.subset == 80].floor_lo.isna().all()  # subsets of all 80 queries would all be the same set
    t = t[t.subset < 80]
    assert (t.floor_lo < 1).all() and (t.floor_hi > 1).all()
    assert (t.false_positive_rate <= 0.15).all()
    assert ex.table.null_false_holds.between(0, 0.1).all()  # exact null draws at every size, 80 included
    assert (
        t[t.subset == 16].floor_hi.iloc[0] - t[t.subset == 16].floor_lo.iloc[0]
        > t[t.subset == 48].floor_hi.iloc[0] - t[t.subset == 48].floor_lo.iloc[0]
    )  # narrower with more queries
    small = V.faster("a bit faster", *timed(1.01, n=16, noise=0.0))
    big = V.faster("much faster", *timed(1.5, n=16, noise=0.0))
    assert small.held is True and big.held is True
    assert explained([small, big], t) == (1, 2)


def test_p_values_resolve_below_holms_threshold_over_100_claims():
    """A large true effect at n = 16 among 99 null claims: its p-value resolves below Holm's first threshold at
    m = 100 (0.05 / 100), where the interval's own 2,000 resamples floor every p-value at 0.001, so it stays held."""
    strong = V.faster("clearly faster", *timed(1.3, n=16, noise=0.05, seed=1))
    assert strong.p < 0.05 / 100
    assert CI.p_value(np.full(2000, 2.0), 1.0) == 0.001  # the floor the resampling lifts
    nulls = [V.faster(f"null {i}", *timed(1.0, n=16, noise=0.05, seed=100 + i)) for i in range(99)]
    out = V.holm([strong, *nulls])
    assert out[0].held is True and "Holm over 100 tested claims" in out[0].detail
    assert sum(v.held is True for v in out[1:]) <= 2


def test_adaptive_p_agrees_with_many_resamples():
    """Where few of the interval's resamples fall on the null's side, the resampled p-value is within a factor 2 of
    the one of 200,000 resamples drawn at once (its Monte Carlo error with 20 resamples in the tail is about 25%);
    where many do, it is the interval's own (for a resampled interval: the t interval's p has no resamples)."""
    stat = CI.speed_ratio()
    for speedup, noise, seed in ((1.06, 0.06, 7), (1.1, 0.1, 3), (1.02, 0.1, 5)):
        (ms, mt), (bs, bt) = timed(speedup, n=16, noise=noise, seed=seed)
        cols = {"a_s": ms, "a_t": mt, "b_s": bs, "b_t": bt}
        _, vals = CI.resample(cols, stat)
        p = CI.adaptive_p(cols, stat, 1.0, vals, CI.Bootstrap(interval="expanded"))
        _, many = CI.resample(cols, stat, 200_000, seed=99)
        share = np.mean(many <= 1.0)
        truth = CI.tail_p(share, "expanded", 16)
        if np.sum(vals <= 1.0) >= CI.TAIL:
            assert p == CI.tail_p(np.mean(vals <= 1.0), "expanded", 16)
        elif share > 0:
            assert truth / 2 <= p <= 2 * truth, (p, truth)
        else:  # none of 200,000 below: at most one resample's worth, from the normal tail
            assert p <= CI.tail_p(1 / 200_000, "expanded", 16), p


def test_tree_pairs_match_a_tree_drafter_to_its_chain_by_config():
    from specbench.reproduction.multi_drafter import tree_pairs

    head = {"_target_": "specbench.drafters.eagle.build", "checkpoint": "package:eagle_math", "tree": None}
    drafters = {
        "chain": head,
        "tree": {**head, "tree": {"width": 3, "nodes": 8}, "draft_length": 2},
        "other": {**head, "checkpoint": "package:eagle_code", "tree": {"width": 3, "nodes": 8}},
        "lookup": {"_target_": "specbench.drafters.prompt_lookup.build"},
    }
    assert tree_pairs(drafters) == [("tree", "chain")]


def test_a_claim_with_parts_is_judged_once(tmp_path):
    """Issue 43: "BE rewards vary more than BD" was one verdict per drafter (seven verdicts of one claim); it is one
    verdict by intersection-union over the drafters: held only when every drafter's part holds."""
    from specbench.reproduction.replay_verdicts import variance_table

    rng = np.random.default_rng(0)
    rows = []
    for drafter, be_spread in (("a", 0.4), ("b", 0.4), ("c", 0.0)):
        for q in range(20):
            for _r in range(12):
                rows.append(
                    {
                        "method": f"fixed:{drafter}",
                        "query_id": f"q{q}",
                        "n_max": 4,
                        "bd": float(0.5 + 0.02 * rng.standard_normal()),
                        "be": float(0.5 + be_spread * rng.standard_normal()),
                    }
                )
    (tmp_path / "rounds.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    table, verdicts = variance_table(tmp_path)
    # one variance claim over the drafters, and (issue 67) the two rewards' discrimination beside it
    assert len(table) == 3 and [v.key for v in verdicts] == [
        "metasd/long_horizon#variance",
        "metasd/long_horizon#discrimination",
    ]
    assert "for every single drafter" in verdicts[0].claim and verdicts[0].held is False  # drafter c fails
    table, verdicts = variance_table(tmp_path, among=["a", "b"])  # c a reference row no selector plays
    assert len(table) == 3 and verdicts[0].held is True and verdicts[0].claim.endswith("the selectors play")
    kept = [r for r in rows if r["method"] != "fixed:c"]
    (tmp_path / "rounds.jsonl").write_text("".join(json.dumps(r) + "\n" for r in kept))
    assert variance_table(tmp_path)[1][0].held is True


def test_bd_discrimination_is_the_best_against_the_second_drafter_gap_over_its_spread():
    """Issue 67: per query, each reward's best-vs-second gap over the pooled spread of those two drafters' rounds;
    BD's gap above BE's when BD separates the drafters cleanly and BE's rounds are noisy."""
    from specbench.reproduction.replay_verdicts import discrimination

    rng = np.random.default_rng(1)
    rows = []
    for q in range(24):
        for d, mean in (("a", 0.6), ("b", 0.4), ("c", 0.3)):
            for _ in range(15):
                rows.append(
                    {
                        "method": f"fixed:{d}",
                        "query_id": f"q{q}",
                        "bd": mean + 0.03 * rng.standard_normal(),
                        "be": mean + 0.4 * rng.standard_normal(),
                    }
                )
    v = discrimination(pd.DataFrame(rows))
    assert v.held is True and v.n == 24 and v.effect > 3
    swapped = pd.DataFrame(rows).rename(columns={"bd": "be", "be": "bd"})
    assert discrimination(swapped).held is False


# ---------------------------------------------------------------- interval methods (issue 42: calibrated at small n)
def test_student_t_quantiles_match_tables():
    """t_{0.975} on 15 and 79 degrees of freedom (2.1314, 1.9905 in printed tables) and the symmetry of the cdf."""
    assert CI.t_quantile(0.975, 15) == pytest.approx(2.1314, abs=1e-4)
    assert CI.t_quantile(0.975, 79) == pytest.approx(1.9905, abs=1e-4)
    assert CI.t_cdf(-1.3, 7) == pytest.approx(1 - CI.t_cdf(1.3, 7), abs=1e-12)
    assert CI.expanded_level(0.95, 16) == pytest.approx(0.9723, abs=1e-3)  # 97.2% at n = 16
    assert CI.expanded_level(0.95, 16) > CI.expanded_level(0.95, 80) > 0.95


@pytest.mark.parametrize("how", CI.INTERVALS)
def test_each_intervals_p_value_crosses_its_level_where_its_bound_crosses_the_threshold(how):
    """For every interval method the claim's p-value is below 1 - LEVEL exactly when the interval excludes the
    threshold on the claim's side: at the lower bound itself p is 0.05 (to the resamples' resolution)."""
    (ms, mt), (bs, bt) = timed(1.08, n=16, noise=0.1, seed=4)
    cols = {"a_s": ms, "a_t": mt, "b_s": bs, "b_t": bt}
    boot = CI.Bootstrap(interval=how)
    _, lo, hi, _ = CI.estimate(cols, CI.speed_ratio(), 1.0, boot)
    for x in np.linspace(lo - 0.05, hi, 15):
        p = CI.estimate(cols, CI.speed_ratio(), float(x), boot)[3]
        assert (p < 1 - CI.LEVEL) == (lo > x) or abs(x - lo) < 2e-3, (how, x, lo, p)
    assert CI.estimate(cols, CI.speed_ratio(), lo, boot)[3] == pytest.approx(0.05, abs=0.01)


def test_the_expanded_interval_is_wider_at_small_n_and_bca_follows_skew():
    """The expanded interval contains the percentile one (wider by about 10% at n = 16, 1% at n = 80); on a
    right-skewed sample BCa shifts both bounds up from the percentile interval (its bias correction and
    acceleration), as Efron's construction does for a lognormal mean."""
    for n, widest in ((16, 1.25), (80, 1.05)):
        (ms, mt), (bs, bt) = timed(1.05, n=n, noise=0.1, seed=2)
        cols = {"a_s": ms, "a_t": mt, "b_s": bs, "b_t": bt}
        _, plo, phi = CI.bootstrap(cols, CI.speed_ratio(), CI.Bootstrap(interval="percentile"))
        _, elo, ehi = CI.bootstrap(cols, CI.speed_ratio(), CI.Bootstrap(interval="expanded"))
        assert elo < plo and ehi > phi and 1.0 < (ehi - elo) / (phi - plo) < widest
    x = np.random.default_rng(0).lognormal(0, 1, 30)
    _, plo, phi = CI.bootstrap({"x": x}, CI.mean_of("x"), CI.Bootstrap(interval="percentile"))
    _, blo, bhi = CI.bootstrap({"x": x}, CI.mean_of("x"), CI.Bootstrap(interval="bca"))
    assert blo > plo and bhi > phi
    with pytest.raises(ValueError, match="unknown interval method 'studentised'"):
        CI.Bootstrap(interval="studentised")


def test_the_jackknife_t_interval_of_a_mean_is_the_textbook_t_interval():
    """For a mean the jackknife's standard error is s / sqrt(n) exactly, so the jackknife t interval is the textbook
    mean +- t_{0.975, n-1} s / sqrt(n); its p-value has no resampling floor (a large effect resolves far below
    Holm's thresholds), and a statistic undefined on a leave-one-out subset gives no interval."""
    x = np.random.default_rng(3).normal(1.0, 0.2, 16)
    point, lo, hi = CI.bootstrap({"x": x}, CI.mean_of("x"), CI.Bootstrap(interval="t"))
    half = CI.t_quantile(0.975, 15) * x.std(ddof=1) / math.sqrt(16)
    assert point == pytest.approx(x.mean()) and (lo, hi) == pytest.approx((x.mean() - half, x.mean() + half))
    fast, base = timed(1.5, n=16, noise=0.02)
    v = V.faster("a is faster", fast, base, ("a", "b"), boot=CI.Bootstrap(interval="t"))
    assert v.held is True and v.p < 1e-6
    one = CI.bootstrap(
        {"a": [1.0, 0.0], "b": [1.0, 0.0]}, CI.ratio_of_sums("a", "b"), CI.Bootstrap(interval="t")
    )
    assert math.isnan(one[1]) and math.isnan(one[2])


def aa_pair(n: int, seed: int, spread: float = 0.6, noise: float = 0.03):
    """One method run twice: heavy-tailed query lengths and costs (lognormal), each run's seconds scattered by
    ``noise``: an A/A pair whose true ratio is 1."""
    rng = np.random.default_rng(seed)
    tokens = np.maximum(8, rng.lognormal(3.5, spread, n)).round()
    cost = tokens * 0.03 * rng.lognormal(0, spread, n)
    a = cost * (1 + noise * rng.standard_normal(n))
    b = cost * (1 + noise * rng.standard_normal(n))
    return {"a_s": a, "a_t": tokens, "b_s": b, "b_t": tokens}


def test_exact_null_draws_measure_each_intervals_false_holds():
    """On symmetrised A/A draws the true ratio is 1, so every held verdict is false: the percentile interval's rate
    at n = 16 exceeds the expanded interval's (the narrowness the expansion undoes), each side is equally likely
    (the coin makes the null symmetric), and the pooled table chooses a method within the nominal 2.5% (or says
    none is)."""
    from specbench.reproduction.aa_calibration import choose, false_hold_rows, null_draw, pooled

    pairs = [("m", "one process", aa_pair(120, s)) for s in range(3)]
    rows = pd.DataFrame(false_hold_rows(pairs, sizes=(16, 80), draws=300, resamples=400))
    assert set(rows.interval) == set(CI.INTERVALS) and set(rows.n) == {16, 80}
    rate = rows.groupby(["interval", "n"]).false_holds.mean()
    assert rate["percentile", 16] > rate["expanded", 16]
    assert rate["expanded", 16] < 0.05  # nominal 2.5%: a broken expansion (the level not raised) fails this
    table = pooled(rows)
    assert (table.trials == 2 * 3 * 300).all()
    assert choose(table) in (*CI.INTERVALS, None)
    ok = table[table.within_nominal]
    if len(ok):
        assert choose(table) in set(ok.interval)
    # the coin: over many draws each run is the "a" side half the time
    rng = np.random.default_rng(0)
    cols = aa_pair(40, 9)
    firsts = [null_draw(cols, 40, rng)["a_s"] for _ in range(200)]
    share = np.mean([np.isin(f, cols["a_s"]).mean() for f in firsts])
    assert 0.45 < share < 0.55


def test_the_calibration_page_pairs_two_processes_and_refuses_a_run_without_pairs(tmp_path, capsys):
    from specbench.errors import SpecbenchError
    from specbench.reproduction import aa_calibration

    one, two = tmp_path / "one", tmp_path / "two"
    write_examples(one, {"math": {"fixed:pl": 1.5, "again:fixed:pl": 1.5}}, n=40, noise=0.05)
    write_examples(two, {"math": {"fixed:pl": 1.5}}, n=40, noise=0.05)
    ex1, ex2 = R.load_examples(tmp_path, "one"), R.load_examples(tmp_path, "two")
    kinds = [(m, k) for m, k, _ in aa_calibration.aa_pairs([ex1, ex2])]
    assert kinds == [("pl", "one process"), ("autoregressive", "two processes"), ("pl", "two processes")]
    aa_calibration.main([str(one), str(two), "--draws", "20", "--resamples", "200"])
    page = (one / "calibration.md").read_text()
    assert "### Pooled over the pairs" in page and "two processes" in page and "intervals.INTERVAL = " in page
    assert page in capsys.readouterr().out
    lone = tmp_path / "lone"
    write_examples(lone, {"math": {"fixed:pl": 1.5}}, n=20)
    with pytest.raises(SpecbenchError, match="holds no A/A pair"):
        aa_calibration.calibration_page([lone])
    with pytest.raises(SpecbenchError, match="no per-query records"):
        aa_calibration.calibration_page([tmp_path / "absent"])


def test_the_per_query_oracle_is_cross_fitted_on_an_aa_repeat(tmp_path):
    """With an A/A repeat of every arm the oracle chooses on the first runs and reports the repeat's seconds, so it
    no longer gains from the noise it chose on: on arms equal but for noise its hindsight speedup over an arm is
    above 1, its cross-fitted one about 1."""
    write_examples(
        tmp_path / "run",
        {
            "math": {
                "fixed:a": 1.5,
                "fixed:b": 1.5,
                "again:fixed:a": 1.5,
                "again:fixed:b": 1.5,
            }
        },
        n=200,
        noise=0.1,
    )
    ex = R.load_examples(tmp_path, "run")
    arms = ["fixed:a", "fixed:b"]
    assert C.cross_fitted(ex, arms) and not C.cross_fitted(ex[~ex.method.str.startswith("again:")], arms)

    def speed(frame):
        o = C.with_oracle(frame, arms)
        o = o[o.method == C.ORACLE]
        a = frame[frame.method == "fixed:a"]
        return (a.seconds.sum() / a.new_tokens.sum()) / (o.seconds.sum() / o.new_tokens.sum())

    hindsight = speed(ex[~ex.method.str.startswith("again:")])
    crossed = speed(ex)
    assert hindsight > 1.04 and abs(crossed - 1) < 0.02, (hindsight, crossed)


@pytest.mark.slow  # 43 s
def test_the_report_states_the_aa_false_hold_rate_beside_each_verdict_family(tmp_path):
    """Issue 42: each section of the report's index says how often its interval falsely holds on the report's own A/A
    pairs at the n its verdicts rest on (exact null draws of the pair's queries)."""
    from specbench.reproduction import render
    from specbench.reproduction.runs import METASD_EVAL
    from tests.unit.test_reproduction import _huang_fixture

    root = tmp_path / "reproduce"
    _huang_fixture(root)
    write_examples(
        root / METASD_EVAL.dir,
        {t: {"fixed:prompt_lookup": 1.5, "again:fixed:prompt_lookup": 1.5} for t in ("math", "code")},
        n=40,
        noise=0.05,
    )
    index = (render.write(root) / "REPORT.md").read_text()
    line = next(x for x in index.splitlines() if x.startswith("A/A false holds of the"))
    assert f"`{CI.INTERVAL}` interval" in line and "at n=16" in line and "(nominal 2.5%)" in line
    rate = float(re.search(r"(\d+\.\d)% at n=16", line).group(1))
    assert 0 <= rate <= 10
    assert CI.INTERVAL_NAMES[CI.INTERVAL] in index  # the counts line names the interval


def test_a_replayed_speed_verdict_inside_the_clocks_error_is_inconclusive():
    """Issue 42: a replayed effect of 1.02 held on its interval is inconclusive under a clock whose replay / live
    factors differ by 5% between methods; 1.10 stays held; a verdict without an effect passes unchanged."""
    from specbench.reproduction.replay_calibration import clock_error

    cal = pd.DataFrame({"method": ["a", "b", "c"], "replay / live": [0.90, 0.945, 0.93]})
    error = clock_error(cal)
    assert error == pytest.approx(0.05)
    near = V.faster("[replayed] a is faster", *timed(1.02, n=80, noise=0.0))
    far = V.faster("[replayed] a is faster", *timed(1.10, n=80, noise=0.0))
    assert near.held is True and far.held is True
    moved = V.inside_error(near, error, "the replay clock's measured error")
    assert (
        moved.mark == "inconclusive"
        and "inside the replay clock's measured error (+-5.0% around 1)" in moved.line()
    )
    assert V.inside_error(far, error, "x") is far
    assert V.inside_error(V.missing("c", "d"), error, "x").mark == "not judged"
    assert math.isnan(clock_error(cal.iloc[:1]))


def test_the_clocks_error_comes_from_the_rounds_before_the_first_fork():
    """Issue 42: the calibration compares the replay with the live run on the rounds whose tokens all lie before the
    generation's first fork (the same text on both sides); the clock's error is the spread of those factors, not
    of whole generations, whose forked texts differ."""
    from specbench.records import Round
    from specbench.reproduction.replay_calibration import PREFIX, before_fork, clock_error, round_seconds

    live = [
        {"emitted": e, "t_select": 0.001, "t_draft": 0.002, "t_verify": 0.03, "t_switch": 0.0}
        for e in (3, 2, 4, 1)
    ]
    assert [r["emitted"] for r in before_fork(live, 5)] == [3, 2]  # 3 + 2 tokens end at position 5
    assert [r["emitted"] for r in before_fork(live, 4)] == [3]
    assert before_fork(live, None) == live
    assert round_seconds(before_fork(live, 5)) == (pytest.approx(0.066), 5)
    rnd = Round(0, "a", 4, 2, 4, 0.5, 0.5, 3, 0.0, 0.004, 0.031, 0.002, False)
    assert round_seconds([rnd]) == (pytest.approx(0.037), 3)
    cal = pd.DataFrame({"method": ["a", "b"], "replay / live": [0.9, 1.4], PREFIX: [0.98, 1.01]})
    assert clock_error(cal) == pytest.approx(1.01 / 0.98 - 1)
    assert clock_error(cal.drop(columns=[PREFIX])) == pytest.approx(1.4 / 0.9 - 1)
    assert clock_error(cal.assign(**{PREFIX: [0.98, math.nan]})) == pytest.approx(
        1.4 / 0.9 - 1
    )  # one: no spread


def test_the_clock_alone_is_read_on_the_rounds_that_equal_the_replays():
    """Before the fork a selector may still part from its replay (bf16 rewards round differently, another arm is
    chosen): the rounds from there differ, so the clock alone is read on the leading rounds with the same arm,
    drafted and accepted tokens."""
    from specbench.records import Round
    from specbench.reproduction.replay_calibration import same_rounds

    live = [{"arm": a, "drafted": 4, "accepted": k} for a, k in (("x", 2), ("y", 0), ("x", 4))]

    def replayed(*rounds):
        return [
            Round(i, a, 4, k, 4, 0.5, 0.5, k + 1, 0.0, 0.0, 0.03, 0.0, False)
            for i, (a, k) in enumerate(rounds)
        ]

    assert same_rounds(live, replayed(("x", 2), ("y", 0), ("x", 4))) == 3
    assert same_rounds(live, replayed(("x", 2), ("x", 3), ("x", 4))) == 1  # parted at the second round
    assert same_rounds(live, replayed(("x", 1))) == 0
    assert same_rounds(live, []) == 0


def test_a_cascade_is_at_the_targets_quality_by_a_paired_non_inferiority_test(tmp_path):
    """Issue 43: on seeded synthetic per-query ROUGE-2, a cascade point whose quality equals the target's up to noise
    of SD's size passes (its paired interval lies above minus lossless SD's scatter); one that loses 3 points a query
    fails although its mean stays within a point estimate's reach of a noisy target; the old rule (mean at least the
    target's) would have rejected lossless SD itself when its mean came out a little lower."""
    from specbench.reproduction import cascade_exhibits as CE

    rng = np.random.default_rng(5)
    n = 64
    target = rng.uniform(5, 25, n)
    scores = {
        "sd": target + rng.normal(-0.3, 1.0, n),  # lossless: its own scatter, mean a little below by chance
        "diff@0.1": target + rng.normal(0.0, 1.0, n),
        "opt@0.6": target - 3 + rng.normal(0.0, 1.0, n),
    }
    extra = {
        m: (
            lambda i, m=m: {"quality": {"rouge2": float((target if m == "autoregressive" else scores[m])[i])}}
        )
        for m in ["autoregressive", *scores]
    }
    write_examples(
        tmp_path / "run",
        {"summarization": {m: 1.2 for m in scores}},
        n=n,
        noise=0.05,
        extra=extra,
    )
    ex = R.load_examples(tmp_path, "run")
    ex = ex.assign(_q=CE.task_quality(ex, "rouge2"))
    margin = CE.quality_margin(ex, "rouge2")
    assert (
        margin == 1.0
    )  # issue 67: a point of the metric, fixed beforehand (it was lossless SD's own scatter)
    assert CE.quality_margin(ex, "accuracy") == 0.01
    passed = {m for _, m in CE.at_target_quality(ex, list(scores), margin)}
    assert passed == {"sd", "diff@0.1"}
    assert (
        ex[ex.method == "sd"]._q.mean() < ex[ex.method == "autoregressive"]._q.mean()
    )  # the old rule's failure
    table = CE.quality_intervals(ex, {"summarization": "rouge2"}).set_index(
        "method"
    )  # the page's per-point table
    assert table.shows.to_dict() == {
        "sd": "at the target's quality",
        "diff@0.1": "at the target's quality",
        "opt@0.6": "below",
    }
    assert table.at["opt@0.6", "ci_high"] < -margin and (table.margin == margin).all()
    assert "Each point's quality against the target's" in CE.quality_note(table.reset_index())


def test_a_cascade_claim_without_a_point_at_the_targets_quality_is_not_held_only_when_every_point_is_below(
    tmp_path,
):
    """Issue 43: when no speculative point is shown non-inferior, the claim is not held only if every point is shown
    inferior (its interval wholly below minus the margin); a point whose interval straddles the margin leaves the
    claim inconclusive (16 queries cannot tell), not "not held" without an estimate."""
    from specbench.reproduction import cascade_exhibits as CE

    def run(name: str, spec_shift: float, spec_noise: float):
        rng = np.random.default_rng(7)
        n = 16
        target = rng.uniform(5, 25, n)
        scores = {
            "sd": target + rng.normal(0.0, 0.3, n),
            "diff@0.3": target + spec_shift + rng.normal(0.0, spec_noise, n),
        }
        extra = {
            m: (
                lambda i, m=m: {
                    "quality": {"rouge2": float((target if m == "autoregressive" else scores[m])[i])}
                }
            )
            for m in ["autoregressive", *scores]
        }
        write_examples(
            tmp_path / name, {"summarization": {m: 1.2 for m in scores}}, n=n, noise=0.05, extra=extra
        )
        ex = R.load_examples(tmp_path, name)
        return CE.task_verdict(ex, "summarization", list(dict.fromkeys(ex.method)), "rouge2")

    below = run("below", -6.0, 0.5)
    assert below.mark == "not held" and "every speculative-cascade point (1) is below" in below.detail
    noisy = run("noisy", -1.0, 6.0)
    assert noisy.mark == "inconclusive" and "cannot tell" in noisy.detail


def test_the_cascades_page_measures_which_metric_separates_the_target_from_its_drafter(tmp_path):
    """Issue 43: a metric at its floor cannot tell the target from the drafter alone. On seeded synthetic scores,
    ROUGE-L lies 4 points a query above the drafter's (held apart: its interval excludes 0), ROUGE-2 is equal up to
    noise (its interval straddles 0); the table says so per metric."""
    from specbench.reproduction import cascade_exhibits as CE

    rng = np.random.default_rng(11)
    n = 64
    base = rng.uniform(10, 30, n)
    scores = {
        "autoregressive": {"rougeL": base + 4, "rouge2": base / 10},
        "drafter_alone": {"rougeL": base + rng.normal(0, 1, n), "rouge2": base / 10 + rng.normal(0, 0.5, n)},
        "sd": {"rougeL": base + 4, "rouge2": base / 10},
    }
    extra = {m: (lambda i, m=m: {"quality": {k: float(v[i]) for k, v in scores[m].items()}}) for m in scores}
    write_examples(tmp_path / "run", {"summarization": {"drafter_alone": 3.0, "sd": 1.2}}, n=n, extra=extra)
    table = CE.metric_separation(R.load_examples(tmp_path, "run")).set_index("metric")
    assert list(table.n) == [n, n]
    assert table.at["rougeL", "ci_low"] > 3.0 and table.at["rougeL", "difference / sd"] > 2
    assert table.at["rouge2", "ci_low"] < 0 < table.at["rouge2", "ci_high"]
    assert "Which metric separates" in CE.separation_note(table.reset_index())


def test_holm_corrects_the_seeds_claims_apart_from_the_projects_own():
    """Issue 43: full information and the switching penalty are this project's claims, not the seeds': they form a
    Holm family of their own, so a seed claim's threshold counts only the seeds' tested claims."""
    from specbench.reproduction import render
    from specbench.reproduction.exhibit import PROJECT, SEED, Exhibit
    from specbench.reproduction.metasd import SWITCHING
    from specbench.reproduction.metasd_rounds import FULL_INFO

    assert FULL_INFO.family == PROJECT and SWITCHING.family == PROJECT
    seed = [V.faster(f"seed {i}", *timed(1.3, n=16, noise=0.05, seed=i)) for i in range(3)]
    own = [V.faster(f"own {i}", *timed(1.0, n=16, noise=0.05, seed=10 + i)) for i in range(5)]
    exhibits = render.correct(
        [
            Exhibit("s", pd.DataFrame(), seed, key="metasd/main", family=SEED),
            Exhibit("o", pd.DataFrame(), own, key="metasd/full_info", family=PROJECT),
        ]
    )
    # issue 56: the correction runs over statements (here each claim is a statement of its own), per family
    stated = {ex.key: ex for ex in exhibits}
    assert all("Holm over 3 tested claims" in v.detail for v in stated["statements/seeds"].verdicts)
    assert all("Holm over 5 tested claims" in v.detail for v in stated["statements/project"].verdicts if v.p)
    line = render.counts_line(exhibits)
    assert "the seeds' 3 tested claims" in line and "own 5 tested claims" in line


def test_the_summary_says_what_reproduces_per_paper_from_the_seeds_verdicts_only():
    """Issue 43: the README's summary says in one sentence how many of the seeds' claims hold, per paper, counted
    from the verdicts (the project's own claims are not counted as reproduced)."""
    from specbench.reproduction import render
    from specbench.reproduction.exhibit import PROJECT, SEED, Exhibit

    held = V.faster("held", *timed(1.3, n=16, noise=0.05, seed=1))
    not_held = V.faster("not held", *timed(0.7, n=16, noise=0.05, seed=2))
    exhibits = [
        Exhibit("h", pd.DataFrame(), [held, not_held], key="huang/table1", family=SEED),
        Exhibit("m", pd.DataFrame(), [not_held], key="metasd/main", family=SEED),
        Exhibit("o", pd.DataFrame(), [held, held], key="metasd/full_info", family=PROJECT),
    ]
    assert [v.mark for v in exhibits[0].verdicts] == ["held", "not held"]
    line = render.reproduced_line(exhibits)
    assert line.startswith("What reproduces here: 1 of the seeds' 3 claims holds on these runs")
    assert (
        "(Huang et al. 1 of 2, MetaSD 0 of 1)" in line and "the others are 2 not held at this scale" in line
    )
    summary = render.summary_markdown(exhibits, [])
    assert summary.splitlines()[0] == line and "verdicts:" in summary.splitlines()[2]
    assert render.reproduced_line([exhibits[2]]) == ""  # no seed claim: no sentence


def test_policy_rows_show_which_arm_each_query_played(tmp_path):
    """Issue 43: every policy row of Huang et al.'s tables says how many queries it played on each arm (the arm of
    most of a query's rounds, from rounds.jsonl), so a policy that is autoregressive in replay and slow live shows
    what it chose live."""
    from specbench.reproduction import huang
    from specbench.reproduction.inputs import arm_choices, choices_text
    from specbench.reproduction.runs import HUANG_EVAL
    from tests.unit.test_reproduction import _huang_fixture

    root = tmp_path / "reproduce"
    _huang_fixture(root)
    with (root / HUANG_EVAL.dir / "rounds.jsonl").open("w") as f:
        for i in range(16):
            for task, arm in (("translation", "eagle_translation"), ("summarization", "eagle_summarization")):
                arms = [arm, arm, "eagle_translation"] if i < 12 else ["autoregressive"] * 3
                for k, a in enumerate(arms):
                    f.write(
                        json.dumps(
                            {
                                "query_id": f"{task}-{i}",
                                "task": task,
                                "method": "policy",
                                "round": k,
                                "arm": a,
                            }
                        )
                        + "\n"
                    )
                f.write(
                    json.dumps({"query_id": f"{task}-{i}", "task": task, "method": "fixed:x", "arm": "x"})
                    + "\n"
                )
    chosen = arm_choices(root, HUANG_EVAL.dir)
    assert chosen["summarization"] == {"eagle_summarization": 12, "autoregressive": 4}
    assert choices_text(chosen["all"]) == "eagle_translation 12, eagle_summarization 12, autoregressive 8"
    assert arm_choices(root, "huang/absent") == {}
    table = huang.huang_table1(root, [], CPU).table
    col = "arms chosen (translation / summarization)"
    policy = table[table.drafter == "policy"][col].item()
    assert policy == "eagle_translation 12, autoregressive 4 / eagle_summarization 12, autoregressive 4"
    assert (table[table.drafter != "policy"][col] == "").all()


def test_the_seed_pool_section_names_its_measured_cause():
    """Issue 43: a seed claim that is not held says why on its page, from the numbers its table shows."""
    from specbench.reproduction.replay_verdicts import seed_pool_cause

    st = pd.DataFrame(
        {
            "method": ["fixed:a", "fixed:b", "ucb-bd", "ucb-bd-carry"],
            "speedup": [1.007, 0.843, 0.944, 0.994],
            "best share": [math.nan, math.nan, 0.237, 0.324],
            "switches / query": [0.0, 0.0, 140.2, 62.7],
            "rounds / query": [138.4, 169.0, 146.0, 139.6],
        }
    )
    text = seed_pool_cause(st)
    assert "the 2 heads run within 0.843-1.007x" in text
    assert "switches drafters on 140 of its 146 rounds" in text and "on 24% of them" in text
    assert "switches 63 times a query and runs at 0.994x" in text
    assert seed_pool_cause(st[st.method != "ucb-bd"]) == ""
