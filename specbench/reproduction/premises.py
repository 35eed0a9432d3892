"""Premises: the condition of the setup a seed's claim presupposes, declared before the runs that judge it.

A claim can only show where its setup allows it to: "the policy with the autoregressive arm beats drafting alone"
presupposes that drafting alone slows math; "a bandit beats the best single drafter" presupposes that some query
has a better drafter than the best single one (headroom); "UCB converges faster" presupposes enough rounds per
query to leave exploration (horizon); "at the target's quality a cascade is faster" presupposes a target whose
quality can be told from its drafter's (separability). A premise is never the claim's outcome itself: it is a
property of the setup, measured on rows other than the verdict's where it selects a pool (Table 4's pool, Fig. 3's
pools), on the verdict's own rows where it only gates (the horizon of a run, the separability of a metric).

Each premise is a function declared here with ``@premise`` (its key, the condition, the seed's sentence it comes
from, the rule with its threshold); statements (``statements.py``) name the premise of each part. The report
measures every premise a judged part names (:func:`measure`) and prints its value beside the verdict. A part whose
premise fails is **not testable here** (with the measured value): it enters neither side of its statement. The
thresholds are fixed in this file, and this file's lines are the declaration: the report reads, with ``git blame``,
the commit that last changed each premise's lines and refuses a premise newer than a run it judges
(:func:`check_declared`), so a premise cannot be adjusted after its result is seen.
"""

from __future__ import annotations

import functools
import inspect
import json
import math
import subprocess
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from specbench.errors import SpecbenchError

# >>> thresholds: every premise's declaration includes these lines (``declared``)
# The A/A floor: two processes of one method differ by up to about 3% in speed at the verdicts' n (docs/aa-cpu.md:
# the two-process pairs' 95% range at n = 32-48; the report's metasd/aa floors 0.97-1.03). A difference a premise
# requires must exceed it, or the A/A noise alone could make it.
AA_FLOOR = 0.03
# Horizon: a bandit leaves exploration after a few pulls of every arm; rounds per query at least this many times
# the arms (the seed's regret bounds are asymptotic in the rounds; 10 pulls an arm is where UCB's index separates
# arms whose rewards differ by about a third of their spread).
HORIZON_PER_ARM = 10
# The cascades' non-inferiority margin, in points of the task's metric (0-100 scale), fixed before the runs
# (docs/cascades.md: "within 1 point"); separability asks the target to lie at least twice it above its drafter.
CASCADE_MARGIN_POINTS = 1.0
SEPARABILITY_MARGINS = 2.0
# <<< thresholds


@dataclass(frozen=True)
class Sources:
    """What a premise may read: the reproduce root and the runs outside its plan (the replays of the seed trace,
    the prompt-level comparisons)."""

    root: Path
    long_horizon: Path | None = None
    routing: Path | None = None


@dataclass(frozen=True)
class Measured:
    """A premise measured for one part: its value, whether the premise holds (None: not measured), how the value
    reads, and the rows it was measured on."""

    value: float | None
    holds: bool | None
    text: str
    rows: str = ""

    def line(self) -> str:
        state = {True: "holds", False: "fails", None: "not measured"}[self.holds]
        return f"{state}: {self.text}" + (f" ({self.rows})" if self.rows else "")


@dataclass(frozen=True)
class Premise:
    key: str
    text: str  # the condition, as a sentence
    seed: str  # where the seed's claim presupposes it (its sentence, cited)
    rule: str  # how it is measured and its threshold
    measure: Callable[[Sources, str], Measured] = field(compare=False, repr=False)

    def __call__(self, sources: Sources, part: str) -> Measured:
        try:
            return self.measure(sources, part)
        except (FileNotFoundError, KeyError, ValueError, IndexError, ZeroDivisionError) as exc:
            return Measured(None, None, f"not measured ({type(exc).__name__}: {exc})")


PREMISES: dict[str, Premise] = {}


