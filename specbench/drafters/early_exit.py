"""``early_exit``: the target's first L layers + its final norm + its LM head (self-drafting).

The drafter is the target's own class built with ``L`` layers on the meta device, whose parameters
and buffers are then bound to the target's tensors (no copy). ``layers_key`` names the config field
that holds the layer count (``num_hidden_layers`` for decoder-only models, ``num_decoder_layers``
for T5), set per target family in YAML.

Full-information feedback: the target's verification forward passes through layer L, so the
drafter's distribution at every verified position is ``head(norm(h_L) * head_scale)`` with the
target's own final norm (``final_norm``, a module path in the target YAML) and LM head
(``head_scale``: 1 for Llama-style models, ``d_model ** -0.5`` for T5 with tied embeddings).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Annotated

import torch

from specbench.decoding.drafter import ObservationGroup, Verification
from specbench.decoding.sampling import logits_to_probs
from specbench.decoding.verify import block_divergence
from specbench.drafters.base import Confidence, LayersKey, ModelDrafter, TreeDraft, param_count, with_tree
from specbench.errors import SpecbenchError
from specbench.models.cache import fit_vocab
from specbench.models.target import Target
from specbench.validate import COUNT, number, text


@dataclass(frozen=True)
class ExitHead:
    """The target's own read-out that an exit drafts through: its final ``norm``, its ``lm_head``, the ``scale``
    between them (``head_scale``: 1 for Llama-style models, ``d_model ** -0.5`` for T5 with tied embeddings) and the
    ``vocab_size`` the logits are cut or padded to."""

    norm: torch.nn.Module
    lm_head: torch.nn.Module
    vocab_size: int
    scale: float = 1.0

    @torch.inference_mode()
    def head_input(self, states: torch.Tensor) -> torch.Tensor:
        """``[n, H]`` states -> the LM head's input (norm, scale)."""
        x = self.norm(states)
        return x * self.scale if self.scale != 1.0 else x

    @torch.inference_mode()
    def logits(self, x: torch.Tensor) -> torch.Tensor:
        logits = self.lm_head(x)
        if logits.shape[-1] != self.vocab_size:
            logits = fit_vocab(logits, self.vocab_size)
        return logits.float()


class EarlyExitDrafter(ModelDrafter):
    """A ``ModelDrafter`` over the target's first ``exit_layer`` layers that can also read its
    distribution off the target's own hidden states (``logits_from_hidden``).

    Its layers are the target's, so it shares the target's encoder (encoder-decoder targets). When
    the selector asks for side observations it watches every verification forward (``state_layers``)
    and, when not played, returns its Block Divergence at the drafted positions (``observe``).
    """

    shares_encoder = True

    def __init__(
        self,
        name: str,
        model: torch.nn.Module,
        cost: float,
        exit_layer: int,
        read_out: ExitHead,
        confidence_threshold: float = 0.0,
    ):
        super().__init__(name, model, read_out.vocab_size, cost, confidence_threshold)
        self.exit_layer = int(exit_layer)
        self.read_out = read_out

    @property
    def head(self) -> torch.nn.Module:
        """The LM head (the target's own): exits sharing it can run it once over all their rows."""
        return self.read_out.lm_head

    def head_input(self, states: torch.Tensor) -> torch.Tensor:
        """``[n, H]`` target states after ``exit_layer`` layers -> the LM head's input (norm, scale)."""
        return self.read_out.head_input(states)

    def head_logits(self, x: torch.Tensor) -> torch.Tensor:
        return self.read_out.logits(x)

    def logits_from_hidden(self, states: torch.Tensor) -> torch.Tensor:
        """``[n, H]`` target states after ``exit_layer`` layers -> logits ``[n, V]``."""
        return self.head_logits(self.head_input(states))

    def state_layers(self, side_observations: bool) -> tuple[int, ...]:
        return (self.exit_layer,) if side_observations else ()

    @property
    def group(self) -> ExitGroup:
        """The exits it is observed with: those reading the same LM head."""
        return ExitGroup(self.head)


