"""Dynamic draft trees inside one model drafter (the EAGLE-2 layout), as a pure function over the drafter's
distributions: ``grow`` asks the drafter for one forward per depth over the whole frontier and returns a tree
``Draft`` (``Draft.parents``).

- **Greedy**: each expanded node offers its ``width`` most probable tokens; a node's score is the product of the
  drafter's probabilities along its path (a proxy of the chance the target accepts the path); the next depth
  expands the ``width`` best-scored new nodes; at the end the ``nodes`` best-scored nodes are kept (a child never
  outscores its parent, so the kept set is closed under parents). A chain is the tree of width 1.
- **Sampling**: each expanded node's children are ``width`` independent draws (with replacement) from the
  drafter's processed distribution, duplicates included, and no drawn token is ever dropped by its value:
  only the *choice of which nodes to expand* reads the scores, and the size cap cuts whole depths in draw
  order. So every verified candidate is an unconditioned draw from its ``q`` given its parent, which is what
  multi-step speculative sampling needs to keep the target's law (``decoding/tree.py``); keeping the top
  ``nodes`` by score, or dropping a repeated token, would bias the candidates toward the drafter's mode.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from specbench.decoding.drafter import Draft, keep_tokens
from specbench.decoding.sampling import SamplingParams
from specbench.errors import SpecbenchError


@dataclass(frozen=True)
class TreeShape:
    """``width``: children per expanded node and nodes expanded per depth; ``nodes``: tokens kept in the draft."""

    width: int
    nodes: int


def tree_shape(value, name: str) -> TreeShape | None:
    """A drafter config's ``tree`` (``{width, nodes}`` or null) as a ``TreeShape``, else a ``SpecbenchError``."""
    if value is None:
        return None
    fix = (
        f"set pool.drafters.{name}.tree to {{width: 3, nodes: 12}} (whole numbers >= 1), or null for a chain"
    )
    try:
        width, nodes = value["width"], value["nodes"]
        extra = sorted(set(value) - {"width", "nodes"})
    except (TypeError, KeyError):
        raise SpecbenchError(
            f"drafter '{name}': tree must be a mapping with width and nodes, got {value!r}", fix
        ) from None
    if extra:
        raise SpecbenchError(f"drafter '{name}': tree has unknown keys {extra}", fix)
    for key, v in (("width", width), ("nodes", nodes)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise SpecbenchError(f"drafter '{name}': tree.{key} must be a whole number >= 1, got {v!r}", fix)
    return TreeShape(int(width), int(nodes))


Expand = Callable[[list[int], list[int], list[int], list[int]], torch.Tensor]


def grow(
    first: torch.Tensor,
    expand: Expand,
    k: int,
    shape: TreeShape,
    sampling: SamplingParams,
    rng: torch.Generator,
    eos_ids=frozenset(),
) -> Draft:
    """A dynamic draft tree of depth at most ``k``.

    ``first`` ``[V]``: the drafter's processed distribution after the committed tokens. ``expand(frontier, tokens,
    parents, depths)``: the drafter's distributions ``[len(frontier), V]`` after each frontier node (one forward over
    the frontier; ``tokens``/``parents``/``depths`` describe every node so far, the frontier's ancestors included).
    """
    tokens: list[int] = []
    parents: list[int] = []
    depths: list[int] = []
    scores: list[float] = []
    rows: list[torch.Tensor] = []
    greedy = sampling.greedy
    dists, at, depth = first[None], [-1], 1
    while k >= depth:
        new: list[int] = []
        for dist, parent in zip(dists, at):
            if greedy:
                picks = torch.topk(dist, min(shape.width, int((dist > 0).sum()) or 1)).indices.tolist()
            else:
                picks = torch.multinomial(dist, shape.width, replacement=True, generator=rng).tolist()
            base = 1.0 if parent < 0 else scores[parent]
            for tok in picks:
                if not greedy and len(tokens) >= shape.nodes:
                    break
                new.append(len(tokens))
                tokens.append(int(tok))
                parents.append(parent)
                depths.append(depth)
                scores.append(base * float(dist[tok]))
                rows.append(dist)
        open_ = [i for i in new if tokens[i] not in eos_ids]
        frontier = sorted(open_, key=lambda i: (-scores[i], i))[: shape.width]
        if depth == k or not frontier or (not greedy and len(tokens) >= shape.nodes):
            break
        frontier.sort()
        dists, at, depth = expand(frontier, tokens, parents, depths), frontier, depth + 1
    draft = Draft(tokens=tokens, probs=torch.stack(rows) if rows else None, parents=parents, scores=scores)
    if greedy and len(tokens) > shape.nodes:
        draft = keep_tokens(draft, sorted(range(len(tokens)), key=lambda i: (-scores[i], i))[: shape.nodes])
    if draft.parents is not None and draft.parents == list(range(-1, len(draft.tokens) - 1)):
        draft = Draft(draft.tokens, draft.probs, match=draft.match, scores=draft.scores)  # a chain after all
    return draft


def frontier_attention(
    base: int, slot: dict[int, int], frontier: list[int], parents: list[int], device=None
) -> torch.Tensor:
    """``[len(frontier), base + fed + len(frontier)]`` bool: which cached and new positions each frontier node may
    attend when a drafter feeds the frontier after ``base`` committed positions and the ``fed = len(slot)`` tree
    nodes fed before (``slot``: node -> its row among them): every committed position, its ancestors and itself.
    Records the frontier's rows in ``slot``."""
    fed = len(slot)
    allowed = torch.zeros(len(frontier), base + fed + len(frontier), dtype=torch.bool, device=device)
    allowed[:, :base] = True
    for row, node in enumerate(frontier):
        for a in ancestors(parents, node):
            allowed[row, base + slot[a]] = True
        allowed[row, base + fed + row] = True
        slot[node] = fed + row
    return allowed


def ancestors(parents: list[int], node: int) -> list[int]:
    """``node``'s ancestors, nearest first."""
    out = []
    node = parents[node]
    while node >= 0:
        out.append(node)
        node = parents[node]
    return out
