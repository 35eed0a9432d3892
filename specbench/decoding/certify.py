"""Certifying greedy outputs lossless up to rounding (pure functions, plus one calibration routine).

In float32 a lossless greedy method reproduces the autoregressive output token for token. In
bfloat16 / float16 a k-token verification forward rounds differently from k one-token steps, so at
a near-tie the two argmaxes can differ and the outputs fork. To tell such a fork from a defect,
every greedy generation records, for each output position, its **decider**: the top token ids of
the forward row that chose the token and their logits, ``[[id1, .., id8], [logit1, .., logit8]]`` (the
top 2 is what a fork between two tokens needs; eight, because bf16 logits can lie five ways within one rounding step).

At the first position ``j`` where a method's output differs from the autoregressive output of the
same query, both runs saw the same prefix, so both rows are the same logits up to rounding: if
every logit differs by at most ``eps`` between the two computations, then for the autoregressive
token ``a`` and the method's token ``b``

    margin_ar = l_ar(a) - l_ar(b) >= 0,   margin_m = l_m(b) - l_m(a) >= 0,
    margin_ar + margin_m = [l_ar(a) - l_m(a)] + [l_m(b) - l_ar(b)] <= 2 * eps.

So the fork is a ``tie`` when that sum is at most ``2 * eps``, and a ``defect`` when it is larger
(or when a margin is negative, or unknown because the other token is not among a row's recorded top
entries: a fork the records cannot explain is never called a tie).

``eps`` is the **tie tolerance** of a (target, dtype): the largest absolute logit difference
between one-token and k-token forwards over the same tokens, measured by :func:`calibrate` on real
prompts and set per dtype in the target's YAML (``tie_tolerance``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass

import torch

TIE = "tie"
DEFECT = "defect"


# Top entries kept per decider row. Two would do for a fork between two tokens, but in bfloat16 the logits
# themselves are rounded (steps of 1/16 near 10, 1/4 near 36), so five or more tokens can lie within one step, and the two a
# fork is between need not be the two that topk lists first.
TOP = 8


def deciders(logits: torch.Tensor, n: int, top: int = TOP) -> list[list[list]]:
    """``[[id1, .., idK], [logit1, .., logitK]]`` (K = ``top``, best first) for the first ``n`` rows of
    ``logits`` ``[rows, V]``: the rows that chose the ``n`` emitted tokens of a greedy round."""
    best = torch.topk(logits[:n].float(), min(top, logits.shape[-1]), dim=-1)
    return [[i, [round(x, 5) for x in v]] for i, v in zip(best.indices.tolist(), best.values.tolist())]


def first_divergence(a: Sequence[int], b: Sequence[int]) -> int | None:
    """The first position where two outputs differ (one ending earlier counts there); None if equal."""
    for j, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return j
    return None if len(a) == len(b) else min(len(a), len(b))


def logit_of(decider: Sequence, token: int) -> float | None:
    """The logit a decider row gives ``token``, if ``token`` is among the row's recorded top entries."""
    ids, values = decider
    for i, v in zip(ids, values):
        if int(i) == token:
            return float(v)
    return None


@dataclass(frozen=True)
class Fork:
    """The first divergence of a method's output from the autoregressive output of the same query."""

    position: int
    base_token: int | None  # the autoregressive output's token there (None: that output had ended)
    token: int | None  # the method's token there (None: the method's output had ended)
    base_margin: float | None  # l_ar(base_token) - l_ar(token) in the autoregressive run (None: unknown)
    margin: float | None  # l_m(token) - l_m(base_token) in the method's run
    verdict: str  # TIE or DEFECT

    def as_dict(self) -> dict:
        return asdict(self)


def _margin(decider, mine: int | None, other: int | None) -> float | None:
    if decider is None or mine is None or other is None:
        return None
    a, b = logit_of(decider, mine), logit_of(decider, other)
    return None if a is None or b is None else a - b


