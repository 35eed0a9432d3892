"""``early_exit``: the target's first L layers + its final norm + its LM head (self-drafting).

The drafter is the target's own class built with ``L`` layers on the meta device, whose parameters
and buffers are then bound to the target's tensors (no copy). ``layers_key`` names the config field
that holds the layer count (``num_hidden_layers`` for decoder-only models, ``num_decoder_layers``
for T5), set per target family in YAML.
"""

from __future__ import annotations

import copy

import torch

from specbench.drafters.base import ModelDrafter, param_count
from specbench.errors import SpecbenchError
from specbench.models.target import Target


def truncated_model(model: torch.nn.Module, layers: int, layers_key: str) -> torch.nn.Module:
    total = getattr(model.config, layers_key, None)
    if total is None:
        raise SpecbenchError(f"the target's config has no field '{layers_key}'",
                             "set target.layers_key to the config field that holds the layer count")
    if not 1 <= layers < total:
        raise SpecbenchError(f"early_exit layers={layers} is out of range for a {total}-layer target",
                             f"pick layers between 1 and {total - 1}")
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


def build(target: Target, name: str, layers: int, layers_key: str = "num_hidden_layers",
          cost: float | None = None,
          confidence_threshold: float = 0.0) -> ModelDrafter:
    small = truncated_model(target.model, int(layers), layers_key)
    if cost is None:
        cost = param_count(small) / param_count(target.model)
    return ModelDrafter(name, small, target.vocab_size, cost, confidence_threshold)
