"""Acceptance traces and exact replay (``decoding/trace.py``, ``decoding/replay.py``, ``specbench trace`` / ``replay``).

- live equals replay: on the tiny Llama in fp32, every shipped selector config (the policy aside: it reads the
  query's embedding), every fixed arm, a tree and the whole pool's tree, replayed over a trace with side
  observations, equal the live loop round for round (arm, drafted, accepted, emitted, N_max, BE, switches,
  first use, tree members and winners exactly; BD to 1e-5) and give the same output;
- the trace's output is the autoregressive one, and a dynamic-int8 drafter is marked as not history-free;
- the replay clock on a hand-made two-drafter trace equals the hand computation;
- ``specbench trace`` resumes to the same records after an interruption, refuses a changed query file, and
  ``specbench replay`` writes eval's files marked replayed; bad replay input is refused with its fix.
"""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch
from hydra import compose, initialize_config_dir

from specbench.configs import conf_dir, group_options, load_option
from specbench.decoding.drafter import AUTOREGRESSIVE
from specbench.decoding.loop import DecodeSpec, Limits
from specbench.decoding.replay import replay
from specbench.decoding.replay_costs import ROUND_KINDS, Costs
from specbench.decoding.sampling import SamplingParams
from specbench.decoding.trace import DrafterTrace, QueryTrace, trace, trace_lengths
from specbench.drafters import build_pool
from specbench.errors import SpecbenchError
from specbench.pipelines import replay as replay_pipeline
from specbench.pipelines import trace as trace_pipeline
from specbench.pipelines.methods import make_selector
from specbench.selection import UCB, Fixed, FixedTree
from specbench.timing import Clock
from tests.conftest import tiny_drafter_configs
from tests.integration.test_eagle import write_head

PROMPTS = [
    "The quick brown fox jumps over the lazy dog. The quick brown",
    "Speculative decoding: 1, 2, 3, 4, 1, 2,",
]
MAX_NEW = 48
FIELDS = (
    "arm",
    "drafted",
    "accepted",
    "emitted",
    "n_max",
    "be",
    "switched",
    "first_use",
    "members",
    "tree_size",
    "member_accepted",
    "winners",
)
COSTS = Costs(
    q=(1, 2, 8, 40),
    contexts=(16, 128),
    seconds=((0.010, 0.011, 0.014, 0.03), (0.012, 0.013, 0.016, 0.035)),
    catch_up={"early_exit": ((1, 0.001), (16, 0.004))},
)


def cfg_of(name: str, overrides: list[str]):
    with initialize_config_dir(config_dir=conf_dir(), version_base=None):
        return compose(config_name=name, overrides=overrides)


@pytest.fixture(scope="module")
def exact_pool(tiny_llama_target, tmp_path_factory):
    """Every history-free drafter kind: prompt lookup, an early exit (observes under full information), an hf
    model, weight-only int8, and an EAGLE head (which also observes)."""
    target = tiny_llama_target
    head = write_head(tmp_path_factory.mktemp("replay_head"), target, "head")
    configs = tiny_drafter_configs("tiny_llama", ("prompt_lookup", "early_exit", "hf", "quantized_weight"))
    configs["eagle"] = {"_target_": "specbench.drafters.eagle.build", "checkpoint": str(head)}
    return target, build_pool(target, configs)


def spec_for(target, max_new=MAX_NEW):
    eos = frozenset({int(target.tokenizer.eos_token_id)})
    return DecodeSpec(SamplingParams(), Limits(max_new_tokens=max_new, draft_length=4), eos, Clock())


@pytest.fixture(scope="module")
def traced(exact_pool):
    target, pool = exact_pool
    lengths = trace_lengths(pool, 4, None)
    out = []
    for text in PROMPTS:
        ids = target.tokenizer(text)["input_ids"]
        qt, gen = trace(
            target,
            pool,
            ids,
            spec_for(target),
            lengths,
            torch.Generator().manual_seed(0),
            side_observations=True,
        )
        out.append((ids, qt, gen))
    return out


def selector_configs() -> dict[str, dict]:
    """Every shipped selector config, as parse_methods instantiates it (the policy left out: it reads embeddings)."""
    out = {}
    for name in group_options("selector"):
        cfg = load_option("selector", name)
        if "Policy" in str(cfg.get("_target_")) or "_target_" not in cfg:
            continue
        out[name] = {k: v for k, v in dict(cfg).items() if k != "name"}
    return out


LIVE_ONLY = ("budget", "budget_by_task", "budget_by_query", "budget_kept")


def selectors(arms: list[str]):
    made = {f"fixed:{a}": (lambda a=a: Fixed(arms, a)) for a in arms}
    made["tree:prompt_lookup+eagle"] = lambda: FixedTree(arms, ["prompt_lookup", "eagle"])
    made["tree:*"] = lambda: FixedTree(arms, [a for a in arms if a != AUTOREGRESSIVE])
    for name, scfg in selector_configs().items():
        from omegaconf import OmegaConf

        plain = OmegaConf.to_container(OmegaConf.create(scfg), resolve=True)
        if name == "fixed":
            plain["arm"] = "eagle"
        if (
            name in LIVE_ONLY
        ):  # builds rounds from the drafts' own scores (test_budget_and_expected_routes_...)
            continue
        if name in (
            "router_sam",
            "router_suffix",
        ):  # the real pool's names; a route by expected tokens is live only
            plain.update(lookup="prompt_lookup", fallback="eagle", min_expected=None)
        made[f"selector:{name}"] = lambda plain=plain: make_selector(plain, arms)
    return made


