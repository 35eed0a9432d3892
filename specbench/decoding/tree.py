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

A member may draft a tree of its own (``Draft.parents``: a dynamic draft tree, or a retrieval drafter's
several continuations). Each of its draft tokens is a *draw*; draws that spell the same prefix share one
trie node (scored once), but verification still walks draws: at an accepted node the candidates are the
children of every draw that sits on it, each with the distribution it was drawn from, in member order and
then draft order, duplicates included. Under sampling a model drafter's siblings are independent draws
(with replacement) from its distribution given their parent, so recursive rejection keeps the law: a
token drawn twice is tried twice (after its first rejection the residual is 0 there, so the second try is
rejected and subtracts ``q`` once more, as the theorem's independent draws require); skipping it would
not be lossless. A deterministic member's distinct siblings are one-hot candidates, tried in turn.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import torch

from specbench.decoding.verify import block_divergence, residual


@dataclass(frozen=True)
class TokenTree:
    """A trie of drafts. ``tokens[i]`` and ``parents[i]`` (-1: a child of the root) describe node ``i``; a
    parent always precedes its children. ``paths[name]``: the node indices of that member's draft (empty
    for an empty draft), in the order the members were given; for a member that drafted a tree, its
    *primary* path (each draw's first child, from its first root draw: a top-k tree's top-1 chain).
    ``draws[name]``: the trie node of each of its draft tokens, ``links[name]``: each draft token's parent
    draft index (-1: the root), ``primary[name]``: the draft indices along ``paths[name]``. For a chain draft
    ``draws`` is ``paths``, ``links`` is ``(-1, 0, 1, ...)`` and ``primary`` is ``(0, 1, ...)``."""

    tokens: tuple[int, ...]
    parents: tuple[int, ...]
    paths: dict[str, tuple[int, ...]]
    draws: dict[str, tuple[int, ...]] = None  # type: ignore[assignment]  (filled by build_tree)
    links: dict[str, tuple[int, ...]] = None  # type: ignore[assignment]
    primary: dict[str, tuple[int, ...]] = None  # type: ignore[assignment]

    def __post_init__(self):
        if self.draws is None:  # a tree of chains given by its paths alone
            object.__setattr__(self, "draws", dict(self.paths))
            object.__setattr__(
                self, "links", {m: tuple(range(-1, len(p) - 1)) for m, p in self.paths.items()}
            )
            object.__setattr__(self, "primary", {m: tuple(range(len(p))) for m, p in self.paths.items()})

    def nodes_of(self, member: str) -> frozenset[int]:
        """Every trie node ``member``'s draft reaches."""
        return frozenset(self.draws[member])

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


def chain_links(n: int) -> tuple[int, ...]:
    """The parent draft indices of an ``n``-token chain draft."""
    return tuple(range(-1, n - 1))


def primary_indices(links: Sequence[int]) -> tuple[int, ...]:
    """Draft indices of a tree draft's primary path: its first root draw, then each draw's first child."""
    out: list[int] = []
    at = -1
    while True:
        nxt = next((i for i, parent in enumerate(links) if parent == at), None)
        if nxt is None:
            return tuple(out)
        out.append(nxt)
        at = nxt


def check_links(name: str, n: int, links: Sequence[int]) -> None:
    if len(links) != n or any(not -1 <= parent < i for i, parent in enumerate(links)):
        raise ValueError(
            f"draft of '{name}': parents {list(links)} do not describe a tree over its {n} tokens "
            "(each parent must precede its child; -1 for a child of the root)"
        )


def build_tree(
    drafts: Mapping[str, Sequence[int]], parents: Mapping[str, Sequence[int] | None] | None = None
) -> TokenTree:
    """Merge drafts into a trie: shared prefixes become shared nodes (scored once). ``parents[name]`` (when
    given and not None): that member's draft is a tree, each token's parent draft index (-1: the root)."""
    tokens: list[int] = []
    tree_parents: list[int] = []
    index: dict[tuple[int, int], int] = {}  # (parent, token) -> node
    paths: dict[str, tuple[int, ...]] = {}
    draws: dict[str, tuple[int, ...]] = {}
    links: dict[str, tuple[int, ...]] = {}
    primary: dict[str, tuple[int, ...]] = {}
    for name, draft in drafts.items():
        own = (parents or {}).get(name)
        own = chain_links(len(draft)) if own is None else tuple(int(x) for x in own)
        check_links(name, len(draft), own)
        nodes: list[int] = []
        for tok, link in zip(draft, own):
            key = (-1 if link < 0 else nodes[link], int(tok))
            if key not in index:
                index[key] = len(tokens)
                tokens.append(int(tok))
                tree_parents.append(key[0])
            nodes.append(index[key])
        draws[name], links[name] = tuple(nodes), own
        primary[name] = primary_indices(own)
        paths[name] = tuple(nodes[i] for i in primary[name])
    return TokenTree(tuple(tokens), tuple(tree_parents), paths, draws, links, primary)


def draw_outcomes(tree: TokenTree, member: str, path: Sequence[int]) -> tuple[tuple[int, bool], ...]:
    """``member``'s draft tokens that verification judged (their parent accepted, or a child of the root), each as
    ``(draft index, accepted)``: what a per-node acceptance calibration observes from a tree round."""
    on = set(path)
    out = []
    for i, (node, link) in enumerate(zip(tree.draws[member], tree.links[member])):
        if link < 0 or tree.draws[member][link] in on:
            out.append((i, node in on))
    return tuple(out)


def chain_outcomes(n: int, accepted: int) -> tuple[tuple[int, bool], ...]:
    """The same for an ``n``-token chain draft of which ``accepted`` leading tokens were kept."""
    return tuple((i, i < accepted) for i in range(min(n, accepted + 1)))


def tree_attention(tree: TokenTree) -> torch.Tensor:
    """``[n + 1, n + 1]`` bool: row ``r`` may attend column ``c`` (the root, the row's ancestors, itself). Built once
    per tree shape (``parents``) and shared: callers must not write into it."""
    return _attention(tree.parents)


@functools.lru_cache(maxsize=256)
def _attention(parents: tuple[int, ...]) -> torch.Tensor:
    n = len(parents)
    allowed = torch.zeros(n + 1, n + 1, dtype=torch.bool)
    allowed[:, 0] = True
    for i in range(n):
        allowed[1 + i, 1 + i] = True
        if parents[i] >= 0:
            allowed[1 + i] |= allowed[1 + parents[i]]
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
        """How many leading tokens of the accepted path ``member``'s draft reaches (for a chain draft: how many
        of its leading tokens lie on the accepted path; its draft alone would have kept as many)."""
        mine = tree.nodes_of(member)
        n = 0
        for node in self.path:
            if node not in mine:
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


def verify_tree_sampling(
    tree: TokenTree,
    q: Mapping[str, torch.Tensor | None],
    p: torch.Tensor,
    rng: torch.Generator,
    residual_rule: ResidualRule = residual,
) -> TreeVerdict:
    """Multi-step speculative sampling over the trie (SpecInfer): lossless w.r.t. ``p`` ``[n + 1, V]``.

    ``q[name]`` ``[len(draft), V]``: the distributions member ``name``'s tokens were drawn from (None for a
    deterministic drafter). Members offer candidates in the order of ``tree.paths``. ``residual_rule``
    is the target distribution after a rejected candidate (``verify.residual``; a test swaps it to
    show that skipping the correction breaks the law).
    """
    children: dict[
        tuple[str, int], list[int]
    ] = {}  # (member, parent draw) -> its child draws, in draft order
    for m, own in tree.links.items():
        for i, link in enumerate(own):
            children.setdefault((m, link), []).append(i)
    on = {m: [-1] for m in tree.draws}  # each member's draws sitting on the accepted path's last node
    path: list[int] = []
    row = 0
    while True:
        dist = p[row]
        chosen = None
        candidates = [(m, i) for m in tree.draws for at in on[m] for i in children.get((m, at), ())]
        for member, i in candidates:
            node = tree.draws[member][i]
            x = tree.tokens[node]
            qm = q.get(member)
            q_x = 1.0 if qm is None else float(qm[i, x])
            u = float(torch.rand(1, generator=rng, device=p.device))
            if u * q_x < float(dist[x]):  # accept with probability min(1, p(x) / q(x))
                chosen = node
                break
            dist = residual_rule(dist, None if qm is None else qm[i].to(p.device), x)
        if chosen is None:
            token = int(torch.multinomial(dist, 1, generator=rng))
            return TreeVerdict(tuple(path), [tree.tokens[n] for n in path] + [token], len(path))
        path.append(chosen)
        on = {
            m: [i for at in on[m] for i in children.get((m, at), ()) if tree.draws[m][i] == chosen]
            for m in tree.draws
        }
        row = 1 + chosen


def member_divergence(
    tree: TokenTree, member: str, q: torch.Tensor | None, p: torch.Tensor, n_max: int
) -> float:
    """The Block Divergence ``member``'s draft would have had alone, read off the tree forward's rows along
    its own path (``p`` ``[n + 1, V]``): the same rows a chain forward over its draft computes."""
    path = tree.paths[member]
    if not path:
        return 0.0
    rows = [tree.parent_row(n) for n in path]
    own = tree.primary[member]
    if q is not None and (q.shape[0] != len(own) or own != tuple(range(len(own)))):
        q = q[list(own)]
    return block_divergence([tree.tokens[n] for n in path], q, p[rows], n_max)
