"""The drafter-selection policy network: an MLP from a query embedding to one logit per arm."""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import nn

from specbench.errors import SpecbenchError


class PolicyNet(nn.Module):
    """MLP ``dim -> hidden[0] -> ... -> n_arms`` (ReLU, then dropout if ``dropout > 0``) giving logits.

    Weights are drawn from ``generator`` (default: a generator seeded 0) with PyTorch's Linear scheme,
    uniform(+-1/sqrt(fan_in)); dropout masks are drawn from the generator passed to ``forward``, so no
    global RNG is read or advanced."""

    def __init__(
        self,
        dim: int,
        n_arms: int,
        hidden: Sequence[int] = (64,),
        dropout: float = 0.0,
        generator: torch.Generator | None = None,
    ):
        super().__init__()
        hidden = tuple(int(h) for h in hidden)
        if int(dim) < 1 or int(n_arms) < 1 or any(h < 1 for h in hidden):
            raise SpecbenchError(
                f"policy net: dim {dim}, n_arms {n_arms}, hidden {list(hidden)} must all be >= 1",
                "set positive layer sizes (policy.hidden, e.g. [64])",
            )
        if not 0.0 <= float(dropout) < 1.0:
            raise SpecbenchError(f"policy net: dropout {dropout} is outside [0, 1)", "set 0 <= dropout < 1")
        self.dim, self.n_arms, self.hidden, self.dropout = int(dim), int(n_arms), hidden, float(dropout)
        sizes = [self.dim, *hidden, self.n_arms]
        self.layers = nn.ModuleList(
            nn.utils.skip_init(nn.Linear, i, o) for i, o in zip(sizes[:-1], sizes[1:])
        )
        g = generator if generator is not None else torch.Generator().manual_seed(0)
        with torch.no_grad():
            for layer in self.layers:
                bound = 1.0 / math.sqrt(layer.in_features)
                for p in (layer.weight, layer.bias):
                    p.copy_(torch.rand(p.shape, generator=g) * 2 * bound - bound)

    def forward(self, x: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
        """Logits ``[..., n_arms]``. In training mode with dropout, ``generator`` draws the masks (required)."""
        drop = self.training and self.dropout > 0
        if drop and generator is None:
            raise ValueError("PolicyNet.forward: pass a torch.Generator for dropout in training mode")
        for layer in self.layers[:-1]:
            x = torch.relu(layer(x))
            if drop:
                keep = torch.rand(x.shape, generator=generator) >= self.dropout
                x = x * keep / (1.0 - self.dropout)
        return self.layers[-1](x)

    def probs(self, x: torch.Tensor) -> torch.Tensor:
        """Arm probabilities ``softmax(logits)`` (no gradient)."""
        with torch.no_grad():
            return torch.softmax(self.forward(x), dim=-1)
