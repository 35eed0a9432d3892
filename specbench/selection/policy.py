"""``policy``: the context-aware selector. Before decoding a query it embeds the prompt with the
target (the loop does that, inside the timed region) and lets a trained policy pick one arm for the
whole query (``specbench train-policy`` writes the checkpoint)."""

from __future__ import annotations

from typing import Annotated

import torch

from specbench.errors import SpecbenchError
from specbench.policy import check_compatible, load_checkpoint
from specbench.selection.base import Selector
from specbench.validate import PATH, SEED, boolean, text


class PolicySelector(Selector):
    """One arm per query from ``checkpoint``: the most probable one, or one sampled (``sample``)
    with its own generator (``seed``). ``target``: the run's target model, checked against the one
    the policy was trained for (``conf/selector/policy.yaml`` passes ``target.model``)."""

    context_aware = True

    def __init__(
        self,
        arms: list[str],
        checkpoint: Annotated[str | None, PATH] = None,
        sample: Annotated[bool, boolean()] = False,
        seed: Annotated[int, SEED] = 0,
        target: Annotated[
            str | None, text(null=True)
        ] = None,  # the run's target model, checked against the policy's
    ):
        super().__init__(arms)
        if not checkpoint:
            raise SpecbenchError(
                "selector=policy needs a checkpoint",
                "pass policy.checkpoint=<dir>/policy.pt (written by specbench train-policy)",
            )
        self.policy = load_checkpoint(checkpoint)
        # the arms and the target now; the embedding size at the first embedding
        check_compatible(self.policy, self.arms, self.policy.dim, target)
        self.embedding_pooling = str((self.policy.meta.get("embedding") or {}).get("pooling") or "mean")
        self.sample = bool(sample)
        self.generator = torch.Generator().manual_seed(int(seed))
        self._embedding: torch.Tensor | None = None
        self.arm: str | None = None

    def set_embedding(self, embedding: torch.Tensor) -> None:
        check_compatible(self.policy, self.arms, int(embedding.numel()))
        self._embedding = embedding.detach().to("cpu")

    def reset(self, query=None) -> None:
        if self._embedding is None:
            raise SpecbenchError(
                "the policy selector got no query embedding",
                "run it through specbench.decoding.loop.decode, which embeds each prompt",
            )
        self.arm = self.policy.choose(self._embedding, sample=self.sample, generator=self.generator)
        self._embedding = None

    def select(self) -> str:
        if self.arm is None:
            raise SpecbenchError(
                "the policy selector was asked for an arm before reset(query)",
                "call reset(query) first (decode does)",
            )
        return self.arm
