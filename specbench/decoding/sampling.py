"""The decoding settings (``decoding.*``: ``SamplingParams``, ``Limits``, each field's rule declared on it) and turning
logits into the distributions that drafting and verification use (pure functions)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated

import torch

from specbench.validate import COUNT, Rule, boolean, check_arguments, integer, list_of, number

# The smallest positive temperature: logits are divided by it in float32, and below about 1e-38 a
# logit of order 1 divided by it overflows to inf (softmax then gives nan). Temperatures between 0
# and this are refused rather than silently treated as greedy: 0 is the way to ask for greedy.
MIN_TEMPERATURE = 1e-6

TEMPERATURE = Rule(
    lambda v: number(0).ok(v) and (v == 0 or v >= MIN_TEMPERATURE),
    f"a finite number >= 0: 0 (greedy) or at least {MIN_TEMPERATURE:g}",
    note=f" (below {MIN_TEMPERATURE:g} the scaled logits overflow float32)",
)


ACCEPTANCE = ("full", "onehot", "strict", "block")  # decoding/acceptance.py's rules
ACCEPTANCE_RULE = Rule(
    lambda v: v in ACCEPTANCE,
    f"one of {', '.join(ACCEPTANCE)}",
    note=" (full: the p/q rule; onehot: drafts judged as argmax; strict: equal to the target's sample; block: "
    "block verification)",
)


@dataclass(frozen=True)
class SamplingParams:
    """``temperature == 0`` means greedy decoding; top-k/top-p apply to sampling only.

    A positive temperature must be at least :data:`MIN_TEMPERATURE` (1e-6): a smaller one overflows
    float32 when the logits are divided by it, so it is refused (``SpecbenchError``), as every field whose rule
    (declared on it, the config's ``decoding.<field>`` too) a value breaks.
    """

    temperature: Annotated[float, TEMPERATURE] = 0.0
    top_k: Annotated[int, integer(0, note=" (0: off)")] = 0
    top_p: Annotated[float, number(0, 1, low_open=True)] = 1.0
    # the lossless rule a sampled chain draft is verified by (decoding/acceptance.py); greedy decoding ignores it
    acceptance: Annotated[str, ACCEPTANCE_RULE] = "full"

    def __post_init__(self):
        check_arguments(SamplingParams, vars(self), "decoding")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


@dataclass(frozen=True)
class Limits:
    """How long a generation runs and how many tokens a round drafts at most (its drafter's own length may be less);
    a value its field's rule refuses is a ``SpecbenchError`` (2.9 must not run as 2)."""

    max_new_tokens: Annotated[int, COUNT] = 128
    draft_length: Annotated[int, integer(1, note=" (tokens drafted per round)")] = 4

    def __post_init__(self):
        check_arguments(Limits, vars(self), "decoding")


@dataclass(frozen=True, kw_only=True)
class SpecOptions:
    """decoding.*'s keys beside SamplingParams' and Limits' fields (DecodeSpec, built from the same section): the eos
    ids and the context fit of the spec the session builds from it, and eval's batch size."""

    extra_eos_ids: Annotated[list[int] | None, list_of(integer(0), null=True)]
    fit_context: Annotated[bool, boolean()]
    # eval only (pipelines/waves.py): queries decoded together, one target forward a round for all of them
    batch_size: Annotated[int, integer(1, note=" (queries decoded together; 1: one at a time)")]
    # eval at batch_size > 1: the queries a method decodes in one go, finished rows refilled (null: 4 x batch_size)
    batch_wave: Annotated[int | None, integer(1, null=True, note=" (queries a method decodes in one go)")] = (
        None
    )


DECODING = (SamplingParams, Limits, SpecOptions)  # the classes that declare decoding.*


def logits_to_probs(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """The distribution a token is drawn from: temperature, then top-k, then top-p (nucleus).

    Under greedy decoding nothing is sampled; the plain softmax (temperature 1) is returned so that
    alignment rewards such as Block Divergence stay defined. ``params`` holds a temperature of 0 or
    at least :data:`MIN_TEMPERATURE` (``SamplingParams`` refuses the rest), so dividing in float32
    stays finite.
    """
    logits = logits.float()
    if params.greedy:
        return torch.softmax(logits, dim=-1)
    logits = logits / params.temperature
    if params.top_k and params.top_k < logits.shape[-1]:
        kth = torch.topk(logits, params.top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    probs = torch.softmax(logits, dim=-1)
    if params.top_p < 1.0:
        sorted_p, order = torch.sort(probs, dim=-1, descending=True)
        mass_before = torch.cumsum(sorted_p, dim=-1) - sorted_p
        drop_sorted = mass_before >= params.top_p  # the first token is always kept
        drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
        probs = probs.masked_fill(drop, 0.0)
        probs = probs / probs.sum(dim=-1, keepdim=True)
    return probs


def pick(probs_or_logits: torch.Tensor, params: SamplingParams, rng: torch.Generator) -> int:
    """Greedy: argmax of the row. Sampling: one draw from the (already processed) probabilities."""
    if params.greedy:
        return int(torch.argmax(probs_or_logits, dim=-1))
    return int(torch.multinomial(probs_or_logits, 1, generator=rng))