def premise(key: str, text: str, seed: str, rule: str):
    """Declare the decorated ``(sources, part key) -> Measured`` function as the premise ``key``."""

    def wrap(fn: Callable[[Sources, str], Measured]) -> Callable[[Sources, str], Measured]:
        if key in PREMISES:
            raise ValueError(f"premise {key} declared twice")
        PREMISES[key] = Premise(key, text, seed, rule, fn)
        return fn

    return wrap


# ---------------------------------------------------------------- reading runs


def _rows(root: Path, run: str) -> list[dict]:
    from specbench.pipelines.collected import read_rows

    path = Path(root) / run
    if not path.is_dir():
        raise FileNotFoundError(f"{path}")
    rows = read_rows([str(path)])
    if not rows:
        raise ValueError(f"{path} holds no collected rows")
    return rows


def _arm_spt(rows: list[dict], arm: str) -> float:
    """An arm's total seconds per new token over ``rows``' measured speculative runs."""
    runs = [(r["arms"][arm].get("spec") or {}) for r in rows if arm in r["arms"]]
    seconds = sum(float(s.get("seconds") or math.nan) for s in runs)
    tokens = sum(float(s.get("new_tokens") or 0) for s in runs)
    return seconds / tokens if tokens else math.nan


def _speeds(rows: list[dict], arms: Iterable[str]) -> dict[str, float]:
    """Each arm's speed over the autoregressive arm's on ``rows`` (total seconds per token, ratio)."""
    ar = _arm_spt(rows, "autoregressive")
    return {a: ar / _arm_spt(rows, a) for a in arms}


def _headroom_of(per_query_cost: pd.DataFrame) -> tuple[float, str, float, float]:
    """(headroom, best single arm, its cost per token, the per-query oracle's) from a frame of per-query cost per
    token (rows: queries, columns: arms): the per-query oracle's total cost over the best single arm's, minus 1 -- read
    as "the oracle is this much faster"."""
    totals = per_query_cost.sum()
    best = str(totals.idxmin())
    oracle = float(per_query_cost.min(axis=1).sum())
    return float(totals[best]) / oracle - 1, best, float(totals[best]), oracle


def _policy_arms(root: Path, run: str) -> list[str]:
    metrics = json.loads((Path(root) / run / "metrics.json").read_text(encoding="utf-8"))
    return [a for a in metrics["arms"] if a != "autoregressive"]


# ---------------------------------------------------------------- Huang et al.


@premise(
    "huang/specialists-differ",
    "the two specialists differ by task: each task's faster specialist beats the faster one over both tasks by more "
    "than the A/A floor",
    'Huang et al., Table 1: "each specialist speeds up its own domain and slows the other"; the policy "gets both" '
    "only where the two differ",
    f"per-task oracle over the best single specialist, on Table 1's collection rows (huang/collect, not the eval's): "
    f"headroom > {AA_FLOOR:.0%}",
)
def specialists_differ(src: Sources, part: str) -> Measured:
    from specbench.reproduction.layouts import CPU

    rows = _rows(src.root, "huang/collect")
    arms = [a for a in CPU.huang_pair if a in rows[0]["arms"]] or [
        a for a in rows[0]["arms"] if a != "autoregressive"
    ]
    frame = pd.DataFrame(
        [
            {"task": r.get("task"), **{a: (r["arms"][a].get("spec") or {}).get("seconds") for a in arms}}
            for r in rows
        ]
    )
    tokens = pd.Series([(r["arms"][arms[0]].get("spec") or {}).get("new_tokens") or 1 for r in rows])
    totals = frame[arms].sum()
    best = str(totals.idxmin())
    oracle = float(sum(frame[frame.task == t][arms].sum().min() for t in dict.fromkeys(frame.task)))
    gain = float(totals[best]) / oracle - 1
    return Measured(
        gain,
        gain > AA_FLOOR,
        f"headroom {gain:.1%} (the per-task best specialist against {best} over both tasks; "
        f"{int(tokens.sum())} tokens)",
        f"huang/collect, {len(rows)} queries",
    )