def test_budget_and_expected_routes_are_not_replayed(exact_pool, traced):
    """A cost-model budget (its rounds are built from the drafts' own scores) and a route by expected tokens need
    what a trace does not keep: the replay refuses them with a clear error instead of guessing."""
    from specbench.errors import SpecbenchError
    from specbench.selection import Budget, Router

    _, pool = exact_pool
    arms = list(pool)
    lengths = {n: pool[n].draft_length or 4 for n in trace_lengths(pool, 4, None)}
    _, qt, _ = traced[0]
    for sel in (
        Budget(arms, retrieval="prompt_lookup"),
        Router(arms, lookup="prompt_lookup", fallback="eagle", min_expected=2.0),
    ):
        with pytest.raises(SpecbenchError, match="live"):
            replay(qt, sel, Limits(max_new_tokens=MAX_NEW, draft_length=4), COSTS, lengths)


def test_the_trace_follows_the_autoregressive_output(exact_pool, traced, tiny_decode):
    target, pool = exact_pool
    for ids, qt, _ in traced:
        ar = tiny_decode(target, pool, AUTOREGRESSIVE, ids, max_new_tokens=MAX_NEW)
        assert qt.output == ar.tokens
        assert all(len(dt.drafts) == qt.positions for dt in qt.drafters.values())
        assert qt.drafters["eagle"].side is not None and qt.drafters["early_exit"].side is not None
        assert all(dt.history_free for dt in qt.drafters.values())


def test_live_equals_replay_for_every_selector(exact_pool, traced, tiny_decode):
    target, pool = exact_pool
    arms = list(pool)
    lengths = {n: pool[n].draft_length or 4 for n in trace_lengths(pool, 4, None)}
    made = selectors(arms)
    assert {
        "selector:ucb",
        "selector:hedge",
        "selector:ucb_full_info",
        "selector:router_tree",
        "selector:explore_commit",
        "selector:tree_hedge",
        "selector:sequential_halving",
        "selector:exp3",
    } <= set(made)
    checked = 0
    for name, make in made.items():
        live_sel, rep_sel = make(), make()
        for ids, qt, _ in traced:
            live = tiny_decode(target, pool, live_sel, ids, max_new_tokens=MAX_NEW)
            rep = replay(qt, rep_sel, Limits(max_new_tokens=MAX_NEW, draft_length=4), COSTS, lengths)
            assert rep.tokens == live.tokens, name
            assert len(rep.rounds) == len(live.rounds), name
            for a, b in zip(live.rounds, rep.rounds):
                for f in FIELDS:
                    assert getattr(a, f) == getattr(b, f), (
                        f"{name} round {a.index}: {f} {getattr(a, f)} != {getattr(b, f)}"
                    )
                assert abs(a.bd - b.bd) < 1e-5, f"{name} round {a.index}: bd {a.bd} != {b.bd}"
                checked += 1
            assert rep.counterfactual == 0
    assert checked > 1000


def test_selectors_not_marked_randomized_give_the_same_rounds_for_every_seed(exact_pool, traced):
    """What lets replay run a deterministic selector once for all its seeds."""
    from specbench.pipelines.methods import Method

    target, pool = exact_pool
    arms = list(pool)
    lengths = {n: pool[n].draft_length or 4 for n in trace_lengths(pool, 4, None)}
    limits = Limits(max_new_tokens=MAX_NEW, draft_length=4)
    randomized = set()
    for name, scfg in selector_configs().items():
        from omegaconf import OmegaConf

        plain = OmegaConf.to_container(OmegaConf.create(scfg), resolve=True)
        if name == "fixed":
            plain["arm"] = "eagle"
        if name in LIVE_ONLY:
            continue
        if name in ("router_sam", "router_suffix"):
            plain.update(lookup="prompt_lookup", fallback="eagle", min_expected=None)
        m = Method(name, lambda plain=plain: make_selector(plain, arms), plain)
        runs = []
        for seed in (0, 7):
            sel = m.reseeded(arms, seed)
            runs.append(
                [
                    [(r.arm, r.accepted) for r in replay(qt, sel, limits, COSTS, lengths).rounds]
                    for _, qt, _ in traced
                ]
            )
        if m.seeded:
            randomized.add(name)
            assert runs[0] != runs[1], f"{name} is marked randomized but two seeds replay alike"
        else:
            assert runs[0] == runs[1], f"{name} is not marked randomized, yet its seeds differ"
    assert {"exp3", "hedge", "random", "epsilon_greedy"} <= randomized and "ucb" not in randomized


def test_dynamic_int8_is_not_history_free(tiny_llama_target):
    pool = build_pool(
        tiny_llama_target, tiny_drafter_configs("tiny_llama", ("quantized_dynamic", "quantized_weight"))
    )
    assert not pool["quantized_dynamic"].history_free and pool["quantized_weight"].history_free


def hand_trace() -> QueryTrace:
    """Ten output tokens; drafter A's drafts (up to 3 tokens, cut by the room left) are always right, B's always
    wrong at their first token."""
    output = list(range(100, 110))
    drafts = [output[t : t + min(3, 9 - t)] for t in range(10)]
    a = DrafterTrace(
        k=3,
        drafts=drafts,
        accepted=[len(d) for d in drafts],
        overlap=[[0.9] * len(d) for d in drafts],
        match=[None] * 10,
        t_propose=[0.003] * 10,
        t_setup=0.02,
    )
    b = DrafterTrace(
        k=3,
        drafts=[[1, 2, 3][: min(3, 9 - t)] for t in range(10)],
        accepted=[0] * 10,
        overlap=[[0.1] * min(3, 9 - t) for t in range(10)],
        match=[None] * 10,
        t_propose=[0.0] * 10,
    )
    return QueryTrace(
        prompt_len=50,
        output=output,
        stop="length",
        max_new_tokens=10,
        t_prefill=0.5,
        drafters={"A": a, "B": b},
    )


