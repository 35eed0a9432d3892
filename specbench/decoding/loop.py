"""``decode``: one prompt through the one decode loop (``engine.py``), its batch of one. Every method, autoregressive
decoding included, runs through it; the loop holds no drafter-kind-specific code: it speaks the protocol of
``decoding/drafter.py``.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

from specbench.decoding.drafter import Drafter
from specbench.decoding.engine import Job, Player, check_trees, decode_rows, listeners
from specbench.decoding.generation import DecodeSpec, Generation, Limits
from specbench.decoding.rounds import cascade_with_tree, round_members, tree_label
from specbench.models.target import Target
from specbench.selection.base import Selector

__all__ = [
    "DecodeSpec",
    "Generation",
    "Limits",
    "cascade_with_tree",
    "check_trees",
    "decode",
    "listeners",
    "round_members",
    "tree_label",
]


def decode(
    target: Target,
    pool: Mapping[str, Drafter],
    selector: Selector,
    prompt_ids: list[int],
    spec: DecodeSpec,
    rng: torch.Generator,
    query=None,
) -> Generation:
    """Generate up to ``spec.limits.max_new_tokens`` tokens for one prompt (the engine's batch of one,
    ``engine.decode_rows``), drawing every random choice from ``rng``.

    Each round: the selector picks an arm; its drafter catches up with the committed tokens
    (``sync``: on its first use in the query this includes its per-query setup, and when the
    previous round used another arm the catch-up is the switching cost; both are timed as
    ``t_switch``) and proposes up to ``draft_length`` tokens; one target forward scores them;
    verification keeps the accepted prefix plus one target token; the cache keeps that;
    drafters that watch the target (``state_layers``) see the forward (``observe``); the selector
    gets feedback, and side observations of unplayed arms when it asks for them.
    Only the arm a round plays is touched: an autoregressive generation does no drafter work.
    Output stops after an EOS (kept, even inside an accepted draft) or at ``max_new_tokens``.
    ``seconds`` covers everything from the prefill on: one synchronising clock reading at each end
    (``clock.boundary``); per-phase times come from ``clock.now`` (synchronising on CUDA only with
    ``timing.phases``).
    With ``spec.cascade`` set, every drafted position counts as deferred under lossless verification too.
    """
    job = Job(Player(selector, pool), list(prompt_ids), query=query)
    return decode_rows(target, [job], spec, rng).generations[0]