@premise(
    "huang/math-slowdown",
    "drafting alone slows math: the fastest drafter of Table 4's pool runs below autoregressive speed by more than "
    "the A/A floor",
    'Huang et al., Table 4: "on GSM8K plain drafting drops to about 0.75x", which is what the autoregressive arm '
    "is there to avoid",
    f"each of the policy's drafters alone on Table 4's collection rows (huang/math/collect, measured speculative "
    f"runs; not the eval's rows): the fastest below 1 / (1 + {AA_FLOOR:g}) of autoregressive speed",
)
def math_slowdown(src: Sources, part: str) -> Measured:
    rows = _rows(src.root, "huang/math/collect")
    arms = _policy_arms(src.root, "huang/math/policy")
    if not arms:
        return Measured(None, False, "the pool rule left no drafter in Table 4's pool", "huang/math/collect")
    speeds = _speeds(rows, arms)
    best = max(speeds, key=speeds.get)
    return Measured(
        speeds[best],
        speeds[best] < 1 / (1 + AA_FLOOR),
        f"the fastest drafter alone, {best}, runs {speeds[best]:.3f}x autoregressive ("
        + ", ".join(f"{a} {v:.3f}" for a, v in speeds.items())
        + ")",
        f"huang/math/collect, {len(rows)} queries",
    )


@premise(
    "huang/depth-slow-arm",
    "some drafter of Table 6's pool slows decoding: the slowest runs below autoregressive speed by more than the "
    "A/A floor",
    "Huang et al., Table 6: the autoregressive arm helps because some drafters (shallow exits) slow decoding down",
    f"each drafter alone on Table 6's collection rows (huang/depth/collect, measured speculative runs): the slowest "
    f"below 1 / (1 + {AA_FLOOR:g}) of autoregressive speed",
)
def depth_slow_arm(src: Sources, part: str) -> Measured:
    rows = _rows(src.root, "huang/depth/collect")
    arms = [a for a in rows[0]["arms"] if a != "autoregressive"]
    speeds = _speeds(rows, arms)
    worst = min(speeds, key=speeds.get)
    return Measured(
        speeds[worst],
        speeds[worst] < 1 / (1 + AA_FLOOR),
        f"the slowest drafter alone, {worst}, runs {speeds[worst]:.3f}x autoregressive",
        f"huang/depth/collect, {len(rows)} queries",
    )


@premise(
    "huang/alpha-tradeoff",
    "the better-aligned arm of Fig. 2 costs more: its alignment and its cost are both above the cheap arm's",
    "Huang et al., Fig. 2: alpha trades alignment against cost, which presupposes the aligned drafter is the dearer",
    "mean alignment (ROUGE-L of the drafter's own output to the target's) and parameter cost of the two arms on "
    "Fig. 2's collection rows (huang/depth/collect): both strictly above the cheap arm's",
)
def alpha_tradeoff(src: Sources, part: str) -> Measured:
    from specbench.reproduction.layouts import CPU

    rows = _rows(src.root, "huang/depth/collect")
    cheap, aligned = CPU.alpha_arms
    mean = lambda arm, key: float(  # noqa: E731
        pd.Series([r["arms"][arm].get(key) for r in rows], dtype=float).mean()
    )
    a_gap = mean(aligned, "alignment") - mean(cheap, "alignment")
    c_gap = mean(aligned, "cost_params") - mean(cheap, "cost_params")
    return Measured(
        a_gap,
        a_gap > 0 and c_gap > 0,
        f"alignment {aligned} - {cheap} {a_gap:+.3f}, parameter cost {aligned} - {cheap} {c_gap:+.3g}",
        f"huang/depth/collect, {len(rows)} queries",
    )


FIG3_POOLS = {"specialists": ("huang/fig3", "huang/policy"), "one-template": ("huang/fig3_pool", None)}


