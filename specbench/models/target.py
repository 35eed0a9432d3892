"""The target model: the distribution speculative decoding must reproduce.

State between rounds: ``tokens`` is the committed decoder sequence (prompt + output for
decoder-only models, start token + output for encoder-decoder ones). The cache holds every
committed token except the last, which is fed at the head of the next ``score`` call together with
the draft, so one forward yields the k+1 distributions verification needs (the last one is the
bonus position). An autoregressive step is ``score([])``.
"""

from __future__ import annotations

import torch

from specbench.models.cache import CachedLM
from specbench.models.loading import LoadedModel


class Target:
    def __init__(self, loaded: LoadedModel):
        self.loaded = loaded
        self.model = loaded.model
        self.tokenizer = loaded.tokenizer
        self.config = loaded.model.config
        head = self.model.get_output_embeddings().weight
        self.vocab_size = int((head() if callable(head) else head).shape[0])  # callable: a dynamic-int8 head
        self.lm = CachedLM(self.model, vocab_size=self.vocab_size)
        self.device = self.lm.device
        self.is_encoder_decoder = self.lm.is_encoder_decoder
        self.tokens: list[int] = []
        self.encoder_ids: list[int] | None = None
        self.calls = 0

    def decoder_start(self, prompt_ids: list[int]) -> tuple[list[int] | None, list[int]]:
        """Split a tokenized prompt into (encoder ids, initial decoder tokens)."""
        if self.is_encoder_decoder:
            start = self.config.decoder_start_token_id
            if start is None:
                start = self.config.pad_token_id
            return list(prompt_ids), [int(start)]
        return None, list(prompt_ids)

    def prefill(self, prompt_ids: list[int]) -> None:
        """Start a query: encode (encoder-decoder) and cache every prompt token but the last."""
        encoder_ids, tokens = self.decoder_start(prompt_ids)
        if not tokens:
            raise ValueError("empty prompt")
        self.lm.reset(encoder_ids)
        self.encoder_ids = encoder_ids
        self.tokens = tokens
        self.calls = 0
        if len(tokens) > 1:
            self.lm.forward(tokens[:-1], last_only=True)

    def score(self, draft: list[int]) -> torch.Tensor:
        """One forward over [last committed token, *draft]; logits ``[len(draft) + 1, V]``."""
        self.calls += 1
        return self.lm.forward(self.tokens[-1:] + list(draft))

    def commit(self, new_tokens: list[int]) -> None:
        """Append the round's output; roll the cache back to the accepted prefix."""
        self.tokens.extend(new_tokens)
        self.lm.keep_common(self.tokens, len(self.tokens) - 1)

    def rollback(self, n_tokens: int) -> None:
        """Forget the last ``n_tokens`` committed tokens (cache cropped to match)."""
        del self.tokens[len(self.tokens) - n_tokens:]
        self.lm.crop(min(len(self.lm.cached), len(self.tokens) - 1))