def test_the_replay_clock_on_a_hand_made_trace():
    """verify(q) = 0.012 + 0.002 (q - 1) s at every context; A: setup 0.02 s, catch-up 0.001 s a token, 0.003 s a
    proposal; the prefill 0.5 s."""
    costs = Costs(
        q=(1, 10), contexts=(10,), seconds=((0.012, 0.030),), catch_up={"A": ((1, 0.001), (10, 0.010))}
    )
    arms = [AUTOREGRESSIVE, "A", "B"]
    limits = Limits(max_new_tokens=10, draft_length=3)
    lengths = {"A": 3, "B": 3}
    qt = hand_trace()
    ar = replay(qt, Fixed(arms, AUTOREGRESSIVE), limits, costs, lengths)
    assert len(ar.rounds) == 10 and ar.seconds == pytest.approx(0.5 + 10 * 0.012)
    a = replay(qt, Fixed(arms, "A"), limits, costs, lengths)
    # rounds at t = 0 (3 drafted and accepted + the bonus: 4 tokens), t = 4 (4 more), t = 8 (room 1: k = 1, 2 tokens)
    assert [r.accepted for r in a.rounds] == [3, 3, 1] and [r.emitted for r in a.rounds] == [4, 4, 2]
    expect = (
        0.5
        + (0.02 + 0.003 + 0.018)  # first use: setup (nothing to catch up), propose, verify q = 4
        + (0.004 + 0.003 + 0.018)  # catch-up over the 4 tokens since t = 0, propose, verify
        + (0.004 + 0.003 + 0.014)
    )  # the last round drafts 1 token: verify q = 2
    assert a.seconds == pytest.approx(expect)
    assert a.rounds[0].t_switch == pytest.approx(0.02) and a.rounds[1].t_draft == pytest.approx(0.007)
    assert a.rounds[0].bd == pytest.approx(0.9) and a.rounds[2].bd == pytest.approx(0.9)
    assert ar.seconds / expect == pytest.approx(0.62 / expect)
    b = replay(qt, Fixed(arms, "B"), limits, costs, lengths)
    assert [r.accepted for r in b.rounds] == [0] * 10 and b.rounds[0].bd == pytest.approx(0.1)
    assert b.seconds == pytest.approx(
        0.5 + 7 * 0.018 + 0.016 + 0.014 + 0.012
    )  # drafts cut by the room at the end


def test_the_replay_clock_charges_traced_side_observations():
    """A full-information round pays its observers' side observations live (in its t_select): with them traced
    (``t_observe``), the replay adds them; without them it counts each observation as counterfactual, charges
    nothing, and says so (``Replayed.counterfactual``)."""
    from specbench.selection import Fixed as _Fixed

    class Watching(_Fixed):
        full_information = True

        def observe(self, arm, value):
            self.seen.append((arm, value))

    costs = Costs(
        q=(1, 10), contexts=(10,), seconds=((0.012, 0.030),), catch_up={"A": ((1, 0.001), (10, 0.010))}
    )
    arms = [AUTOREGRESSIVE, "A", "B"]
    limits, lengths = Limits(max_new_tokens=10, draft_length=3), {"A": 3, "B": 3}
    plain = replay(hand_trace(), _Fixed(arms, "A"), limits, costs, lengths)
    qt = hand_trace()
    qt.drafters["B"].observable = True
    qt.drafters["B"].side = [{"A": 0.25}] * 10
    qt.drafters["A"].t_observe = [0.005] * 10
    sel = Watching(arms, "A")
    sel.seen = []
    watched = replay(qt, sel, limits, costs, lengths)
    assert len(watched.rounds) == 3 and sel.seen == [("B", 0.25)] * 3 and watched.counterfactual == 0
    assert watched.seconds == pytest.approx(plain.seconds + 3 * 0.005)
    assert [r.t_select for r in watched.rounds] == pytest.approx([0.005] * 3)
    qt.drafters["B"].side, qt.drafters["A"].t_observe = None, None  # traced without side observations
    sel.seen = []
    blind = replay(qt, sel, limits, costs, lengths)
    assert blind.counterfactual == 3 and blind.seconds == pytest.approx(plain.seconds)
    assert sel.seen == [("B", pytest.approx(0.1))] * 3  # B's own draft's Block Divergence, not the live one


TRACE = [
    "target=tiny_llama",
    "pool=tiny",
    "dataset.limit=1",
    "decoding.max_new_tokens=24",
    "warmup.max_new_tokens=2",
    "trace.costs.contexts=[16]",
    "trace.costs.repeats=1",
    "trace.costs.warmup=0",
    "trace.costs.catch_up=[1,4]",
]


def jsonl(path):
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()]


def untimed_trace(row: dict) -> dict:
    tr = dict(row["trace"])
    tr.pop("t_prefill")
    tr["drafters"] = {
        n: {k: v for k, v in d.items() if k not in ("t_propose", "t_setup", "t_observe")}
        for n, d in tr["drafters"].items()
    }
    return {**row, "trace": tr}


@pytest.fixture(scope="module")
def trace_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("trace_whole")
    trace_pipeline.run(cfg_of("trace", TRACE), out)
    return out


def test_an_interrupted_trace_resumes_to_the_same_records(trace_run, tmp_path, monkeypatch):
    from specbench.pipelines.session.run_records import Records

    whole = [untimed_trace(r) for r in jsonl(trace_run / "traces.jsonl")]
    assert len(whole) >= 3
    real, calls = Records.write, {"n": 0}

    def write(self, *a, **k):
        calls["n"] += 1
        if calls["n"] == 3:
            raise KeyboardInterrupt
        return real(self, *a, **k)

    monkeypatch.setattr(Records, "write", write)
    with pytest.raises(KeyboardInterrupt):
        trace_pipeline.run(cfg_of("trace", TRACE), tmp_path / "t")
    monkeypatch.undo()
    assert len(jsonl(tmp_path / "t" / "examples.jsonl")) == 2  # the third trace line is an orphan: redone
    trace_pipeline.run(cfg_of("trace", TRACE), tmp_path / "t")
    rows, _ = trace_pipeline.load_traces(tmp_path / "t")
    again = {r["query_id"]: untimed_trace({"query_id": r["query_id"], "trace": r["trace"]}) for r in rows}
    assert len(again) == len(whole)
    for row in whole:
        assert again[row["query_id"]]["trace"] == row["trace"]


