"""Prompt lookup: n-gram matching over the encoder input and the decoder tokens."""

from __future__ import annotations

import pytest
import torch

from specbench.decoding.drafter import DecodeContext
from specbench.decoding.sampling import SamplingParams
from specbench.drafters.prompt_lookup import PromptLookup, build, lookup
from specbench.errors import SpecbenchError


def test_lookup_prefers_the_longest_suffix_ngram():
    hay = [1, 2, 3, 9, 8, 2, 3, 7, 6, 1, 2, 3]
    # 3-gram (1, 2, 3) occurs at 0 -> continuation 9, 8, ...; the 2-gram (2, 3) occurs later at 5
    assert lookup(hay, 2, max_ngram=3, min_ngram=1) == [9, 8]
    # capped at 2-grams, the most recent (2, 3) wins
    assert lookup(hay, 2, max_ngram=2, min_ngram=1) == [7, 6]


def test_lookup_takes_the_most_recent_earlier_match():
    hay = [5, 1, 6, 4, 5, 1, 7, 4, 5, 1]
    assert lookup(hay, 1, max_ngram=2, min_ngram=1) == [7]
    # the continuation may run into the suffix itself
    assert lookup(hay, 3, max_ngram=2, min_ngram=1) == [7, 4, 5]


def test_lookup_respects_k_and_the_end_of_the_haystack():
    hay = [4, 0, 1, 2, 3, 4]
    assert lookup(hay, 1, 3, 1) == [0]
    assert lookup(hay, 3, 3, 1) == [0, 1, 2]
    assert lookup(hay, 100, 3, 1) == [0, 1, 2, 3, 4]  # as much as there is


def test_lookup_falls_back_to_shorter_ngrams():
    hay = [8, 3, 1, 2, 9, 3]  # (2, 9, 3) and (9, 3) never occurred before; 3 did, followed by 1
    assert lookup(hay, 2, 3, 1) == [1, 2]
    assert lookup(hay, 2, 3, 2) == []  # min_ngram 2 forbids the unigram match


def test_lookup_no_match_returns_empty():
    assert lookup([1, 2, 3, 4], 3, 3, 1) == []
    assert lookup([7], 3, 3, 1) == []
    assert lookup([], 3, 3, 1) == []


def test_prompt_lookup_searches_encoder_ids_then_tokens():
    drafter = PromptLookup("pl")
    rng = torch.Generator().manual_seed(0)
    drafter.begin(DecodeContext(encoder_ids=[10, 11, 12, 13, 14]))
    d = drafter.propose([0, 12], 2, SamplingParams(), rng)
    assert d.tokens == [13, 14] and d.probs is None
    # the decoder tokens come after the encoder ids, so a match there is more recent
    d = drafter.propose([0, 12, 20, 21, 12], 2, SamplingParams(), rng)
    assert d.tokens == [20, 21]
    # a new query forgets the previous encoder ids
    drafter.begin(DecodeContext())
    assert drafter.propose([0, 12], 2, SamplingParams(), rng).tokens == []
    assert drafter.propose([5, 6, 5], 4, SamplingParams(), rng).tokens == [6, 5]


def test_prompt_lookup_is_a_deterministic_drafter():
    drafter = build(None, "pl")
    assert drafter.deterministic and not drafter.can_generate_alone
    assert drafter.cost == 0.0
    assert (drafter.max_ngram, drafter.min_ngram) == (3, 1)


@pytest.mark.parametrize("min_ngram, max_ngram", [(0, 3), (3, 2), (-1, 1), (2, 1)])
def test_bad_ngram_bounds_raise(min_ngram, max_ngram):
    with pytest.raises(SpecbenchError, match="min_ngram"):
        PromptLookup("pl", max_ngram=max_ngram, min_ngram=min_ngram)
    with pytest.raises(SpecbenchError, match="min_ngram"):
        build(None, "pl", max_ngram=max_ngram, min_ngram=min_ngram)
