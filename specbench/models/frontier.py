"""A KV cache written in place at each row's frontier (issue 68): one copy of the cache per forward, whatever the draft
length.

transformers' ``DynamicCache`` appends a forward's keys and values with ``torch.cat``, so every forward copies the
whole cache, and a rejected draft is cut off by slicing (the next forward copies again). ``FrontierCache`` keeps one
preallocated buffer a layer, ``[rows, kv heads, capacity, head dim]``, and ``Frontier``, every row's length: row ``r``
holds its committed positions in slots ``0 .. lengths[r] - 1`` (left-aligned: slot ``s`` is position ``s``), and a
forward of ``q`` new tokens writes them into slots ``lengths[r] .. lengths[r] + q - 1`` of its own row, in place,
then hands attention a view of the first ``max(lengths) + q`` slots (no copy). What a row does not keep of a forward
(a rejected draft, a tree's other branches) is simply not counted (``keep``): its slots are overwritten by the next
forward. A tree's accepted path is moved into place inside the row (a few slots). A row that finishes leaves the
cache (``drop``: the rows after it move up, one row's valid slots each); a new row takes the next free row
(``add_rows``) and is prefilled alone in a window of its own (``window``), so each row's prefill computes exactly what
it would alone.

Rows of different lengths share a forward: slots past a row's own length hold stale or padded keys, so the forward
must pass a 4D mask that lets each row see only its slots (``models/batched.py`` builds it from ``lengths``). A
single row (``models/cache.py``'s ``CachedLM``) needs no mask of its own: ``get_seq_length`` and ``get_mask_sizes``
answer as a ``DynamicCache`` of the row's length would, so transformers builds the usual causal mask.

The cache's owner advances it after each forward (``advance``): transformers asks ``get_seq_length`` before the
layers write, so the lengths must not move while a forward runs.

transformers without cache layers (4.x) or a model whose cache keeps a sliding window (``supported``): the caller
keeps ``DynamicCache`` (today's path), said once.
"""

from __future__ import annotations

import contextlib
import functools
import logging

import torch

log = logging.getLogger(__name__)

try:  # transformers 5: caches are lists of layers
    from transformers.cache_utils import Cache, CacheLayerMixin, DynamicCache
except ImportError:  # pragma: no cover - transformers 4.x
    Cache = CacheLayerMixin = None
    from transformers import DynamicCache

ENGINE = (
    "frontier-1"  # the forward path's version: cached cost profiles measured by another are measured again
)
GRAIN = 64  # slots are allocated in multiples of this, and at least doubled when they run out


@functools.cache
def said(message: str) -> None:
    """Log a fallback once per message (a run may build many caches)."""
    log.info(message)


def _fallback(reason: str) -> None:
    said(f"KV cache: {reason}; the cache is transformers' DynamicCache (copied on every forward)")


def supported(model: torch.nn.Module) -> bool:
    """Whether ``model`` can use a ``FrontierCache``: transformers with cache layers, a decoder-only model, and a
    cache that keeps every position (a model with sliding-window layers keeps only a window in some of them)."""
    if CacheLayerMixin is None:
        _fallback("this transformers has no cache layers (transformers 5 has)")
        return False
    config = getattr(model, "config", None)
    if config is None or getattr(config, "is_encoder_decoder", False):
        return False
    try:
        probe = DynamicCache(config=config)
    except (TypeError, ValueError, AttributeError):
        probe = None
    if probe is not None and any(getattr(probe, "is_sliding", ()) or ()):
        _fallback(f"{type(model).__name__} keeps a sliding window in some layers")
        return False
    return True