def test_a_trace_refuses_to_resume_on_a_changed_query_file(tmp_path):
    data = tmp_path / "q.jsonl"
    data.write_text(
        "".join(
            json.dumps({"question": f"What is {i} plus {i}?", "answer": f"#### {2 * i}"}) + "\n"
            for i in range(2)
        )
    )
    args = [*TRACE, "dataset=gsm8k", f"dataset.path={data}"]
    trace_pipeline.run(cfg_of("trace", args), tmp_path / "t")
    data.write_text(
        "".join(
            json.dumps({"question": f"How many legs do {i} cats have?", "answer": f"#### {4 * i}"}) + "\n"
            for i in range(2)
        )
    )
    with pytest.raises(SpecbenchError, match="content changed"):
        trace_pipeline.run(cfg_of("trace", args), tmp_path / "t")


def test_replay_writes_eval_files_marked_replayed(trace_run, tmp_path):
    out = tmp_path / "r"
    replay_pipeline.run(
        cfg_of(
            "replay",
            [
                f"traces={trace_run}",
                "seeds=3",
                "methods=[autoregressive,fixed:*,oracle:round,tree:*,selector:ucb,selector:exp3]",
            ],
        ),
        out,
    )
    examples, rounds, seeds = (
        jsonl(out / "examples.jsonl"),
        jsonl(out / "rounds.jsonl"),
        jsonl(out / "seeds.jsonl"),
    )
    assert examples and all(e["replayed"] for e in examples) and all(r["replayed"] for r in rounds)
    methods = {e["method"] for e in examples}
    assert {"autoregressive", "fixed:quantized", "oracle:round", "tree:*", "ucb-bd", "exp3-bd"} <= methods
    assert {s["seed"] for s in seeds if s["method"] == "exp3-bd"} == {0, 1, 2}
    assert {s["seed"] for s in seeds if s["method"] == "fixed:quantized"} == {0}  # seedless: once
    assert {s["seed"] for s in seeds if s["method"] == "ucb-bd"} == {0}  # deterministic: once
    assert (
        (out / "summary.csv").exists() and (out / "seeds.csv").exists() and (out / "convergence.csv").exists()
    )
    ar = [e for e in examples if e["method"] == "autoregressive"]
    traced = {r["query_id"]: r for r in jsonl(trace_run / "examples.jsonl")}
    assert all(e["output_ids"] == traced[e["query_id"]]["output_ids"] for e in ar)


@pytest.mark.parametrize(
    "overrides, problem",
    [
        (["replay.draft_length=9"], "the trace holds 4"),
        (["replay.max_new_tokens=500"], "the trace holds"),
        (["methods=[selector:policy]"], "context-aware policy"),
    ],
)
def test_bad_replay_input_is_refused(trace_run, tmp_path, overrides, problem):
    with pytest.raises(SpecbenchError) as err:
        replay_pipeline.run(cfg_of("replay", [f"traces={trace_run}", "seeds=1", *overrides]), tmp_path / "r")
    if problem:
        assert problem in err.value.problem
    assert err.value.fix


def test_replay_of_a_missing_trace_directory_names_the_fix(tmp_path):
    with pytest.raises(SpecbenchError, match="does not exist") as err:
        replay_pipeline.run(cfg_of("replay", [f"traces={tmp_path / 'nope'}"]), tmp_path / "r")
    assert "specbench trace" in err.value.fix


def test_a_trace_refuses_to_resume_after_a_drafter_checkpoint_changed(tiny_llama_target, tmp_path):
    head = write_head(tmp_path, tiny_llama_target, "head", seed=0)
    args = [
        *TRACE,
        "+pool.drafters.eagle._target_=specbench.drafters.eagle.build",
        f"+pool.drafters.eagle.checkpoint={head}",
    ]
    trace_pipeline.run(cfg_of("trace", args), tmp_path / "t")
    write_head(tmp_path, tiny_llama_target, "head", seed=1)  # retrained in place, same name and config
    with pytest.raises(SpecbenchError, match="drafter checkpoint"):
        trace_pipeline.run(cfg_of("trace", args), tmp_path / "t")


def test_a_rebuilt_package_head_is_fingerprinted_and_refused_on_resume(
    tiny_llama_target, tmp_path, monkeypatch
):
    """`package:` heads (the shipped ones, or $SPECBENCH_HEADS) are fingerprinted like local and cache: ones, so a
    head rebuilt in place under the same name is not presented as the old one's records."""
    heads = tmp_path / "heads"
    write_head(heads, tiny_llama_target, "eagle_x", seed=0)
    monkeypatch.setenv("SPECBENCH_HEADS", str(heads))
    args = [
        *TRACE,
        "+pool.drafters.eagle._target_=specbench.drafters.eagle.build",
        "+pool.drafters.eagle.checkpoint=package:eagle_x",
    ]
    trace_pipeline.run(cfg_of("trace", args), tmp_path / "t")
    assert jsonl(tmp_path / "t" / "examples.jsonl")[0]["drafters"]["eagle"]
    write_head(heads, tiny_llama_target, "eagle_x", seed=1)  # `make specialists` rebuilds heads in place
    with pytest.raises(SpecbenchError, match="drafter checkpoint"):
        trace_pipeline.run(cfg_of("trace", args), tmp_path / "t")