@premise(
    "huang/fig3-headroom",
    "the pool leaves a policy something to learn: the per-query oracle beats the best single drafter by more than "
    "the A/A floor",
    'Huang et al., Fig. 3: "policies are useful from 1k-10k training examples" -- useful against always playing the '
    "best drafter, which a pool without headroom makes impossible",
    f"per-query oracle over the best single arm on the pool's collection rows that are not validation rows (the "
    f"verdict's): headroom > {AA_FLOOR:.0%}",
)
def fig3_headroom(src: Sources, part: str) -> Measured:
    from specbench.records import DATA_EFFICIENCY_QUERIES_CSV

    name = part.rsplit(":", 1)[-1]
    big, small = FIG3_POOLS.get(name, FIG3_POOLS["specialists"])
    base = Path(src.root) / big
    if base.is_dir():
        collect, sweep = f"{big}/collect", base / "policy"
    elif small is not None:
        collect, sweep = "huang/collect", Path(src.root) / small
    else:
        raise FileNotFoundError(str(base))
    rows = _rows(src.root, collect)
    held = set(pd.read_csv(sweep / DATA_EFFICIENCY_QUERIES_CSV).query_id.astype(str))
    train = [r for r in rows if str(r["query_id"]) not in held]
    arms = [a for a in train[0]["arms"] if a != "autoregressive" and (train[0]["arms"][a].get("spec") or {})]
    cost = pd.DataFrame(
        [
            {
                a: float((r["arms"][a].get("spec") or {}).get("seconds") or math.nan)
                / max(float((r["arms"][a].get("spec") or {}).get("new_tokens") or 1), 1.0)
                for a in arms
            }
            for r in train
        ]
    ).dropna()
    gain, best, _, _ = _headroom_of(cost)
    return Measured(
        gain,
        gain > AA_FLOOR,
        f"headroom {gain:.1%} (the per-query oracle against {best}, the best single arm)",
        f"{collect}, {len(cost)} training queries (the validation queries left out)",
    )


# ---------------------------------------------------------------- MetaSD


def _replay_queries(out: Path, replay: str):
    from specbench.reproduction.replay_verdicts import per_query
    from specbench.reproduction.runs import SEEDS

    path = Path(out) / replay / SEEDS
    if not path.is_file():
        raise FileNotFoundError(str(path))
    return per_query(path)


def _replay_arms(out: Path) -> list[str] | None:
    found = Path(out) / "replayed.json"
    return json.loads(found.read_text(encoding="utf-8")).get("arms") if found.is_file() else None


def _live_examples(root: Path, run: str) -> pd.DataFrame:
    from specbench.reproduction.inputs import EXAMPLE_FIELDS, load_examples

    ex = load_examples(root, run, (*EXAMPLE_FIELDS, "rounds"))
    if "rounds" in ex:
        ex["rounds"] = pd.to_numeric(ex["rounds"], errors="coerce")
    if ex.empty:
        raise FileNotFoundError(f"{root}/{run}/examples.jsonl")
    return ex


# the part keys whose data are a replay over a trace (the others: a live run under the root)
REPLAYED_PARTS = ("metasd/long_horizon#", "metasd/routing#")


def _replay_dir(src: Sources, part: str) -> tuple[Path, str]:
    """The replay directory and stream behind a replayed part: the seed trace's replays (``long_horizon``) or a
    prompt-level comparison's stream (``routing/<stream>``)."""
    if part.startswith("metasd/routing#"):
        if src.routing is None:
            raise FileNotFoundError("no prompt-level comparison (routing) directory given")
        stream = part.split("#", 1)[1].rsplit(":", 1)[-1]
        return Path(src.routing) / stream, "bandits"
    if src.long_horizon is None:
        raise FileNotFoundError("no long-horizon replay directory given")
    return Path(src.long_horizon), "bandits"


