"""Per-round selection (MetaSD's UCB-BD) against a prompt-level router trained offline (Huang et al.'s policy), on the
same streams, replayed over acceptance traces and judged on target rounds per query (MetaSD's stopping time, exact
in a greedy replay).

A *stream* is a ``specbench trace`` run of some queries and a ``specbench collect collect.trace=<that trace>`` run of
the same queries (only its prompt embeddings are read here). For each stream this module replays the fixed arms and
UCB-BD over the trace (``<out>/<stream>/bandits``), lets the policy choose one arm per query from the query's
embedding, reads that arm's target rounds from the replay (a fixed arm's replay is exact), and judges UCB-BD against
the policy, paired per query. Three streams test the seed's three statements: the clean held-out stream (the seed
trace), the same kind of queries with perturbed prompts (paraphrased instructions: ``templates`` set
``paraphrased``) and queries of a task no drafter or router was trained on (out of distribution).

    python -m specbench.reproduction.routing OUT --policy POLICY --arms a,b,c \\
        --stream clean=TRACE:COLLECT --stream perturbed=TRACE:COLLECT --stream ood=TRACE:COLLECT
"""

from __future__ import annotations

import argparse
import dataclasses
import json
from pathlib import Path

import pandas as pd
import torch

from specbench.errors import SpecbenchError, exit_on
from specbench.files import atomic_write_text
from specbench.pipelines import replay as replay_pipeline
from specbench.pipelines.collected import read_rows
from specbench.pipelines.tables import to_markdown
from specbench.reproduction import verdicts as V
from specbench.reproduction.replay_calibration import compose_replay
from specbench.reproduction.replay_verdicts import ROUNDS_AXIS, labelled, per_query, speed_verdict
from specbench.reproduction.runs import SEEDS

KEY = "metasd/routing"
STREAMS = {
    "clean": "the held-out stream (the seed trace's queries)",
    "perturbed": "the same tasks with perturbed prompts (paraphrased instructions)",
    "ood": "queries of a task no drafter or router was trained on",
}
VERDICTS_DATA = "verdicts_data.json"
SOURCE = "replayed.json"
POLICY = "policy"


def choices(policy_path: Path, collect_run: Path, ids: list[str]) -> dict[str, str]:
    """query id -> the arm the policy picks from the query's embedding (the collect run's rows of ``ids``)."""
    from specbench.policy import load_checkpoint

    policy = load_checkpoint(policy_path)
    rows = {str(r["query_id"]): r for r in read_rows([str(collect_run)])}
    missing = [q for q in ids if q not in rows]
    if missing:
        raise SpecbenchError(
            f"{collect_run} holds no embedding of {len(missing)} traced queries (e.g. {missing[0]})",
            "collect over the same trace: specbench collect collect.trace=<trace> with the trace's experiment",
        )
    return {q: policy.choose(torch.tensor(rows[q]["embedding"], dtype=torch.float64)) for q in ids}


def policy_rows(q: pd.DataFrame, chosen: dict[str, str]) -> pd.DataFrame:
    """The policy's per-query rows: each query's chosen arm's replayed fixed row (rounds, seconds, tokens)."""
    fixed = q[q.method.str.startswith("fixed:")].set_index(["query_id", "method"])
    rows = [
        fixed.loc[(qid, f"fixed:{arm}")].to_dict() | {"query_id": qid, "arm": arm}
        for qid, arm in chosen.items()
    ]
    out = pd.DataFrame(rows).set_index("query_id")
    out["method"] = POLICY
    return out


def stream(
    out: Path, name: str, trace: Path, collect: Path, policy: Path, arms: list[str]
) -> tuple[list[str], V.Verdict]:
    """One stream: replay the fixed arms and UCB-BD, the policy's choices, the verdict and the page's section."""
    d = out / name
    methods = ",".join(["autoregressive", *(f"fixed:{a}" for a in arms), "selector:ucb"])
    replay_pipeline.run(
        compose_replay(
            [
                f"traces={trace}",
                "seeds=1",
                "overwrite=true",
                f"methods=[{methods}]",
                f"+selector_overrides.candidates=[{','.join(arms)}]",
            ]
        ),
        d / "bandits",
    )
    atomic_write_text(
        d / SOURCE, json.dumps({"trace": str(trace), "collect": str(collect), "arms": arms}, indent=1)
    )
    q = per_query(d / "bandits" / SEEDS)
    ids = sorted(set(q[q.method == "ucb-bd"].query_id), key=str)
    chosen = choices(policy, collect, ids)
    mine = policy_rows(q, chosen)
    claim = f"UCB-BD is faster than the prompt-level policy on {STREAMS.get(name, name)}, in target rounds"
    v = V.keyed(
        speed_verdict(q, claim, "ucb-bd", mine, cost=ROUNDS_AXIS, names=("ucb-bd", "policy")),
        f"{KEY}#vs-policy:{name}",
    )
    tasks = q.drop_duplicates("query_id").set_index("query_id").task
    table = pd.DataFrame(
        [
            {
                "method": m,
                "queries": int(sub.query_id.nunique()),
                "tokens / round": float(sub.new_tokens.sum() / sub.rounds.sum()),
            }
            for m, sub in [*q.groupby("method", sort=False), (POLICY, mine.reset_index())]
        ]
    )
    picks = pd.crosstab(tasks.reindex(list(chosen)), pd.Series(chosen, name="chosen arm"))
    lines = [
        f"## {name}: {STREAMS.get(name, name)}",
        "",
        f"Trace `{trace}`, embeddings `{collect}`; {len(ids)} queries.",
        "",
        to_markdown(table),
        "",
        "The policy's choices by task:",
        "",
        to_markdown(picks.reset_index()),
        "",
        f"- {v.line()}",
        "",
    ]
    return lines, v