def test_a_collection_replayed_from_a_trace_equals_the_live_one(trace_run, tmp_path):
    """``collect.trace``: every arm's run of a query replayed from the trace gives the live collection's target output
    and, for every history-free drafter, its drafted and accepted tokens; nothing else is decoded. A collection the
    trace cannot serve is refused naming the key."""
    from specbench.pipelines import collect as collect_pipeline
    from specbench.pipelines.collected import read_rows

    args = [a for a in TRACE if not a.startswith("trace.")] + ["collect.max_new_tokens=24"]
    live = read_rows(
        [
            p
            for p in collect_pipeline.run(
                cfg_of("collect", [*args, "collect.measure_speculative=true"]), tmp_path / "live"
            ).glob("rows*.jsonl")
        ]
    )
    rep = read_rows(
        [
            p
            for p in collect_pipeline.run(
                cfg_of("collect", [*args, f"collect.trace={trace_run}"]), tmp_path / "rep"
            ).glob("rows*.jsonl")
        ]
    )
    assert len(rep) == len(live) >= 3
    exact = [
        "prompt_lookup",
        "early_exit_1",
    ]  # pool=tiny's history-free drafters (dynamic int8 is not: approximate)
    by_id = {r["query_id"]: r for r in live}
    for row in rep:
        twin = by_id[row["query_id"]]
        assert row["target"]["tokens"] == twin["target"]["tokens"]
        assert row["embedding"] == pytest.approx(twin["embedding"])
        for _arm, rec in row["arms"].items():
            assert rec["spec"]["replayed"] is True
            assert "text" not in rec  # no standalone output was generated
        for arm in exact:
            assert (row["arms"][arm]["spec"]["drafted"], row["arms"][arm]["spec"]["accepted"]) == (
                twin["arms"][arm]["spec"]["drafted"],
                twin["arms"][arm]["spec"]["accepted"],
            )
    with pytest.raises(SpecbenchError, match="collect.max_new_tokens=64 is more than the trace's 24") as err:
        collect_pipeline.run(
            cfg_of("collect", [*args[:-1], "collect.max_new_tokens=64", f"collect.trace={trace_run}"]),
            tmp_path / "long",
        )
    assert "collect.max_new_tokens=24" in err.value.fix
    with pytest.raises(SpecbenchError, match="not in the trace run"):
        collect_pipeline.run(
            cfg_of("collect", [*args, "dataset.limit=2", f"collect.trace={trace_run}"]), tmp_path / "more"
        )
    with pytest.raises(SpecbenchError, match="samples at temperature"):
        collect_pipeline.run(
            cfg_of("collect", [*args, "decoding=sampling", f"collect.trace={trace_run}"]), tmp_path / "s"
        )
    # a per-drafter draft length longer than the trace's was read from the trace, not the collection (probe, issue 34)
    with pytest.raises(
        SpecbenchError, match="drafter 'prompt_lookup' drafts 9 tokens a round; the trace holds"
    ):
        collect_pipeline.run(
            cfg_of(
                "collect", [*args, "pool.drafters.prompt_lookup.draft_length=9", f"collect.trace={trace_run}"]
            ),
            tmp_path / "k9",
        )


def test_share_on_the_best_drafter_counts_only_chosen_members():
    """A tree round holds its always-members by construction: such a member on the best drafter is no choice, so it
    counts as no hit; a member the selector chose (or a played arm) does."""
    from types import SimpleNamespace

    from specbench.pipelines.replay import on_arm
    from specbench.selection import FixedTree, TreeUCB

    arms = [AUTOREGRESSIVE, "lookup", "head", "other"]
    tree = SimpleNamespace(arm="tree:lookup+head", members=["lookup", "head"])
    ucb = TreeUCB(arms, always=["lookup"])
    assert on_arm(tree, "lookup", ucb.fixed_members) == 0 and on_arm(tree, "head", ucb.fixed_members) == 1
    assert on_arm(tree, "head", FixedTree(arms, ["lookup", "head"]).fixed_members) == 0
    assert on_arm(SimpleNamespace(arm="head", members=None), "head", ucb.fixed_members) == 1


def test_a_trace_that_has_not_finished_its_plan_is_replayed_only_on_request(trace_run, tmp_path):
    """Issue 45 case 3: a trace with some of its planned queries (stopped, or still running) was replayed as if
    whole; it is refused naming what is missing, and replay.partial=true replays the finished ones."""
    import shutil

    from specbench.records import PLAN_FILE

    part = tmp_path / "part"
    shutil.copytree(trace_run, part)
    plan = json.loads((part / PLAN_FILE).read_text())
    n = len(plan["parts"])
    assert plan["what"] == "trace" and n >= 1
    plan["parts"] += ["gsm8k-98", "gsm8k-99"]  # two planned queries not traced yet
    (part / PLAN_FILE).write_text(json.dumps(plan))
    args = [f"traces={part}", "seeds=1", "methods=[autoregressive,fixed:*]"]
    with pytest.raises(
        SpecbenchError, match=f"holds {n} of the {n + 2} queries its trace planned.*gsm8k-98"
    ) as err:
        replay_pipeline.run(cfg_of("replay", args), tmp_path / "r")
    assert "replay.partial=true" in err.value.fix
    replay_pipeline.run(cfg_of("replay", [*args, "replay.partial=true"]), tmp_path / "r2")
    assert (tmp_path / "r2" / "summary.csv").exists()


