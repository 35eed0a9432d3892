"""``suffix``: a retrieval drafter with memory (after SuffixDecoding and SAM-Decoding; written here).

No model. Its haystack is the prompt and the output so far and, with ``memory``, the earlier generations of the
same stream (a method of an eval run: ``DecodeContext.stream``; bounded by ``memory_tokens``, oldest dropped
first; cleared when the process ends; a decode without a stream, such as a warm-up or a trace, neither reads nor
writes it). Each round it finds the longest suffix of the text (at most ``max_ngram`` tokens) that occurred
before, gathers the continuations of every occurrence with that match length, and merges them into a trie whose
nodes carry their empirical frequency (occurrences through the node / occurrences): nodes below ``min_prob`` are
cut, each node keeps its ``tree.width`` most frequent continuations, at most ``tree.nodes`` are kept (most frequent first; a node is never more frequent than its parent, so the
kept set is closed under parents), children ranked by frequency, so its primary path is the most frequent
continuation. With ``tree: null`` the draft is that primary path alone (a chain, as prompt lookup drafts).

Drafts are deterministic (``probs = None``: one-hot ``q`` for verification); ``Draft.match`` is the match length
(what a router reads), ``Draft.scores`` the frequencies (what a cost-model budget calibrates). Prompt lookup stays
as it is (``prompt_lookup.py``), the baseline this drafter is compared with.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from typing import Annotated

from specbench.decoding.drafter import DecodeContext, Draft, Drafter
from specbench.drafters.base import NGram, TreeDraft
from specbench.drafters.dynamic_tree import TreeShape, tree_shape
from specbench.errors import SpecbenchError
from specbench.models.cache import check_tree_attention
from specbench.validate import COUNT, boolean, number

KEY_LENGTHS = (3, 2, 1)  # the n-grams indexed: a match starts from the longest indexed key the text ends with
MAX_OCCURRENCES = 256  # the most recent occurrences of a key examined per round


DEFAULT_TREE = TreeShape(3, 12)  # a retrieval drafter's tree when its config gives none


@dataclass
class _Index:
    """Documents (token lists) and where each indexed n-gram ends in them: ``{ngram: [(doc, end), ...]}``."""

    docs: list[list[int]] = field(default_factory=list)
    where: dict[tuple[int, ...], list[tuple[int, int]]] = field(default_factory=lambda: defaultdict(list))
    tokens: int = 0

    def add(self, doc: list[int], start: int = 0, doc_id: int | None = None) -> int:
        """Index ``doc``'s n-grams ending at positions ``start + 1 ..`` (a new document unless ``doc_id``)."""
        if doc_id is None:
            doc_id = len(self.docs)
            self.docs.append(doc)
            self.tokens += len(doc)
        for end in range(max(start, 0) + 1, len(doc) + 1):
            for n in KEY_LENGTHS:
                if end >= n:
                    self.where[tuple(doc[end - n : end])].append((doc_id, end))
        return doc_id


class SuffixDrafter(Drafter):
    deterministic = True
    scored = True  # frequencies as scores

    def __init__(
        self,
        name: str,
        max_ngram: int = 32,
        min_ngram: int = 1,
        min_prob: float = 0.1,
        tree: TreeShape | None = DEFAULT_TREE,
        memory: bool = True,
        memory_tokens: int = 100_000,
        cost: float = 0.0,
    ):
        self.name, self.cost = name, float(cost)
        self.max_ngram, self.min_ngram, self.min_prob = max_ngram, min_ngram, min_prob
        self.tree = tree
        self.memory, self.memory_tokens = memory, memory_tokens
        self.history_free = not memory  # its drafts depend on earlier generations of the stream
        self._memories: dict[str, _Index] = {}
        self._live: list[int] = []
        self._live_index = _Index()
        self._prefix: list[int] = []
        self._stream: str | None = None

    # -- memory ----------------------------------------------------------------------------------
    def begin(self, query: DecodeContext) -> None:
        self._archive()
        self._prefix = list(query.encoder_ids or [])
        self._stream = getattr(query, "stream", None) if self.memory else None
        self._live, self._live_index = [], _Index()

    def _archive(self) -> None:
        """Keep the text of the generation that just ended in its stream's memory (oldest dropped past the bound)."""
        if self._stream is None or not self._live:
            return
        mem = self._memories.setdefault(self._stream, _Index())
        mem.add(list(self._live))
        if mem.tokens > self.memory_tokens:
            kept, total = [], 0
            for doc in reversed(mem.docs):
                if total + len(doc) > self.memory_tokens:
                    break
                kept.append(doc)
                total += len(doc)
            fresh = _Index()
            for doc in reversed(kept):
                fresh.add(doc)
            self._memories[self._stream] = fresh

    def for_row(self) -> SuffixDrafter:
        """A row's drafter: the same settings, its own live text, and this drafter's memory (shared: a row's output
        joins it when the row finishes, ``finish``)."""
        row = SuffixDrafter(
            self.name,
            self.max_ngram,
            self.min_ngram,
            self.min_prob,
            self.tree,
            self.memory,
            self.memory_tokens,
        )
        row.cost, row.draft_length, row._memories = self.cost, self.draft_length, self._memories
        return row

    def finish(self) -> None:
        self._archive()
        self._live, self._live_index = [], _Index()

    def forget(self) -> None:
        """Clear every stream's memory."""
        self._memories.clear()

    def catch_up(self, tokens: list[int]) -> None:
        text = self._prefix + list(tokens)
        live = self._live
        if text[: len(live)] != live:  # not an extension (a new text): index it afresh
            self._live, self._live_index = [], _Index()
            live = self._live
        start = len(live)
        live.extend(text[start:])
        if not self._live_index.docs:
            self._live_index.docs.append(live)
            self._live_index.tokens = 0
        self._live_index.add(live, start=start, doc_id=0)

    # -- drafting --------------------------------------------------------------------------------
    def _occurrences(self) -> tuple[list[tuple[list[int], int]], int]:
        """``([(doc, end)], match length)``: the occurrences of the longest earlier match of the text's suffix."""
        live = self._live
        mem = self._memories.get(self._stream) if self._stream is not None else None
        for n in KEY_LENGTHS:
            if n < self.min_ngram or len(live) < n:
                continue
            key = tuple(live[-n:])
            found = [
                (live, end)
                for d, end in self._live_index.where.get(key, ())[-MAX_OCCURRENCES:]
                if end < len(live)
            ]
            if mem is not None:
                found += [(mem.docs[d], end) for d, end in mem.where.get(key, ())[-MAX_OCCURRENCES:]]
            if found:
                break
        else:
            return [], 0
        lengths = [self._match(doc, end) for doc, end in found]
        best = max(lengths)
        if best < self.min_ngram:
            return [], 0
        return [occ for occ, m in zip(found, lengths) if m == best], best

    def _match(self, doc: list[int], end: int) -> int:
        live = self._live
        n = 0
        while n < self.max_ngram and n < end and n < len(live) and doc[end - 1 - n] == live[-1 - n]:
            n += 1
        return n

    def propose(self, tokens, k, sampling, rng, eos_ids=frozenset(), stop_below=0.0) -> Draft:
        if len(self._live) != len(self._prefix) + len(tokens):
            self.catch_up(tokens)  # a direct call (the loop syncs first)
        found, match = self._occurrences()
        if not found or k < 1:
            return Draft([], None, match=0)
        return continuation_tree(
            [doc[end : end + k] for doc, end in found], match, self.min_prob, self.tree, eos_ids
        )


