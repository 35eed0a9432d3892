"""Token trees: several drafters' drafts merged into one trie that a single target forward verifies
(pure functions over lists and tensors; no model calls).

Rows of the tree forward: row 0 is the last committed token (the root), row ``1 + i`` is node ``i``.
The row that predicts node ``i``'s token is its parent's row (``parent_row``); a path's bonus row is
the row of its last node. Each node attends to the committed tokens, the root, its ancestors and
itself (``tree_attention``), at position ``committed + depth`` (``tree_positions``), so every path's
rows are those of a chain forward over that path.

Greedy verification walks the target's argmax down the trie: the accepted path is the longest one
that agrees with it, and since that walk is unique, each member's own accepted length (what its
draft alone would have had) is how far its path follows the walk. Sampling uses SpecInfer's
multi-step speculative sampling: at each node the members still on the accepted path offer their
next tokens in turn; candidate ``x`` drawn from ``q`` is accepted with probability
``min(1, p(x) / q(x))``, and after each rejection the target distribution becomes the normalised
residual ``max(0, p - q)``; when every candidate is rejected the token is drawn from the last
residual. Each candidate is an independent draw from its drafter's distribution given the accepted
prefix, so the output law is exactly ``p`` at every node (Miao et al. 2024, Theorem 4.2). A
deterministic drafter (prompt lookup) takes part with a one-hot ``q``: it is accepted with
probability ``p(x)`` and, when rejected, removes ``x`` from the residual.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import torch

from specbench.decoding.verify import block_divergence, residual


@dataclass(frozen=True)
class TokenTree:
    """A trie of drafts. ``tokens[i]`` and ``parents[i]`` (-1: a child of the root) describe node ``i``; a
    parent always precedes its children. ``paths[name]``: the node indices of that member's draft (empty
    for an empty draft), in the order the members were given."""

    tokens: tuple[int, ...]
    parents: tuple[int, ...]
    paths: dict[str, tuple[int, ...]]

    @property
    def size(self) -> int:
        return len(self.tokens)

    @property
    def is_chain(self) -> bool:
        """True when the trie is one path (then a plain chain forward scores it with the same rows)."""
        return all(parent == i - 1 for i, parent in enumerate(self.parents))

    def children(self, node: int) -> list[int]:
        """Children of ``node`` (-1: the root), in insertion order."""
        return [i for i, parent in enumerate(self.parents) if parent == node]

    def attention(self) -> torch.Tensor:
        """The tree forward's attention mask (``tree_attention``)."""
        return tree_attention(self)

    def positions(self) -> list[int]:
        """The tree forward's row depths (``tree_positions``)."""
        return tree_positions(self)

    def depths(self) -> list[int]:
        out: list[int] = []
        for parent in self.parents:
            out.append(1 if parent < 0 else out[parent] + 1)
        return out

    def parent_row(self, node: int) -> int:
        """The forward row whose distribution node ``node``'s token is judged by."""
        return 1 + self.parents[node] if self.parents[node] >= 0 else 0

    def rows(self, path: Sequence[int]) -> list[int]:
        """Rows that chose each token of ``path`` and then its bonus token: ``len(path) + 1`` rows."""
        return [0] + [1 + n for n in path]


def build_tree(drafts: Mapping[str, Sequence[int]]) -> TokenTree:
    """Merge drafts into a trie: shared prefixes become shared nodes (scored once)."""
    tokens: list[int] = []
    parents: list[int] = []
    index: dict[tuple[int, int], int] = {}  # (parent, token) -> node
    paths: dict[str, tuple[int, ...]] = {}
    for name, draft in drafts.items():
        node, path = -1, []
        for tok in draft:
            key = (node, int(tok))
            if key not in index:
                index[key] = len(tokens)
                tokens.append(int(tok))
                parents.append(node)
            node = index[key]
            path.append(node)
        paths[name] = tuple(path)
    return TokenTree(tuple(tokens), tuple(parents), paths)


def tree_attention(tree: TokenTree) -> torch.Tensor:
    """``[n + 1, n + 1]`` bool: row ``r`` may attend column ``c`` (the root, the row's ancestors, itself)."""
    n = tree.size
    allowed = torch.zeros(n + 1, n + 1, dtype=torch.bool)
    allowed[:, 0] = True
    for i in range(n):
        allowed[1 + i, 1 + i] = True
        if tree.parents[i] >= 0:
            allowed[1 + i] |= allowed[1 + tree.parents[i]]
    return allowed


