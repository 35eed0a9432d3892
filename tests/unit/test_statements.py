"""One verdict per seed statement (issue 56): the parts the exhibits judge are grouped into the statements the
papers make, each judged exactly once (intersection-union), each filed in the family of whoever makes it."""

from __future__ import annotations

import pandas as pd

from specbench.reproduction import statements as ST
from specbench.reproduction import verdicts as V
from specbench.reproduction.exhibit import PROJECT, SEED, Exhibit

# the seeds' statements, as the report judges them (one verdict each)
SEED_STATEMENTS = [
    "huang/specialists",
    "huang/policy-best",
    "huang/policy-ar",
    "huang/alpha",
    "huang/data",
    "huang/math-premise",
    "huang/ar-arm",
    "metasd/accelerates",
    "metasd/beats-best",
    "metasd/specialists",
    "metasd/ucb-vs-bandits",
    "metasd/ucb-vs-uniform",
    "metasd/bd-variance",
    "metasd/bd-convergence",
    "metasd/non-stationary",
    "metasd/explore-commit",
    "cascades/beats-baselines",
    "spec_bench/eagle",
]
PROJECT_STATEMENTS = [
    "project/full-info-sooner",
    "project/full-info-faster",
    "project/penalty-switches",
    "project/penalty-faster",
]


def _v(claim, held=True, p=0.001):
    return V.Verdict(
        claim, held, "", n=32, effect=1.1, interval=(1.05, 1.15), label="ratio", threshold=1.0, p=p
    )


def test_the_statements_are_listed_once_each_in_their_family():
    assert [s.key for s in ST.STATEMENTS if s.family == SEED] == SEED_STATEMENTS
    assert [s.key for s in ST.STATEMENTS if s.family == PROJECT] == PROJECT_STATEMENTS
    assert len({s.text for s in ST.STATEMENTS}) == len(ST.STATEMENTS)


def test_a_split_statement_is_one_verdict_over_all_its_parts():
    """UCB against EXP3 and sequential halving, judged live (speed, first rounds) and replayed against each: one
    statement, not held when one part is not; D-UCB/SW-UCB's seven parts, one statement."""
    live = Exhibit(
        "b",
        pd.DataFrame(),
        [
            _v("UCB-BD is faster than EXP3 and sequential halving"),
            _v("UCB-BD reaches the best arm sooner than EXP3 and sequential halving (first 20 rounds)"),
            _v("UCB-BD is faster than the static uniform mixture (a uniformly random drafter every round)"),
        ],
        key="metasd/bandits",
    )
    replayed = Exhibit(
        "r",
        pd.DataFrame(),
        [
            _v("[replayed] UCB-BD plays the best drafter more often than EXP3 in the first 100 rounds"),
            _v(
                "[replayed] UCB-BD plays the best drafter more often than sequential halving in the first 100 rounds",
                held=False,
                p=0.9,
            ),
            _v("[replayed] Discounted UCB is faster than UCB on a stream whose task changes at every query"),
            _v(
                "[replayed] Sliding-window UCB is faster than UCB on a stream whose task changes at every query"
            ),
            _v(
                "[replayed] Discounted UCB is faster than UCB on a stream whose best drafter changes between task "
                "segments"
            ),
            _v(
                "[replayed] Sliding-window UCB plays each query's best model drafter on more of its rounds than UCB on "
                "the changing stream"
            ),
            _v("[replayed] UCB with the measured switching penalty is faster than plain UCB-BD"),
        ],
        key="metasd/long_horizon",
    )
    stream = Exhibit(
        "s",
        pd.DataFrame(),
        [_v("D-UCB or SW-UCB is above UCB when the task changes under the selector")],
        key="metasd/stream",
    )
    own = Exhibit(
        "w",
        pd.DataFrame(),
        [
            _v("explore-then-commit is faster than UCB-BD when switches cost their catch-up", p=0.01),
            _v("the switching-cost variant is faster than UCB-BD when switches cost their catch-up"),
        ],
        key="metasd/switching",
        family=PROJECT,
    )
    seeds, project = ST.judge([live, replayed, stream, own])
    assert seeds.key == "statements/seeds" and project.key == "statements/project"
    assert list(seeds.table.statement) == [
        "metasd/ucb-vs-bandits",
        "metasd/ucb-vs-uniform",
        "metasd/non-stationary",
        "metasd/explore-commit",
    ]
    assert list(seeds.table.parts) == [4, 1, 5, 1]
    by = dict(zip(seeds.table.statement, seeds.verdicts, strict=True))
    assert by["metasd/ucb-vs-bandits"].held is False  # one part not held: the statement is not held
    assert by["metasd/non-stationary"].held is True and by["metasd/ucb-vs-uniform"].held is True
    # the live explore-then-commit claim is MetaSD's; the replayed switching penalty is this project's
    assert list(project.table.statement) == ["project/penalty-faster"] and list(project.table.parts) == [2]
    # Holm runs over the 4 seed statements, not over the 11 parts
    assert all("Holm over 4 tested claims" in v.detail for v in seeds.verdicts if v.p is not None)
    ST.annotate([live, replayed, stream, own, seeds, project])
    assert 'a part of the statement "UCB converges faster than EXP3 and sequential halving" (not held' in (
        live.verdicts[0].detail
    )


def test_a_part_no_statement_takes_is_a_statement_of_its_own():
    ex = Exhibit(
        "t",
        pd.DataFrame(),
        [_v("tree decoding is at least 1.15x the best single drafter")],
        key="metasd/trees",
    )
    (seeds,) = ST.judge([ex])
    assert list(seeds.table.statement) == [
        "metasd/trees: tree decoding is at least 1.15x the best single drafter"
    ]
    assert seeds.verdicts[0].held is True


def test_replayed_bandit_claims_are_judged_on_target_rounds_with_the_clock_beside():
    """Issue 56: MetaSD's stopping-time objective. On a replay every method emits the same tokens, so rounds per
    query decide; a method faster on the clock but needing more rounds is not held, and the clock's error, which
    widens wall-clock verdicts, leaves a rounds verdict as it is."""
    import numpy as np

    from specbench.reproduction import replay_verdicts as LH

    rng = np.random.default_rng(0)
    rows = []
    for i in range(32):
        tokens = 200 + i
        for method, rounds, seconds in (("ucb-bd", 60, 2.0), ("fixed:a", 55, 2.4), ("fixed:b", 80, 1.5)):
            rows.append(
                {
                    "method": method,
                    "query_id": f"q{i}",
                    "task": "t",
                    "new_tokens": tokens,
                    "rounds": rounds + rng.integers(0, 3),
                    "seconds": seconds * (1 + 0.01 * rng.random()),
                }
            )
    q = pd.DataFrame(rows)
    assert LH.best_single(q, LH.ROUNDS_AXIS) == "fixed:a" and LH.best_single(q) == "fixed:b"
    v = LH.speed_verdict(
        q, "UCB-BD is faster than fixed:a, in target rounds", "ucb-bd", "fixed:a", cost="rounds"
    )
    assert v.held is False and v.label == "tokens per target round ratio ucb-bd / fixed:a"
    assert "wall-clock beside, not judged: n=32, speedup ratio ucb-bd / fixed:a 1.19" in v.detail
    assert not LH.on_the_clock(v) and LH.on_the_clock(
        V.faster("c", ([1.0] * 16, [9.0] * 16), ([1.0] * 16, [9.0] * 16))
    )
    w = LH.speed_verdict(
        q, "UCB-BD is faster than fixed:b, in target rounds", "ucb-bd", "fixed:b", cost="rounds"
    )
    assert w.held is True and w.claim.startswith("[replayed] ")