def continuation_tree(
    continuations: list[list[int]], match: int, min_prob: float, shape: TreeShape | None, eos_ids=frozenset()
) -> Draft:
    """The trie of ``continuations`` as a draft: frequencies as scores, nodes below ``min_prob`` cut, at most
    ``shape.nodes`` kept (a chain of the most frequent continuation when ``shape`` is None), children by frequency."""
    total = len(continuations)
    counts: dict[tuple[int, ...], int] = defaultdict(int)
    for cont in continuations:
        for d in range(len(cont)):
            counts[tuple(cont[: d + 1])] += 1
            if cont[d] in eos_ids:
                break
    kept = {path: c for path, c in counts.items() if c / total >= min_prob}
    children: dict[tuple[int, ...], list[tuple[int, ...]]] = defaultdict(list)
    for path in kept:
        children[path[:-1]].append(path)
    for paths in children.values():
        paths.sort(key=lambda p: (-kept[p], p[-1]))
        if shape is not None:
            del paths[shape.width :]  # at most ``width`` continuations of a node, the most frequent
    if shape is None:  # the primary path: the most frequent child at each step
        chain, at = [], ()
        while children.get(at):
            at = children[at][0]
            chain.append(at)
        return Draft([p[-1] for p in chain], None, match=match, scores=[kept[p] / total for p in chain])
    reachable, queue = [], [()]
    while queue:
        at = queue.pop()
        for path in children.get(at, ()):
            reachable.append(path)
            queue.append(path)
    order = sorted(reachable, key=lambda p: (-kept[p], len(p)))[: shape.nodes]
    chosen = set(order)
    tokens, parents, scores, index = [], [], [], {(): -1}
    queue = [()]
    while queue:  # breadth first: parents precede children, children in frequency order
        at = queue.pop(0)
        for path in children.get(at, ()):
            if path in chosen:
                index[path] = len(tokens)
                tokens.append(path[-1])
                parents.append(index[at])
                scores.append(kept[path] / total)
                queue.append(path)
    if parents == list(range(-1, len(tokens) - 1)):
        return Draft(tokens, None, match=match, scores=scores)
    return Draft(tokens, None, match=match, parents=parents, scores=scores)


def build(
    target,
    name: str,
    max_ngram: NGram = 32,
    min_ngram: NGram = 1,
    min_prob: Annotated[float, number(0, 1, note=" (a continuation frequency)")] = 0.1,
    tree: TreeDraft = None,
    memory: Annotated[bool, boolean()] = True,
    memory_tokens: Annotated[int, COUNT] = 100_000,
) -> SuffixDrafter:
    if isinstance(max_ngram, bool) or isinstance(min_ngram, bool) or not 1 <= min_ngram <= max_ngram:
        raise SpecbenchError(
            f"drafter '{name}' (suffix) needs 1 <= min_ngram <= max_ngram, got {min_ngram}, {max_ngram}",
            f"set pool.drafters.{name}.min_ngram / max_ngram accordingly (defaults 1 and 32)",
        )
    shape = tree_shape(tree, name)
    if shape is not None and target is not None and target.is_encoder_decoder:
        raise SpecbenchError(
            f"drafter '{name}' (suffix) drafts a tree of continuations, which needs a decoder-only "
            "target; this one is encoder-decoder",
            f"set pool.drafters.{name}.tree=null (the most frequent continuation, a chain)",
        )
    if shape is not None and target is not None:
        check_tree_attention(target.model, f"drafter '{name}' (tree)")
    return SuffixDrafter(
        name,
        max_ngram=max_ngram,
        min_ngram=min_ngram,
        min_prob=float(min_prob),
        tree=shape,
        memory=bool(memory),
        memory_tokens=int(memory_tokens),
    )


build.batches = True  # its drafter drafts per row of a batch (Drafter.for_row; pipelines/batch_settings.py)
