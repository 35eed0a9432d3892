"""The tests' call of the one decode loop over several prompts (``engine.decode_rows``): a player may be a drafter,
which then plays alone (a ``Fixed`` selector over it and the autoregressive arm), or a ``Player``."""

from __future__ import annotations

from specbench.decoding.drafter import AUTOREGRESSIVE, AutoregressiveArm
from specbench.decoding.engine import Job, Player, decode_rows
from specbench.selection import Fixed


def player(p) -> Player:
    if isinstance(p, Player):
        return p
    pool = (
        {AUTOREGRESSIVE: p} if p.name == AUTOREGRESSIVE else {AUTOREGRESSIVE: AutoregressiveArm(), p.name: p}
    )
    return Player(Fixed(list(pool), p.name), pool)


def decode_batch(target, players, prompts, spec, rng, budget=None, rows=None, verifier=None, limits=None):
    """Every prompt decoded by its player, at most ``rows`` at once (None: all of them), the batch budget ``budget``
    cutting the drafts when given; ``verifier``: one made for the target beforehand (tests that decode many batches)."""
    width = len(prompts) if rows is None else rows
    limits = limits or [None] * len(prompts)
    jobs = [Job(player(p), list(prompt), lim) for p, prompt, lim in zip(players, prompts, limits)]
    return decode_rows(target, jobs, spec, rng, width=width, budget=budget, verifier=verifier)
