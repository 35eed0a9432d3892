"""``prompt_lookup``: copy the continuation of the latest earlier occurrence of the last n-gram.

No model: the haystack is the encoder input (encoder-decoder targets) followed by the decoder
tokens so far. Drafts are deterministic (``probs = None``, one-hot for verification).
"""

from __future__ import annotations

from specbench.drafters.base import Draft, Drafter, NGram
from specbench.errors import SpecbenchError


def lookup(haystack: list[int], k: int, max_ngram: int, min_ngram: int) -> list[int]:
    """Up to ``k`` tokens following the most recent earlier match of the longest suffix n-gram."""
    return lookup_match(haystack, k, max_ngram, min_ngram)[0]


def lookup_match(haystack: list[int], k: int, max_ngram: int, min_ngram: int) -> tuple[list[int], int]:
    """``lookup``'s draft and the length of the suffix n-gram it matched (0: no match)."""
    n_tokens = len(haystack)
    for n in range(min(max_ngram, n_tokens - 1), min_ngram - 1, -1):
        pattern = haystack[n_tokens - n :]
        for start in range(n_tokens - n - 1, -1, -1):
            if haystack[start : start + n] == pattern:
                cont = haystack[start + n : start + n + k]
                if cont:
                    return cont, n
    return [], 0


class PromptLookup(Drafter):
    deterministic = True

    def __init__(self, name: str, max_ngram: int = 3, min_ngram: int = 1, cost: float = 0.0):
        if not 1 <= min_ngram <= max_ngram:
            raise SpecbenchError(
                f"prompt_lookup needs 1 <= min_ngram <= max_ngram, got {min_ngram}, {max_ngram}",
                "set drafter min_ngram/max_ngram accordingly (defaults 1 and 3)",
            )
        self.name = name
        self.max_ngram = max_ngram
        self.min_ngram = min_ngram
        self.cost = cost
        self._prefix: list[int] = []

    def begin(self, query):
        self._prefix = list(query.encoder_ids or [])

    def for_row(self) -> PromptLookup:
        row = PromptLookup(self.name, self.max_ngram, self.min_ngram, self.cost)
        row.draft_length = self.draft_length
        return row

    def propose(self, tokens, k, sampling, rng, eos_ids=frozenset(), stop_below=0.0) -> Draft:
        # deterministic: its q is one-hot (largest probability 1), so a sequential cascade never stops it
        draft, n = lookup_match(self._prefix + tokens, k, self.max_ngram, self.min_ngram)
        return Draft(tokens=draft, probs=None, match=n)


def build(target, name: str, max_ngram: NGram = 3, min_ngram: NGram = 1) -> PromptLookup:
    return PromptLookup(name, max_ngram=max_ngram, min_ngram=min_ngram)


build.batches = True  # its drafter drafts per row of a batch (Drafter.for_row; pipelines/batch_settings.py)
