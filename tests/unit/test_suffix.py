"""The retrieval drafter with memory (``drafters/suffix.py``): continuation trees with empirical frequencies,
the longest match wins, memory per stream (none without a stream), bounded, and its bad settings refused."""

from __future__ import annotations

import pytest

from specbench.decoding.drafter import DecodeContext
from specbench.drafters import build_pool
from specbench.drafters.dynamic_tree import TreeShape
from specbench.drafters.suffix import SuffixDrafter, build, continuation_tree
from specbench.errors import SpecbenchError


def test_continuation_tree_counts_cuts_and_ranks():
    conts = [[1, 2, 3], [1, 2, 4], [1, 5], [7], [1, 2, 3]]
    d = continuation_tree(conts, match=4, min_prob=0.3, shape=TreeShape(2, 10))
    parents = d.parents if d.parents is not None else list(range(-1, len(d.tokens) - 1))
    got = {tuple(d.tokens[a] for a in _path(parents, i)): s for i, s in enumerate(d.scores)}
    assert got == pytest.approx(
        {(1,): 0.8, (1, 2): 0.6, (1, 2, 3): 0.4}
    )  # 7, (1, 5), (1, 2, 4) are rarer than 0.3
    assert d.match == 4 and d.probs is None
    chain = continuation_tree(conts, match=4, min_prob=0.0, shape=None)
    assert chain.tokens == [1, 2, 3] and chain.parents is None  # the most frequent continuation
    capped = continuation_tree(conts, match=4, min_prob=0.0, shape=TreeShape(3, 3))
    assert sorted(capped.scores, reverse=True) == [
        0.8,
        0.6,
        0.4,
    ]  # the 3 most frequent nodes (closed under parents)
    narrow = continuation_tree(conts, match=4, min_prob=0.0, shape=TreeShape(1, 10))
    assert narrow.parents is None and narrow.tokens == [1, 2, 3]  # width 1: one continuation per node


def _path(parents, i):
    out = []
    while i >= 0:
        out.append(i)
        i = parents[i]
    return out[::-1]


def test_longest_match_and_memory_per_stream():
    d = SuffixDrafter("s", tree=TreeShape(3, 12))
    text = [1, 2, 3, 4, 5, 1, 2, 3, 6, 7, 1, 2, 3]
    d.sync(DecodeContext(stream="a"), text)
    first = d.propose(text, 2, None, None)
    assert first.match == 3 and set(first.tokens[:2]) == {4, 6}  # both continuations of "1 2 3", half each
    assert first.scores[:2] == [0.5, 0.5]
    # a new query of stream "a" remembers the first generation; stream "b" and no stream do not
    for stream, remembered in (("a", True), ("b", False), (None, False)):
        d.sync(DecodeContext(stream=stream), [9, 1, 2])
        got = d.propose([9, 1, 2], 3, None, None)
        assert bool(got.tokens) == remembered, stream
        if remembered:
            assert got.tokens[0] == 3 and got.scores[0] == 1.0 and got.match == 2


def test_memory_is_bounded():
    d = SuffixDrafter("s", memory_tokens=10)
    for i in range(5):
        d.sync(DecodeContext(stream="a"), [100 + i] * 6)
    d.sync(DecodeContext(stream="a"), [0])  # archives the last one
    kept = d._memories["a"]
    assert kept.tokens <= 10 and kept.docs[-1] == [104] * 6


def test_no_memory_means_history_free():
    assert SuffixDrafter("s", memory=False).history_free and not SuffixDrafter("s").history_free


@pytest.mark.parametrize(
    "kwargs, words",
    [
        ({"min_ngram": 3, "max_ngram": 2}, "min_ngram"),
        ({"min_prob": 1.5}, "min_prob"),
        ({"tree": {"width": 0, "nodes": 3}}, "tree.width"),
    ],
)
def test_bad_settings_are_refused(kwargs, words):
    """Through a pool config, as a run builds it: the builder's own checks, or the rules its signature declares."""
    with pytest.raises(SpecbenchError, match=words):
        build_pool(None, {"s": {"_target_": "specbench.drafters.suffix.build", **kwargs}})