def test_the_long_horizon_page_is_written_from_a_trace(trace_run, tmp_path):
    """``python -m specbench.reproduction.long_horizon`` on a tiny trace: every section, its verdicts (one for the
    reward variance over every drafter), and verdicts_data.json read back as the report reads it."""
    from specbench.reproduction import long_horizon

    page = long_horizon.write(trace_run, tmp_path / "lh", seeds=2)
    text = page.read_text()
    for title in (
        "## Convergence",
        "## Reward variance",
        "## Regret",
        "## Switching costs",
        "## Non-stationarity: the interleaved stream",
        "## MetaSD on the seed's kind of pool",
        "## Non-stationarity: a stream whose best drafter changes",
    ):
        assert title in text, title
    verdicts = long_horizon.load_verdicts(tmp_path / "lh")
    # issue 67: every verdict is a part with a key; convergence (4) and the uniform mixture, variance (one claim) and
    # discrimination, switching (3), the seed's pool (2), the changing stream as designed (2); the interleaved
    # stream and the regret table are shown, not judged
    keys = [v.key for v in verdicts]
    assert all(k.startswith("metasd/long_horizon#") for k in keys) and len(set(keys)) == len(keys)
    assert {k.split("#")[1] for k in keys} >= {
        "bd-early", "early-vs-exp3", "early-vs-halving", "bd-late", "uniform", "variance", "etc-fewer",
        "etc-faster", "penalty-faster", "beats-best", "beats-best-carried", "changing-ducb", "changing-swucb",
    }  # fmt: skip
    assert sum("for every single drafter" in v.claim for v in verdicts) == 1
    assert (
        "hedge-bd" not in (tmp_path / "lh" / "bandits" / "seeds.md").read_text()
    )  # no side observations traced
    changing = jsonl(tmp_path / "lh" / "changing" / "examples.jsonl")
    models = long_horizon.model_drafters(trace_pipeline.load_traces(trace_run)[0])
    assert "prompt_lookup" not in models and models
    assert {e["method"] for e in changing} >= {f"fixed:{a}" for a in models} | {"ducb-gm-bd", "swucb-gm-bd"}
    # their memories, sized by Garivier-Moulines' rule before the changing replay ran
    memories = json.loads((tmp_path / "lh" / long_horizon.MEMORIES).read_text())
    gamma, window = long_horizon.garivier_moulines(memories["horizon"], memories["breakpoints"])
    assert memories["gamma"] == gamma and memories["window"] == window and 0 < gamma < 1 and window >= 1
    assert "fixed:prompt_lookup" not in {e["method"] for e in changing}
    tasks = [e["task"] for e in changing if e["method"] == "ucb-bd"]
    assert tasks == sorted(tasks, key=tasks.index)  # each task's queries one after another


def test_replay_orders_queries_by_task_keeping_the_traced_order_within_each():
    rows = [
        {"task": t, "query_id": f"{t}{i}"} for i, t in enumerate(["chat", "math", "chat", "code", "math"])
    ]
    assert [r["query_id"] for r in replay_pipeline.ordered(rows, "by_task")] == [
        "chat0",
        "chat2",
        "math1",
        "math4",
        "code3",
    ]
    assert replay_pipeline.ordered(rows, "traced") == rows


def test_the_replay_clock_charges_a_tree_round_what_its_mask_costs(trace_run):
    """Issue 42: a tree round was priced as a chain forward of its size; the trace now measures what a tree forward
    costs beyond one (``tree_extra_s``) and the replay adds it to every tree round, and to no chain round."""

    traced = json.loads((trace_run / "costs.json").read_text())
    assert traced["tree_extra_s"] >= 0.0
    arms = [AUTOREGRESSIVE, "A", "B"]
    limits, lengths = Limits(max_new_tokens=10, draft_length=3), {"A": 3, "B": 3}
    base = Costs(q=(1, 10), contexts=(10,), seconds=((0.012, 0.030),))
    extra = Costs(q=(1, 10), contexts=(10,), seconds=((0.012, 0.030),), tree_extra=0.004)
    tree = replay(hand_trace(), FixedTree(arms, ["A", "B"]), limits, base, lengths)
    dearer = replay(hand_trace(), FixedTree(arms, ["A", "B"]), limits, extra, lengths)
    assert dearer.seconds == pytest.approx(tree.seconds + 0.004 * len(tree.rounds))
    chain = [replay(hand_trace(), Fixed(arms, "A"), limits, c, lengths).seconds for c in (base, extra)]
    assert chain[0] == pytest.approx(chain[1])
    assert Costs.from_dict({**traced, "tree_extra_s": 0.002}).tree_extra == 0.002


def test_the_replay_clock_charges_each_kind_of_round_its_fitted_overhead():
    """Issue 42: a live verification pays more than the forward the cost curve times (probabilities, acceptance,
    Block Divergence, the cache commit; a tree's mask and row moves). ``fit_overheads`` reads that excess per kind of
    round off a live run's rounds, and the replay charges each kind its own: one token, a chain, a tree."""
    from specbench.decoding.replay_costs import fit_overheads

    base = Costs(q=(1, 10), contexts=(10,), seconds=((0.012, 0.030),), tree_extra=0.0005)
    live_rounds = [  # verify(q) = 0.012 + 0.002 (q - 1) s at every context
        {"drafted": 0, "tree_size": 0, "members": None, "emitted": 1, "t_verify": 0.012 + 0.001},
        {"drafted": 3, "tree_size": 0, "members": None, "emitted": 4, "t_verify": 0.018 + 0.004},
        {"drafted": 3, "tree_size": 0, "members": None, "emitted": 2, "t_verify": 0.018 + 0.002},
        {"drafted": 5, "tree_size": 5, "members": ["A", "B"], "emitted": 3, "t_verify": 0.022 + 0.006},
    ]
    fitted = fit_overheads(base, [(50, live_rounds)])
    assert {k: n for k, (_, n) in fitted.items()} == {"autoregressive": 1, "chain": 2, "tree": 1}
    assert [fitted[k][0] for k in ("autoregressive", "chain", "tree")] == pytest.approx([0.001, 0.003, 0.006])
    costs = dataclasses.replace(base, overheads={k: s for k, (s, _) in fitted.items()})
    arms = [AUTOREGRESSIVE, "A", "B"]
    limits, lengths = Limits(max_new_tokens=10, draft_length=3), {"A": 3, "B": 3}
    for selector, per_round in (
        (lambda: Fixed(arms, AUTOREGRESSIVE), 0.001),
        (lambda: Fixed(arms, "A"), 0.003),
        (lambda: FixedTree(arms, ["A", "B"]), 0.006 - 0.0005),  # the fit replaces the trace's tree_extra
    ):
        plain, charged = (replay(hand_trace(), selector(), limits, c, lengths) for c in (base, costs))
        assert [r.arm for r in charged.rounds] == [r.arm for r in plain.rounds]
        assert charged.seconds == pytest.approx(plain.seconds + per_round * len(plain.rounds))