def tree_positions(tree: TokenTree) -> list[int]:
    """Depth of each scored row: 0 for the root, then each node's depth (its offset from the root)."""
    return [0] + tree.depths()


@dataclass(frozen=True)
class TreeVerdict:
    path: tuple[int, ...]  # accepted nodes, root to leaf
    tokens: list[int]  # their tokens, then one token from the target
    accepted: int

    def agreement(self, tree: TokenTree, member: str) -> int:
        """How many leading tokens of ``member``'s draft lie on the accepted path."""
        n = 0
        for a, b in zip(tree.paths[member], self.path):
            if a != b:
                break
            n += 1
        return n

    def winners(self, tree: TokenTree) -> list[str]:
        """Members whose draft reached the accepted length (each shares the credit for the round)."""
        return [m for m in tree.paths if self.accepted and self.agreement(tree, m) == self.accepted]


def verify_tree_greedy(tree: TokenTree, logits: torch.Tensor) -> TreeVerdict:
    """The longest path equal to the target's argmax, then the target's token at its end.

    ``logits`` ``[n + 1, V]``: the tree forward's rows. Each member's own greedy accepted length is
    ``verdict.agreement(tree, member)`` (the argmax walk is unique).
    """
    best = torch.argmax(logits, dim=-1).tolist()
    path: list[int] = []
    node, row = -1, 0
    while True:
        nxt = next((c for c in tree.children(node) if tree.tokens[c] == best[row]), None)
        if nxt is None:
            break
        path.append(nxt)
        node, row = nxt, 1 + nxt
    return TreeVerdict(tuple(path), [tree.tokens[n] for n in path] + [best[row]], len(path))


ResidualRule = Callable[[torch.Tensor, torch.Tensor | None, int], torch.Tensor]


def verify_tree_sampling(tree: TokenTree, q: Mapping[str, torch.Tensor | None], p: torch.Tensor,
                         rng: torch.Generator, residual_rule: ResidualRule = residual) -> TreeVerdict:
    """Multi-step speculative sampling over the trie (SpecInfer): lossless w.r.t. ``p`` ``[n + 1, V]``.

    ``q[name]`` ``[len(draft), V]``: the distributions member ``name``'s tokens were drawn from (None for a
    deterministic drafter). Members offer candidates in the order of ``tree.paths``. ``residual_rule``
    is the target distribution after a rejected candidate (``verify.residual``; a test swaps it to
    show that skipping the correction breaks the law).
    """
    active = [m for m, path in tree.paths.items() if path]
    path: list[int] = []
    row, depth = 0, 0
    while True:
        dist = p[row]
        chosen = None
        candidates = [(m, tree.paths[m][depth]) for m in active if len(tree.paths[m]) > depth]
        for member, node in candidates:
            x = tree.tokens[node]
            qm = q.get(member)
            q_x = 1.0 if qm is None else float(qm[depth, x])
            u = float(torch.rand(1, generator=rng, device=p.device))
            if u * q_x < float(dist[x]):  # accept with probability min(1, p(x) / q(x))
                chosen = node
                break
            dist = residual_rule(dist, None if qm is None else qm[depth].to(p.device), x)
        if chosen is None:
            token = int(torch.multinomial(dist, 1, generator=rng))
            return TreeVerdict(tuple(path), [tree.tokens[n] for n in path] + [token], len(path))
        path.append(chosen)
        active = [m for m, node in candidates if node == chosen]
        row, depth = 1 + chosen, depth + 1


def member_divergence(tree: TokenTree, member: str, q: torch.Tensor | None, p: torch.Tensor, n_max: int) -> float:
    """The Block Divergence ``member``'s draft would have had alone, read off the tree forward's rows along
    its own path (``p`` ``[n + 1, V]``): the same rows a chain forward over its draft computes."""
    path = tree.paths[member]
    if not path:
        return 0.0
    rows = [tree.parent_row(n) for n in path]
    return block_divergence([tree.tokens[n] for n in path], q, p[rows], n_max)
