"""The one decode loop. Every method, autoregressive decoding included, runs through ``decode``.

The loop holds no drafter-kind-specific code: it speaks the protocol of ``decoding/drafter.py``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import torch

from specbench.decoding.cascade import Cascade
from specbench.decoding.drafter import DecodeContext, Drafter
from specbench.decoding.rounds import Walk, cascade_with_tree, play_round, round_members, tree_label
from specbench.decoding.sampling import Limits, SamplingParams
from specbench.errors import SpecbenchError
from specbench.models.cache import check_tree_attention
from specbench.models.target import Target
from specbench.records import Round
from specbench.selection.base import Selector
from specbench.timing import Clock

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


@dataclass
class Generation:
    tokens: list[int]
    rounds: list[Round] = field(default_factory=list)
    target_calls: int = 0
    seconds: float = 0.0
    stop: str = "length"  # "eos", "length" or "context" (decoding.fit_context: cut at the context's end)
    # Greedy lossless decoding: per output position, the top-2 ids and logits of the row that chose it
    # (``certify.deciders``), so a fork from the autoregressive output can be judged a tie or a defect.
    deciders: list[list[float]] | None = None
    prompt_sha: str | None = None  # a fingerprint of the prompt ids (set by the session that decoded it)

    @property
    def drafted(self) -> int:
        return sum(r.drafted for r in self.rounds)

    @property
    def accepted(self) -> int:
        return sum(r.accepted for r in self.rounds)

    @property
    def deferred(self) -> int:
        return sum(r.deferred for r in self.rounds)

    @property
    def switches(self) -> int:
        return sum(r.switched for r in self.rounds)


def listeners(pool: Mapping[str, Drafter], selector: Selector) -> tuple[dict[str, Drafter], tuple[int, ...]]:
    """The drafters that watch every verification forward, and the union of the target layers they want.

    Only drafters the selector can play (``selector.playable``), or observe under full information,
    listen: a drafter that will never draft in this generation must not make the target return hidden
    states (that would be drafter work inside another method's timed region, the baseline's included).
    """
    side = selector.full_information
    reachable = set(pool) if side else set(selector.playable())
    watching = {name: d for name, d in pool.items() if name in reachable and d.state_layers(side)}
    layers = sorted({layer for d in watching.values() for layer in d.state_layers(side)})
    return watching, tuple(layers)


@dataclass(frozen=True)
class DecodeSpec:
    """How a decode call runs, apart from who plays and on what: the sampling law, the limits (new tokens,
    draft length), the EOS ids, the clock that times it, and the verification rule (``cascade``: a deferral
    rule verifying against its mixture instead of the target, lossy; ``None`` or rule ``none``: lossless)."""

    sampling: SamplingParams = field(default_factory=SamplingParams)
    limits: Limits = field(default_factory=Limits)
    eos_ids: frozenset[int] = frozenset()
    clock: Clock = field(default_factory=Clock)
    cascade: Cascade | None = None
    # the generations this decode continues (an eval method): ``DecodeContext.stream``
    stream: str | None = None


def check_trees(selector: Selector, target: Target, method: str | None = None) -> None:
    """Refuse, before any decoding, a selector that verifies token trees on an encoder-decoder target, or on a model
    whose attention ignores a custom 4D mask (``check_tree_attention``)."""
    if selector.trees and target.is_encoder_decoder:
        what = f"method '{method}'" if method else type(selector).__name__
        raise SpecbenchError(
            f"{what} verifies several drafts as a token tree, which needs a decoder-only target; "
            f"this one is encoder-decoder ({type(target.model).__name__} places decoder tokens by "
            "cache position, not by position_ids)",
            "use fixed:<drafter> or a bandit selector (one draft a round) with this target",
        )
    if selector.trees:
        check_tree_attention(target.model, f"method '{method}'" if method else type(selector).__name__)


def decode(
    target: Target,
    pool: Mapping[str, Drafter],
    selector: Selector,
    prompt_ids: list[int],
    spec: DecodeSpec,
    rng: torch.Generator,
    query=None,
) -> Generation:
    """Generate up to ``spec.limits.max_new_tokens`` tokens for one prompt (batch size 1), drawing every random
    choice from ``rng``.

    Each round: the selector picks an arm; its drafter catches up with the committed tokens
    (``sync``: on its first use in the query this includes its per-query setup, and when the
    previous round used another arm the catch-up is the switching cost; both are timed as
    ``t_switch``) and proposes up to ``draft_length`` tokens; one target forward scores them;
    verification keeps the accepted prefix plus one target token; the cache is rolled back to that;
    drafters that watch the target (``state_layers``) see the forward (``observe``); the selector
    gets feedback, and side observations of unplayed arms when it asks for them.
    Only the arm a round plays is touched: an autoregressive generation does no drafter work.
    Output stops after an EOS (kept, even inside an accepted draft) or at ``max_new_tokens``.
    ``seconds`` covers everything from the prefill on: one synchronising clock reading at each end
    (``clock.boundary``); per-phase times come from ``clock.now`` (synchronising on CUDA only with
    ``timing.phases``).
    With ``spec.cascade`` set, every drafted position counts as deferred under lossless verification too.
    """
    sampling, limits, cascade = spec.sampling, spec.limits, spec.cascade
    check_trees(selector, target)
    if selector.trees and cascade is not None and not cascade.lossless:
        raise cascade_with_tree(type(selector).__name__)
    watching, layers = listeners(pool, selector)
    clock = spec.clock
    t_start = clock.boundary()
    # A context-aware selector reads the query's embedding, taken from the prefill (timed).
    prefilled = target.prefill(prompt_ids, embedding=selector.embedding_pooling, layers=layers)
    t_reset = clock.now()
    if prefilled.embedding is not None:
        selector.set_embedding(prefilled.embedding)
    selector.reset(query)
    t_reset = clock.now() - t_reset  # the selector's per-query work, counted in the first round's t_select
    ctx = DecodeContext(
        encoder_ids=target.encoder_ids,
        encoder_outputs=target.encoder_outputs,
        side_observations=selector.full_information,
        stream=spec.stream,
    )
    if layers:  # the target's states at the committed positions it has seen (all but the last token)
        ctx.record_states(prefilled.states, rows=len(target.tokens) - 1, start=0)
    certify = sampling.greedy and (cascade is None or cascade.lossless)
    gen = Generation(tokens=[], deciders=[] if certify else None)
    walk = Walk(target, pool, selector, spec, rng, ctx, layers, watching, gen, t_reset)
    while len(gen.tokens) < limits.max_new_tokens and not play_round(walk):
        pass
    gen.target_calls = target.calls
    gen.seconds = clock.boundary() - t_start
    return gen
