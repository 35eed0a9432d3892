"""What a decode call is asked (``DecodeSpec``) and what it returns (``Generation``), shared by the engine
(``engine.py``), its batch of one (``loop.decode``) and the pipelines."""

from __future__ import annotations

from dataclasses import dataclass, field

from specbench.decoding.cascade import Cascade
from specbench.decoding.sampling import Limits, SamplingParams
from specbench.records import Round
from specbench.timing import Clock

__all__ = ["DecodeSpec", "Generation", "Limits"]


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