@premise(
    "metasd/headroom",
    "the pool leaves a selector something to gain: the per-query oracle beats the best single drafter by more than "
    "the A/A floor",
    'MetaSD: "multiple specialised drafters", of which the right one differs by query; a selector can beat the best '
    "single drafter only where some query has a better one",
    f"replays: the per-query oracle's target rounds per token over the best single arm's (deterministic); live runs: "
    f"the per-task oracle over the best single drafter in seconds per token (a per-query oracle on the clock would "
    f"pick its noise); headroom > {AA_FLOOR:.0%}",
)
def metasd_headroom(src: Sources, part: str) -> Measured:
    if part.startswith(REPLAYED_PARTS):
        out, replay = _replay_dir(src, part)
        q = _replay_queries(out, replay)
        arms = _replay_arms(out)
        fixed = q[q.method.str.startswith("fixed:")]
        if arms:
            fixed = fixed[fixed.method.isin([f"fixed:{a}" for a in arms])]
        cost = fixed.assign(c=fixed.rounds / fixed.new_tokens).pivot(
            index="query_id", columns="method", values="c"
        )
        gain, best, _, _ = _headroom_of(cost.dropna())
        return Measured(
            gain,
            gain > AA_FLOOR,
            f"headroom {gain:.1%} in target rounds (the per-query oracle against {best.removeprefix('fixed:')})",
            f"{out.name}/{replay}, {len(cost)} queries, arms {', '.join(a.removeprefix('fixed:') for a in cost)}",
        )
    run = part.split("#", 1)[0].replace("metasd/main", "metasd/eval")  # the live run the part reads
    ex = _live_examples(src.root, run)
    fixed = ex[ex.method.astype(str).str.startswith("fixed:")]
    from specbench.records import CONFIG

    config = Path(src.root) / run / CONFIG
    if config.is_file():  # the bandit's arms only (a run's reference rows are no selector's arm)
        arms = {f"fixed:{a}" for a in _pool_arms(config.read_text(encoding="utf-8"))}
        fixed = fixed[fixed.method.isin(arms)] if arms & set(fixed.method) else fixed
    totals = fixed.groupby(["task", "method"])[["seconds", "new_tokens"]].sum()
    spt = (totals.seconds / totals.new_tokens).unstack("method")  # task x drafter: seconds per token
    tokens = totals.new_tokens.groupby(
        level="task"
    ).mean()  # each task's tokens (greedy: the same for every one)
    per_task = float((spt.min(axis=1) * tokens).sum())
    each = spt.mul(tokens, axis=0).sum()  # each drafter alone over every task
    best = str(each.idxmin())
    gain = float(each[best]) / per_task - 1
    return Measured(
        gain,
        gain > AA_FLOOR,
        f"headroom {gain:.1%} on the clock (the per-task oracle against {best.removeprefix('fixed:')})",
        f"{run}, {ex.query_id.nunique()} queries",
    )


@premise(
    "metasd/horizon",
    "the queries are long enough for a bandit to leave exploration: UCB-BD plays at least ten rounds per arm in a "
    "query",
    "MetaSD: UCB's regret and convergence are stated as the rounds grow; at about 20 rounds over 7 arms UCB is "
    "still round-robin, and explore-then-commit never commits",
    f"mean rounds per query of UCB-BD over its arms: at least {HORIZON_PER_ARM} (a live run's records, or a replay's)",
)
def metasd_horizon(src: Sources, part: str) -> Measured:
    if part.startswith(REPLAYED_PARTS):
        out, replay = _replay_dir(src, part)
        q = _replay_queries(out, replay)
        arms = _replay_arms(out) or [
            m.removeprefix("fixed:") for m in q.method.unique() if m.startswith("fixed:")
        ]
        rounds = float(q[q.method == "ucb-bd"].rounds.mean())
        where = f"{out.name}/{replay}"
    else:
        run = "metasd/stream" if part.startswith("metasd/stream") else "metasd/eval"
        ex = _live_examples(src.root, run)
        ucb = ex[ex.method == "ucb-bd"]
        rounds = float(ucb.rounds.mean()) if "rounds" in ucb else math.nan
        from specbench.records import CONFIG

        config = (Path(src.root) / run / CONFIG).read_text(encoding="utf-8")
        arms = _pool_arms(config)
        where = run
        if part.startswith(
            "metasd/stream"
        ):  # statistics carried over the whole stream: its rounds, not a query's
            rounds = float(ucb.rounds.sum())
    per_arm = rounds / max(len(arms), 1)
    return Measured(
        per_arm,
        per_arm >= HORIZON_PER_ARM,
        f"{rounds:.0f} rounds over {len(arms)} arms: {per_arm:.1f} a arm",
        where,
    )