class Frontier:
    """Every row's length (its valid slots, a prefix), shared by the layers of one ``FrontierCache``; ``start`` and
    ``stop`` bound the rows the running forward covers (all of them unless a ``window`` is open)."""

    def __init__(self, rows: int = 0):
        self.lengths: list[int] = [0] * rows
        self.start, self.stop = 0, rows
        self._where: tuple | None = (
            None  # the write indices of the running forward, computed once for all layers
        )

    @property
    def rows(self) -> int:
        return len(self.lengths)

    def covered(self) -> list[int]:
        return self.lengths[self.start : self.stop]

    def end(self, q: int) -> int:
        """The slots a forward of ``q`` new tokens hands attention: the longest covered row's, plus ``q``."""
        return max(self.covered(), default=0) + q

    def where(self, q: int, device) -> tuple | None:
        """``(rows [R, 1], slots [R, q])`` of the covered rows' writes when their lengths differ; None when they are
        equal (one slice writes them all)."""
        covered = self.covered()
        if len(set(covered)) <= 1:
            return None
        key = (self.start, self.stop, tuple(covered), q, str(device))
        if self._where is None or self._where[0] != key:
            rows = torch.arange(self.start, self.stop, device=device)[:, None]
            slots = torch.tensor(covered, device=device)[:, None] + torch.arange(q, device=device)[None]
            self._where = (key, rows, slots)
        return self._where[1], self._where[2]