def test_the_replay_clock_charges_a_switch_what_a_live_switch_pays_beyond_the_catch_up_curve():
    """A live switch back to a drafter used before pays more than its catch-up curve (timed on the drafter alone):
    ``fit_overheads`` reads that excess off the live rounds that switched back (not a first use), and the replay
    charges it to each such round, on top of the curve over the tokens the drafter missed."""
    from specbench.decoding.replay_costs import SWITCH, fit_overheads

    curve = {
        "A": ((1, 0.001), (11, 0.011)),
        "B": ((1, 0.002), (11, 0.012)),
    }  # sync(n) = 0.001 n (+ 0.001 for B)
    base = Costs(q=(1, 10), contexts=(10,), seconds=((0.012, 0.030),), catch_up=curve)

    def live(arm, emitted, t_switch=0.0, switched=False, first_use=False):
        return {"arm": arm, "drafted": 3, "emitted": emitted, "t_verify": 0.018, "t_switch": t_switch,
                "switched": switched, "first_use": first_use}  # fmt: skip

    rounds = [
        live("A", 2, first_use=True, t_switch=0.05),  # first uses: their setup is the trace's, not fitted
        live("B", 3, switched=True, first_use=True, t_switch=0.05),
        live(
            "A", 4, switched=True, t_switch=0.003 + 0.002
        ),  # A missed 3 tokens: curve 0.003, live paid 0.002 more
        live("A", 1),  # no switch
        live("B", 2, switched=True, t_switch=0.006 + 0.004),  # B missed 5: curve 0.006, 0.004 more
    ]
    fitted = fit_overheads(base, [(50, rounds)])
    assert fitted[SWITCH][1] == 2 and fitted[SWITCH][0] == pytest.approx(0.003)
    costs = dataclasses.replace(base, overheads={SWITCH: fitted[SWITCH][0]})
    arms = [AUTOREGRESSIVE, "A", "B"]
    limits, lengths = Limits(max_new_tokens=10, draft_length=3), {"A": 3, "B": 3}
    ucb = lambda: UCB(arms, seed=0)  # noqa: E731 - plays A, then B, then switches between them
    plain, charged = (replay(hand_trace(), ucb(), limits, c, lengths) for c in (base, costs))
    back = [r for r in plain.rounds if r.switched and not r.first_use]
    assert back and [r.arm for r in charged.rounds] == [r.arm for r in plain.rounds]
    assert charged.seconds == pytest.approx(plain.seconds + 0.003 * len(back))


def test_replay_refuses_full_information_without_side_observations(trace_run, tmp_path):
    args = [f"traces={trace_run}", "seeds=1", "methods=[autoregressive,selector:hedge]"]
    with pytest.raises(
        SpecbenchError, match="full information.*no side observations for early_exit_1"
    ) as err:
        replay_pipeline.run(cfg_of("replay", args), tmp_path / "r")
    assert "replay.counterfactual=true" in err.value.fix and "trace.side_observations=true" in err.value.fix
    replay_pipeline.run(cfg_of("replay", [*args, "replay.counterfactual=true"]), tmp_path / "r2")
    assert (tmp_path / "r2" / "seeds.md").exists()


def test_replay_fits_its_round_overheads_on_a_live_run(trace_run, tmp_path):
    """``replay.live``: the eval run of the traced queries gives each kind of round's overhead (every live round
    counted once), the replay prints it, and the long-horizon calibration cross-fits it on the other half."""
    from specbench.pipelines import evaluate
    from specbench.reproduction.replay_calibration import calibration

    live = tmp_path / "live"
    evaluate.run(cfg_of("eval", [*TRACE[:5], "methods=[autoregressive,fixed:prompt_lookup]"]), live)
    rows, cost_dict = trace_pipeline.load_traces(trace_run)
    fitted = replay_pipeline.fit_from_live(Costs.from_dict(cost_dict), live, rows)
    live_rounds = jsonl(live / "rounds.jsonl")
    assert sum(fitted[k][1] for k in ROUND_KINDS if k in fitted) == len(live_rounds)
    # one-token rounds: the autoregressive method's and prompt lookup's rounds that found nothing to draft
    assert fitted["autoregressive"][1] == sum(r["drafted"] == 0 for r in live_rounds)
    assert fitted["chain"][1] == sum(r["drafted"] > 0 for r in live_rounds)
    out = tmp_path / "r"
    args = [f"traces={trace_run}", "seeds=1", "methods=[autoregressive,fixed:prompt_lookup]"]
    replay_pipeline.run(cfg_of("replay", [*args, f"replay.live={live}"]), out)
    assert f"fitted on the live run {live}: autoregressive" in (out / "seeds.md").read_text()
    with pytest.raises(SpecbenchError, match="no rounds.jsonl"):
        replay_pipeline.run(cfg_of("replay", [*args, f"replay.live={tmp_path}"]), tmp_path / "r3")
    cal, facts = calibration(trace_run, live)
    assert len(facts["overheads"]) == 2 and all("autoregressive" in text for text in facts["overheads"])
    assert set(cal.method) == {"autoregressive", "fixed:prompt_lookup"}