@dataclass(frozen=True)
class ExitGroup(ObservationGroup):
    """The early exits reading one LM head (the target's own). A member's observation is its Block Divergence at
    the ``k`` drafted positions of a round it did not play (the context is the played draft, which the target
    scored; ``k`` is the denominator); the head runs once over all the members' rows."""

    lm_head: torch.nn.Module

    def observe(self, v: Verification, members) -> dict[str, float]:
        exits = [d for name, d in members.items() if name != v.played]
        return side_observations(v, exits) if v.draft and exits else {}


def side_observations(v: Verification, exits: list[EarlyExitDrafter]) -> dict[str, float]:
    """Block Divergence of each exit in ``exits`` (all sharing one LM head) at the drafted positions.

    The head runs once over all their rows: on CPUs reading its weight is the cost.
    """
    k = len(v.draft)
    x = torch.cat([e.head_input(v.states[e.exit_layer][:k]) for e in exits])
    q = logits_to_probs(exits[0].head_logits(x), v.sampling)
    return {e.name: block_divergence(v.draft, q[i * k : (i + 1) * k], v.p, k) for i, e in enumerate(exits)}


def truncated_model(
    model: torch.nn.Module, layers: int, layers_key: str, who: str = "early_exit layers"
) -> torch.nn.Module:
    """The target's first ``layers`` layers as a model of its own class (its tensors shared); ``who``: the setting
    that asked for them, for the error."""
    total = getattr(model.config, layers_key, None)
    if total is None:
        raise SpecbenchError(
            f"the target's config has no field '{layers_key}'",
            "set target.layers_key to the config field that holds the layer count",
        )
    if not 1 <= layers < total:
        raise SpecbenchError(
            f"{who}={layers} is out of range for a {total}-layer target",
            f"pick layers between 1 and {total - 1}",
        )
    config = copy.deepcopy(model.config)
    setattr(config, layers_key, layers)
    with torch.device("meta"):
        small = type(model)(config)
    source = dict(model.named_parameters(remove_duplicate=False))
    source.update(model.named_buffers(remove_duplicate=False))
    state = {k: source[k] for k in small.state_dict()}
    small.load_state_dict(state, strict=True, assign=True)
    for name, buf in list(small.named_buffers(remove_duplicate=False)):
        if buf.is_meta:  # non-persistent buffers (rotary frequencies) are not in the state dict
            owner, _, attr = name.rpartition(".")
            small.get_submodule(owner).register_buffer(attr, source[name], persistent=False)
    small.generation_config = model.generation_config
    return small.eval()


def build(
    target: Target,
    name: str,
    layers: Annotated[int, COUNT],
    layers_key: LayersKey = "num_hidden_layers",
    confidence_threshold: Confidence = 0.0,
    final_norm: Annotated[str, text()] = "model.norm",
    head_scale: Annotated[float, number(low=0, low_open=True)] = 1.0,
    tree: TreeDraft = None,
) -> EarlyExitDrafter:
    small = truncated_model(target.model, int(layers), layers_key)
    cost = param_count(small) / param_count(target.model)
    try:
        norm = target.model.get_submodule(final_norm)
    except AttributeError:
        raise SpecbenchError(
            f"the target has no module '{final_norm}' (early_exit final_norm)",
            "set target.final_norm to the path of the final norm "
            "(model.norm for Llama-style models, decoder.final_layer_norm for T5)",
        ) from None
    read_out = ExitHead(norm, target.model.get_output_embeddings(), target.vocab_size, float(head_scale))
    return with_tree(
        EarlyExitDrafter(name, small, cost, int(layers), read_out, confidence_threshold), tree, name
    )


# its drafter drafts the rows of a batch in one forward (ModelDrafter.cohort; pipelines/batch_settings.py): chains
build.batches = "chains"