def classify(
    base_ids: Sequence[int], base_deciders, ids: Sequence[int], method_deciders, tolerance: float
) -> Fork | None:
    """The fork between two greedy outputs of the same prompt (None when they are identical).

    A fork where one output simply ended (an EOS or the length limit) before the other differs at
    the EOS token itself, which both runs recorded. Missing deciders (a record written without them)
    make the margins unknown, so the fork is a defect: nothing certifies it.
    """
    j = first_divergence(base_ids, ids)
    if j is None:
        return None
    a = int(base_ids[j]) if j < len(base_ids) else None
    b = int(ids[j]) if j < len(ids) else None
    base_row = base_deciders[j] if base_deciders and j < len(base_deciders) else None
    row = method_deciders[j] if method_deciders and j < len(method_deciders) else None
    base_margin, margin = _margin(base_row, a, b), _margin(row, b, a)
    tie = (
        base_margin is not None
        and margin is not None
        and base_margin >= 0
        and margin >= 0
        and base_margin + margin <= 2 * tolerance
    )
    return Fork(
        position=j,
        base_token=a,
        token=b,
        base_margin=base_margin,
        margin=margin,
        verdict=TIE if tie else DEFECT,
    )


# Used for a target whose YAML sets no ``tie_tolerance`` for its dtype: SmolLM2-135M's measured values
# (``calibrate``: float32 5.4e-5, bfloat16 0.86 over 384 positions of 8 prompts, 5-token chunks), rounded up.
# For another target they are a guess: calibrate it (``specbench profile``) and set its ``tie_tolerance``.
DEFAULT_TOLERANCE = {"float32": 1e-4, "bfloat16": 1.0, "float16": 0.25}


def tolerance_for(tolerances, dtype: str, default: float | None = None) -> float:
    """The tie tolerance of ``dtype`` from a target config's ``tie_tolerance`` mapping."""
    table = dict(tolerances or {})
    if dtype in table and table[dtype] is not None:
        return float(table[dtype])
    if default is not None:
        return float(default)
    raise KeyError(dtype)


@torch.inference_mode()
def calibrate(target, prompts: Sequence[Sequence[int]], new_tokens: int = 32, chunk: int = 5) -> dict:
    """Measure how much a ``chunk``-token forward's logits differ from one-token steps over the same tokens.

    For each prompt: ``new_tokens`` greedy one-token steps (``target.score([])``) give the tokens and
    their rows; then, from a fresh prefill, the same tokens are scored ``chunk`` at a time and the rows
    at the same positions compared. Returns ``max_abs`` (the largest |logit difference| over every
    vocabulary entry and position: the tie tolerance), ``p999_abs`` and ``mean_abs`` of the per-row
    maxima, ``argmax_agree`` / ``positions`` (how often the chunked argmax equals the stepwise one),
    and ``max_logit`` (the largest |logit| seen, for scale).
    """
    row_max: list[float] = []
    agree = positions = 0
    max_logit = 0.0
    for prompt in prompts:
        target.prefill(list(prompt))
        steps, tokens = [], []
        for _ in range(new_tokens):
            row = target.score([]).logits[0].float()
            tok = int(torch.argmax(row))
            steps.append(row)
            tokens.append(tok)
            target.commit([tok])
        target.prefill(list(prompt))
        # score(draft) feeds [last committed, *draft]: the rows predict the tokens after each fed one
        fed = 0
        while fed < len(tokens):
            draft = tokens[fed : fed + chunk - 1]
            rows = target.score(draft).logits.float()
            for i in range(min(len(draft) + 1, len(tokens) - fed)):
                diff = float((rows[i] - steps[fed + i]).abs().max())
                row_max.append(diff)
                agree += int(torch.argmax(rows[i])) == tokens[fed + i]
                positions += 1
                max_logit = max(max_logit, float(steps[fed + i].abs().max()))
            commit = tokens[fed : fed + len(draft) + 1]
            target.commit(commit)
            fed += len(commit)
    ordered = sorted(row_max)
    pick = ordered[min(len(ordered) - 1, int(0.999 * len(ordered)))] if ordered else float("nan")
    return {
        "max_abs": max(row_max) if row_max else float("nan"),
        "p999_abs": pick,
        "mean_abs": sum(row_max) / len(row_max) if row_max else float("nan"),
        "argmax_agree": agree,
        "positions": positions,
        "max_logit": max_logit,
        "chunk": chunk,
        "new_tokens": new_tokens,
        "prompts": len(prompts),
    }