def _pool_arms(config_yaml: str) -> list[str]:
    """The drafters a run's UCB plays: its selectors' candidates where set, else the pool's drafters."""
    from omegaconf import OmegaConf

    cfg = OmegaConf.create(config_yaml)
    candidates = OmegaConf.select(cfg, "selector_overrides.candidates")
    if candidates:
        return list(candidates)
    return list(OmegaConf.select(cfg, "pool.drafters") or {})


@premise(
    "metasd/changing-best",
    "the best drafter changes along the stream: at least two task segments have different best drafters",
    "MetaSD proposes discounted and sliding-window UCB for non-stationary streams, whose best drafter changes",
    "the fastest fixed drafter (fewest target rounds per token) of each task segment of the changing replay: at "
    "least two distinct",
)
def changing_best(src: Sources, part: str) -> Measured:
    if src.long_horizon is None:
        raise FileNotFoundError("no long-horizon replay directory given")
    q = _replay_queries(Path(src.long_horizon), "changing")
    fixed = q[q.method.str.startswith("fixed:")]
    totals = fixed.groupby(["task", "method"])[["rounds", "new_tokens"]].sum()
    best = (totals.rounds / totals.new_tokens).groupby(level="task").idxmin().map(lambda t: t[1])
    distinct = best.nunique()
    return Measured(
        float(distinct),
        distinct >= 2,
        f"{distinct} distinct segment bests ("
        + ", ".join(f"{t}: {m.removeprefix('fixed:')}" for t, m in best.items())
        + ")",
        "changing replay",
    )


# ---------------------------------------------------------------- speculative cascades


@premise(
    "cascades/separability",
    "the task's metric tells the target from its drafter: the target's quality lies above the drafter alone's by "
    "at least twice the non-inferiority margin",
    "speculative cascades: a cascade trades quality against speed between a small and a large model, so a test at "
    "'the target's quality' presupposes the two differ in quality",
    f"paired mean of the target's per-query score minus the drafter alone's on the run's queries: at least "
    f"{SEPARABILITY_MARGINS:g} x {CASCADE_MARGIN_POINTS:g} point of the metric",
)
def cascade_separability(src: Sources, part: str) -> Measured:
    from specbench.reproduction.inputs import margin_in_units, separation

    exhibit, rest = part.split("#", 1)
    task = rest.rsplit(":", 1)[-1]
    run = exhibit
    gap, metric, n = separation(src.root, run, task)
    needed = SEPARABILITY_MARGINS * margin_in_units(metric, CASCADE_MARGIN_POINTS)
    return Measured(
        gap,
        gap >= needed,
        f"the target over the drafter alone on {metric}: {gap:+.4g} (needed {needed:.4g})",
        f"{run}, {task}, {n} queries",
    )


# ---------------------------------------------------------------- the declarations' commits


@dataclass(frozen=True)
class Declared:
    """Where a premise's lines stand in git: the newest commit among them (None: not in a checkout, or git
    missing), and whether some of them are uncommitted."""

    commit: str | None
    uncommitted: bool = False

    def label(self) -> str:
        if self.commit is None:
            return "unknown (no git checkout)" if not self.uncommitted else "uncommitted"
        return self.commit[:10] + (" with uncommitted changes" if self.uncommitted else "")