if CacheLayerMixin is not None:

    class FrontierLayer(CacheLayerMixin):
        """One layer's buffers, written at each covered row's frontier (the module's docstring)."""

        is_sliding = False
        is_croppable = True

        def __init__(self, frontier: Frontier):
            super().__init__()
            self.frontier = frontier
            self.buffers: tuple[torch.Tensor, torch.Tensor] | None = None

        def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
            self.device = key_states.device
            self.is_initialized = True

        def _room(self, key_states: torch.Tensor, value_states: torch.Tensor, slots: int) -> None:
            """Buffers of at least the frontier's rows and ``slots`` slots (grown, keeping what they hold)."""
            rows = self.frontier.rows
            if self.buffers is not None:
                k, v = self.buffers
                if k.shape[0] >= rows and k.shape[2] >= slots:
                    return
                rows_to, slots_to = max(rows, k.shape[0]), max(slots, k.shape[2])
                if slots_to > k.shape[2]:
                    slots_to = max(slots_to, 2 * k.shape[2])
            else:
                rows_to, slots_to = rows, slots
            slots_to = -(-slots_to // GRAIN) * GRAIN
            shape_k = (rows_to, key_states.shape[1], slots_to, key_states.shape[3])
            shape_v = (rows_to, value_states.shape[1], slots_to, value_states.shape[3])
            new = (key_states.new_zeros(shape_k), value_states.new_zeros(shape_v))
            if self.buffers is not None:
                for old, grown in zip(self.buffers, new):
                    grown[: old.shape[0], :, : old.shape[2]] = old
            self.buffers = new

        def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
            if not self.is_initialized:
                self.lazy_initialization(key_states, value_states)
            f = self.frontier
            q = key_states.shape[-2]
            end = f.end(q)
            self._room(key_states, value_states, end)
            k, v = self.buffers
            where = f.where(q, k.device)
            if where is None:  # every covered row at one length: one slice
                at = f.lengths[f.start] if f.stop > f.start else 0
                k[f.start : f.stop, :, at : at + q] = key_states
                v[f.start : f.stop, :, at : at + q] = value_states
            else:
                rows, slots = where
                k[rows, :, slots] = key_states.transpose(1, 2)
                v[rows, :, slots] = value_states.transpose(1, 2)
            self.keys, self.values = k[f.start : f.stop, :, :end], v[f.start : f.stop, :, :end]
            return self.keys, self.values

        def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
            return self.get_seq_length() + query_length, 0

        def get_seq_length(self) -> int:
            return max(self.frontier.covered(), default=0)

        def get_max_length(self) -> int:
            return -1

        def crop(self, tokens_to_remove: int) -> None:
            """transformers' crop (a negative count removes that many positions from every covered row)."""
            if tokens_to_remove > 0:
                raise ValueError("crop takes a negative count (positions to remove)")
            f = self.frontier
            for r in range(f.start, f.stop):
                f.lengths[r] = max(f.lengths[r] + tokens_to_remove, 0)

        @torch.inference_mode()
        def move(self, row: int, source: list[int], target: int) -> None:
            """Row ``row``'s slots ``source`` (increasing, each >= ``target``) moved to ``target ..`` in place."""
            if self.buffers is None:
                return
            idx = torch.tensor(source, device=self.buffers[0].device)
            for x in self.buffers:
                x[row, :, target : target + len(source)] = x[row, :, :].index_select(1, idx)

        @torch.inference_mode()
        def pack(self, rows: list[int], lengths: list[int]) -> None:
            """Row ``rows[i]`` (increasing) moved to row ``i``: the first ``lengths[i]`` slots of each."""
            if self.buffers is None:
                return
            for i, (r, n) in enumerate(zip(rows, lengths)):
                if r != i:
                    for x in self.buffers:
                        x[i, :, :n] = x[r, :, :n]

    class FrontierCache(Cache):
        """A transformers ``Cache`` of ``FrontierLayer`` s sharing one ``Frontier`` (the module's docstring)."""

        def __init__(self, rows: int = 1):
            self.frontier = Frontier(rows)
            super().__init__(layer_class_to_replicate=functools.partial(FrontierLayer, self.frontier))

        @property
        def lengths(self) -> list[int]:
            return self.frontier.lengths

        @property
        def rows(self) -> int:
            return self.frontier.rows

        def get_seq_length(self, layer_idx: int = 0) -> int:
            return max(self.frontier.covered(), default=0)

        def get_mask_sizes(self, query_length: int, layer_idx: int = 0) -> tuple[int, int]:
            return self.get_seq_length() + query_length, 0

        def advance(self, q: int) -> None:
            """A forward of ``q`` new tokens has run: every covered row holds them."""
            f = self.frontier
            for r in range(f.start, f.stop):
                f.lengths[r] += q

        def set_length(self, row: int, n: int) -> None:
            """Row ``row`` keeps its first ``n`` slots (at most what it holds)."""
            if not 0 <= n <= self.frontier.lengths[row]:
                raise ValueError(f"row {row} keeps {n} of its {self.frontier.lengths[row]} slots")
            self.frontier.lengths[row] = n

        def keep(self, row: int, base: int, offsets: list[int]) -> None:
            """Of the slots a forward wrote from ``base``, row ``row`` keeps those at ``offsets`` (increasing): moved
            into place when they are not a prefix (a tree's accepted path), then counted."""
            offsets = list(offsets)
            if offsets != list(range(len(offsets))):
                for layer in self.layers:
                    layer.move(row, [base + k for k in offsets], base)
            self.set_length(row, base + len(offsets))

        def add_rows(self, m: int) -> list[int]:
            """``m`` new empty rows at the end (buffers grow at the next write); their indices."""
            f = self.frontier
            first = f.rows
            f.lengths.extend([0] * m)
            f.start, f.stop = 0, f.rows
            return list(range(first, first + m))

        def drop(self, rows: list[int]) -> None:
            """Keep only ``rows`` (increasing), moved up in that order."""
            if list(rows) != sorted(set(rows)):
                raise ValueError(f"rows to keep {rows} must increase")
            f = self.frontier
            lengths = [f.lengths[r] for r in rows]
            for layer in self.layers:
                layer.pack(list(rows), lengths)
            f.lengths = lengths
            f.start, f.stop = 0, f.rows

        @contextlib.contextmanager
        def window(self, start: int, stop: int):
            """Forwards inside it cover rows ``start .. stop - 1`` only (a new row's prefill)."""
            f = self.frontier
            f.start, f.stop = start, stop
            try:
                yield self
            finally:
                f.start, f.stop = 0, f.rows

        def bytes(self) -> int:
            """The bytes the buffers hold (allocated, not only used)."""
            return sum(x.numel() * x.element_size() for layer in self.layers for x in (layer.buffers or ()))

else:  # pragma: no cover - transformers 4.x
    FrontierLayer = FrontierCache = None


__all__ = ["Frontier", "FrontierCache", "FrontierLayer", "supported"]