def test_a_drafter_in_bf16_is_not_history_free(tiny_llama_target):
    """Issue 42: in bf16 a multi-token catch-up rounds differently from single-token steps (the calibration saw
    generations differ before any fork), so model drafters and heads in bf16 are marked approximate for the replay;
    in fp32 they stay history-free."""
    from specbench.decoding.drafter import full_precision
    from specbench.drafters.base import ModelDrafter

    lin = torch.nn.Linear(2, 2)
    assert full_precision(lin) and not full_precision(lin.to(torch.bfloat16))
    target = tiny_llama_target
    fp32 = ModelDrafter("m", target.model, target.vocab_size, 0.5)
    assert fp32.history_free
    import copy

    half = ModelDrafter("m", copy.deepcopy(target.model).to(torch.bfloat16), target.vocab_size, 0.5)
    assert not half.history_free


def test_the_long_horizon_replays_play_only_the_named_arms(trace_run, tmp_path):
    """Issue 56: ``--arms`` names the only drafters every selector plays (the seed's equal-cost pool; the switching
    run's own selector too); the other traced drafters stay fixed reference rows, each query's best drafter and the
    best single drafter are among the arms, the bandit claims are judged on target rounds, and an arm the trace lacks
    is refused naming the traced ones."""
    from specbench.reproduction import long_horizon

    models = long_horizon.model_drafters(trace_pipeline.load_traces(trace_run)[0])
    assert len(models) >= 2
    with pytest.raises(SpecbenchError, match="not traced: nobody") as err:
        long_horizon.write(trace_run, tmp_path / "bad", seeds=1, arms=[models[0], "nobody"])
    assert models[0] in err.value.fix
    long_horizon.write(trace_run, tmp_path / "lh", seeds=1, arms=models[:2])
    bandits = {e["method"] for e in jsonl(tmp_path / "lh" / "bandits" / "examples.jsonl")}
    assert "fixed:prompt_lookup" in bandits  # a reference row
    assert not {"router", "tree-ucb"} & bandits
    for run in ("bandits", "switching", "stream"):  # every selector, the switching run's own included
        rounds = jsonl(tmp_path / "lh" / run / "rounds.jsonl")
        played = {r["arm"] for r in rounds if not r["method"].startswith(("fixed:", "oracle"))}
        assert played <= {*models[:2], AUTOREGRESSIVE}, run
        chose = [
            s
            for s in jsonl(tmp_path / "lh" / run / "seeds.jsonl")
            if s["method"] in {r["method"] for r in rounds}
        ]
        best = {
            s["best_arm"] for s in chose if not s["method"].startswith(("fixed:", "oracle", AUTOREGRESSIVE))
        }
        assert best <= set(models[:2]), run  # a reference row is no selector's best drafter
    verdicts = {v.key: v for v in long_horizon.load_verdicts(tmp_path / "lh")}
    best = verdicts["metasd/long_horizon#beats-best"]
    assert best.label.startswith("tokens per target round ratio ucb-bd / fixed:")
    assert best.label.split("fixed:")[1] in models[:2]
    assert "wall-clock beside, not judged" in best.detail


def test_per_round_selection_is_set_against_the_prompt_level_policy_on_the_same_stream(trace_run, tmp_path):
    """Issue 67 (specbench.reproduction.routing): a policy trained on a collection from the trace chooses one arm per
    query from the query's embedding; the policy's rounds are its chosen arm's replayed rounds, UCB-BD's are its own,
    and the verdict pairs them per query on target rounds (its key names the stream); a stream whose collection lacks a
    traced query is refused naming the fix."""
    from specbench.pipelines import collect as collect_pipeline
    from specbench.pipelines import train_policy
    from specbench.reproduction import long_horizon, routing
    from specbench.reproduction.replay_verdicts import per_query

    args = [a for a in TRACE if not a.startswith("trace.")] + ["collect.max_new_tokens=24"]
    collect = collect_pipeline.run(
        cfg_of("collect", [*args, f"collect.trace={trace_run}"]), tmp_path / "collect"
    )
    arms = long_horizon.model_drafters(trace_pipeline.load_traces(trace_run)[0])[:2]
    policy = train_policy.run(
        cfg_of(
            "train_policy",
            [f"data={collect}", "reward.alignment=acceptance", f"train.arms=[{','.join(arms)}]",
             "train.val_fraction=0.5", "train.epochs=5"],
        ),
        tmp_path / "policy",
    )  # fmt: skip
    routing.write(tmp_path / "r", policy, arms, {"clean": (trace_run, collect)})
    (v,) = long_horizon.load_verdicts(tmp_path / "r")
    assert v.key == "metasd/routing#vs-policy:clean" and v.claim.startswith(
        "[replayed] UCB-BD is faster than"
    )
    assert v.label == "tokens per target round ratio ucb-bd / policy"
    q = per_query(tmp_path / "r" / "clean" / "bandits" / "seeds.jsonl")
    chosen = routing.choices(policy, collect, sorted(set(q.query_id)))
    assert set(chosen.values()) <= set(arms)
    mine = routing.policy_rows(q, chosen)
    for qid, arm in chosen.items():  # the policy's rounds are its arm's, replayed
        assert mine.loc[qid].rounds == q[(q.query_id == qid) & (q.method == f"fixed:{arm}")].rounds.iloc[0]
    assert "clean" in (tmp_path / "r" / "routing.md").read_text()
    ex = routing.exhibit(tmp_path / "r")
    assert ex.key == "metasd/routing" and ex.verdicts[0].key == v.key
    (collect / "rows.jsonl").write_text("")  # no embedding of any traced query
    with pytest.raises(SpecbenchError, match="holds no embedding"):
        routing.write(tmp_path / "r2", policy, arms, {"clean": (trace_run, collect)})