def _git(*args: str, where: Path | None = None) -> str | None:
    where = where or Path(__file__).resolve().parent
    try:
        done = subprocess.run(
            ["git", "-C", str(where), *args], capture_output=True, text=True, timeout=30, check=False
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout if done.returncode == 0 else None


@functools.lru_cache(maxsize=64)
def declared(key: str) -> Declared:
    """The commit that declared premise ``key``: the newest commit among the lines of its declaration (its
    decorator and function, and the thresholds every premise reads), by ``git blame``."""
    fn = PREMISES[key].measure
    lines, start = inspect.getsourcelines(fn)
    path = Path(inspect.getsourcefile(fn)).resolve()
    text = path.read_text(encoding="utf-8").splitlines()
    first = next(i for i, line in enumerate(text, 1) if line.startswith("# >>> thresholds"))
    last = next(i for i, line in enumerate(text, 1) if line.startswith("# <<< thresholds"))
    blame = _git(
        "blame",
        "--porcelain",
        "-L",
        f"{start},{start + len(lines) - 1}",
        "-L",
        f"{first},{last}",
        "--",
        str(path),
        where=path.parent,
    )
    if blame is None:  # inside a checkout the file is not tracked yet (uncommitted); outside one, unknown
        return Declared(None, _git("rev-parse", "HEAD", where=path.parent) is not None)
    commits, times, dirty = set(), {}, False
    current = None
    for line in blame.splitlines():
        head = line.split(" ")
        if len(head[0]) == 40 and all(c in "0123456789abcdef" for c in head[0]) and len(head) >= 3:
            current = head[0]
            if set(current) == {"0"}:
                dirty = True
            else:
                commits.add(current)
        elif line.startswith("committer-time ") and current is not None:
            times[current] = int(line.split()[1])
    if not commits:
        return Declared(None, dirty)
    newest = max(commits, key=lambda c: times.get(c, 0))
    return Declared(newest, dirty)


def is_ancestor(older: str, newer: str) -> bool | None:
    """Whether commit ``older`` is an ancestor of (or is) ``newer``; None when git cannot tell (a commit unknown
    here)."""
    where = Path(__file__).resolve().parent
    try:
        done = subprocess.run(
            ["git", "-C", str(where), "merge-base", "--is-ancestor", older, newer],
            capture_output=True,
            timeout=30,
            check=False,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return {0: True, 1: False}.get(done.returncode)


def check_declared(
    used: Mapping[str, Iterable[tuple[str | None, bool | None]]],
    declared_of: Callable[[str], Declared] = declared,
    ancestor: Callable[[str, str], bool | None] = is_ancestor,
) -> dict[str, str]:
    """Refuse a premise newer than a run that judges it. ``used``: premise key -> the (commit, dirty) of every run
    its parts read. A premise is newer than a run when its declaring commit is not an ancestor of the run's commit,
    or when its lines are uncommitted and the run came from clean committed code (it cannot have seen them). Returns
    each premise's line for the report (declared at, the runs' commits)."""
    lines, refused = {}, []
    for key, runs in used.items():
        runs = sorted({(c, d) for c, d in runs}, key=lambda x: (x[0] or "", bool(x[1])))
        d = declared_of(key)
        newer = []
        for commit, dirty in runs:
            if commit is None:
                continue
            if d.uncommitted and not dirty or d.commit is not None and ancestor(d.commit, commit) is False:
                newer.append(commit)
        commits = ", ".join(
            dict.fromkeys((c or "unrecorded")[:10] + (" (dirty)" if dd else "") for c, dd in runs)
        )
        if newer:
            refused.append(
                f"{key} (declared at {d.label()}) is newer than runs of {', '.join(sorted({c[:10] for c in newer}))}"
            )
        lines[key] = f"declared at {d.label()}; judged on runs of {commits or 'no recorded commit'}"
    if refused:
        raise SpecbenchError(
            "a premise was declared after the runs that judge it: " + "; ".join(refused),
            "a premise is fixed before its runs: rerun those runs at a commit that holds the premise "
            "(specbench reproduce --redo), or restore the premise as it was when they ran",
        )
    return lines