def write(out: Path, policy: Path, arms: list[str], streams: dict[str, tuple[Path, Path]]) -> Path:
    """Every stream's replay and verdict into ``out``: ``routing.md``, ``verdicts_data.json``, ``replayed.json``."""
    from specbench import provenance

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    if len(arms) < 2:
        raise SpecbenchError(
            f"--arms {','.join(arms)}: a selection needs two or more arms", "name the drafters"
        )
    lines = [
        "# Per-round selection against a prompt-level router (replayed)",
        "",
        f"UCB-BD (statistics reset per query) against Huang et al.'s policy (`{policy}`: one arm per query from the "
        f"prompt's embedding), both over the arms {', '.join(arms)}, replayed over acceptance traces and judged on "
        "target rounds per query (exact in a greedy replay).",
        "",
    ]
    verdicts = []
    for name, (trace, collect) in streams.items():
        section, v = stream(out, name, Path(trace), Path(collect), Path(policy), arms)
        lines += section
        verdicts.append(labelled(v) if not v.claim.startswith("[") else v)
    atomic_write_text(out / "routing.md", "\n".join(lines) + "\n")
    atomic_write_text(out / VERDICTS_DATA, json.dumps([dataclasses.asdict(v) for v in verdicts], indent=1))
    atomic_write_text(
        out / SOURCE,
        json.dumps({"policy": str(policy), "arms": arms, "streams": {k: list(map(str, v)) for k, v in streams.items()}},
                   indent=1),
    )  # fmt: skip
    provenance.record(out)
    print("\n".join(lines))
    return out / "routing.md"


def exhibit(out: Path):
    """The reproduction report's exhibit of ``write``'s verdicts (``specbench report --routing OUT``)."""
    from specbench.reproduction.exhibit import Exhibit
    from specbench.reproduction.long_horizon import load_verdicts

    out = Path(out)
    verdicts = load_verdicts(out)
    table = pd.DataFrame(
        [
            {"claim": v.claim, "n": v.n, "effect": v.effect, "interval": v.interval, "label": v.label}
            for v in verdicts
        ]
    )
    return Exhibit(
        "MetaSD against a prompt-level router: per-round UCB-BD and Huang et al.'s policy on the same streams "
        "(replayed)",
        table,
        verdicts,
        f"Each stream replayed over its acceptance trace; the policy picks one arm per query from the prompt's "
        f"embedding (trained on other rows); judged on target rounds per query. The full page: `{out}/routing.md`.",
        key=KEY,
        runs=[str(out)],
    )


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("out")
    p.add_argument("--policy", required=True, help="a train-policy run (or its policy.pt)")
    p.add_argument("--arms", required=True, help="a,b,...: the drafters both choose among")
    p.add_argument("--stream", action="append", default=[], help="NAME=TRACE_RUN:COLLECT_RUN (repeatable)")
    a = p.parse_args(argv)
    streams = {}
    try:
        for spec in a.stream:
            name, _, paths = spec.partition("=")
            trace, _, collect = paths.partition(":")
            if not (name and trace and collect):
                raise SpecbenchError(
                    f"--stream {spec}: not NAME=TRACE_RUN:COLLECT_RUN", "e.g. --stream clean=a:b"
                )
            for path in (trace, collect):
                if not Path(path).is_dir():
                    raise SpecbenchError(
                        f"--stream {name}: {path} does not exist", "run its trace and collect first"
                    )
            streams[name] = (Path(trace), Path(collect))
        if not streams:
            raise SpecbenchError("no --stream given", "pass --stream NAME=TRACE_RUN:COLLECT_RUN")
        write(Path(a.out), Path(a.policy), [x for x in a.arms.split(",") if x], streams)
    except SpecbenchError as exc:
        exit_on(exc)


if __name__ == "__main__":
    main()
