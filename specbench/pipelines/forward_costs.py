"""What one target forward costs, by batch size, context and query tokens, through transformers' own path and this
engine's (issue 68): milliseconds, bytes allocated, the bytes the cache and attention copy, and the autoregressive
step against the memory floor.

Both paths feed the same rows: ``rows`` sequences of ``context`` cached tokens each, then a forward of ``q`` new tokens
a row (4D mask, per-row positions, as a batch verifies drafts), after which every row keeps none of them (the cache is
cut back, so every repeat sees the same context). *transformers*: a ``DynamicCache`` (each forward concatenates the new
keys and values onto the whole cache, ``torch.cat``) and transformers' SDPA attention (``repeat_kv`` copies K and V to
every query head when a mask is given for more than one query token). *engine*: ``BatchedLM`` (the cache written in
place at each row's frontier, ``models/frontier.py``; grouped-query heads packed, ``models/attention.py``; logits at
real positions). Each setting's forwards alternate between the paths, repeats rotated, medians reported; bytes are
read off one profiled forward each (``torch.profiler``, CPU memory: every allocation inside the forward, activations
included, so the difference between the paths is what the copies cost), and the copies are also given as computed
from the shapes (cat: the whole cache a layer, keys and values; repeat_kv: the cache times the query heads).

The memory floor of a forward: the bytes it must read (the weights, and every row's keys and values) over the
machine's memory bandwidth, measured here by copying a 256 MB tensor (a read and a write a byte). A one-token step
near the floor is memory-bound: more tokens a row cost little until compute catches up.

    python -m specbench.pipelines.forward_costs --out outputs/forward_costs [--model embedded:smollm2_135m]
        [--dtype bfloat16] [--rows 1 4 16] [--contexts 128 512] [--q 1 5 8]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import pandas as pd
import torch
from transformers import DynamicCache

from specbench.errors import SpecbenchError, exit_on
from specbench.files import atomic_write_text
from specbench.models import Target, load_model
from specbench.models.attention import stock_attention
from specbench.models.batched import BatchedLM
from specbench.models.cache import cache_argument
from specbench.pipelines.tables import to_markdown

REPEATS, WARMUP = 9, 2


def bandwidth(mb: int = 256, repeats: int = 5) -> float:
    """Bytes a second this machine's memory moves: a ``mb`` MB copy read and written, the median of ``repeats``."""
    src = torch.ones(mb * 2**20 // 4)
    dst = torch.empty_like(src)
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        dst.copy_(src)
        times.append(time.perf_counter() - t0)
    return 2 * src.numel() * 4 / statistics.median(times)


def allocated(run) -> int:
    """Bytes allocated on the CPU while ``run()`` runs (every allocation, freed or not)."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        run()
    return sum(max(e.self_cpu_memory_usage, 0) for e in prof.events())


class Transformers:
    """transformers' own path: a ``DynamicCache`` of ``rows`` x ``context`` tokens, SDPA attention, the 4D mask."""

    def __init__(self, model, rows: int, context: list[int]):
        self.model, self.rows, self.kw = model, rows, cache_argument(model)
        ids = torch.tensor([context] * rows)
        with torch.inference_mode(), stock_attention(model):
            self.cache = model(input_ids=ids, use_cache=True, **{self.kw: DynamicCache()})[self.kw]
        self.context = len(context)

    @torch.inference_mode()
    def __call__(self, q: int) -> None:
        model, rows, n = self.model, self.rows, self.context
        dtype = next(model.parameters()).dtype
        allowed = torch.ones(q, n + q, dtype=torch.bool)
        allowed[:, n:] = torch.ones(q, q, dtype=torch.bool).tril()
        mask = torch.zeros(rows, 1, q, n + q, dtype=dtype).masked_fill(~allowed, torch.finfo(dtype).min)
        positions = torch.arange(n, n + q).repeat(rows, 1)
        with stock_attention(model):
            model(
                input_ids=torch.full((rows, q), 7),
                attention_mask=mask,
                position_ids=positions,
                use_cache=True,
                **{self.kw: self.cache},
            )
        self.cache.crop(
            -q
        )  # back to n (negative: tokens removed, in transformers 4 and 5); the next forward copies it all again


class Engine:
    """This engine's path: ``BatchedLM`` over the same rows."""

    def __init__(self, target: Target, rows: int, context: list[int]):
        self.lm = BatchedLM(target.model, target.vocab_size)
        self.lm.start([context + [7]] * rows)
        self.rows = rows

    def __call__(self, q: int) -> None:
        self.lm.score([[7] * q] * self.rows)
        self.lm.keep([0] * self.rows)


def copies(config, dtype, rows: int, context: int, q: int) -> tuple[float, float]:
    """Bytes transformers' path copies a forward, computed from the shapes: ``(the cache's concatenation, repeat_kv)``
    over every layer, keys and values (repeat_kv only for more than one query token, as a mask is given)."""
    layers, heads = int(config.num_hidden_layers), int(config.num_attention_heads)
    kv_heads = int(getattr(config, "num_key_value_heads", heads) or heads)
    dim = int(getattr(config, "head_dim", None) or config.hidden_size // heads)
    size = torch.finfo(dtype).bits // 8
    slots = rows * (context + q) * dim * size * 2 * layers
    return float(slots * kv_heads), float(slots * heads if q > 1 and heads > kv_heads else 0)


def measure(target: Target, rows_grid, contexts, qs) -> pd.DataFrame:
    """The module's table: a row per (rows, context, q, path)."""
    model, dtype = target.model, next(target.model.parameters()).dtype
    weights = sum(p.numel() * p.element_size() for p in model.parameters())
    bw = bandwidth()
    out = []
    for rows in rows_grid:
        for n in contexts:
            context = [(5 + 13 * i) % 1000 + 10 for i in range(n)]
            paths = {
                "transformers": Transformers(model, rows, context),
                "engine": Engine(target, rows, context),
            }
            for q in qs:
                seconds: dict[str, list[float]] = {name: [] for name in paths}
                for r in range(WARMUP + REPEATS):
                    for name in list(paths)[r % 2 :] + list(paths)[: r % 2]:
                        t0 = time.perf_counter()
                        paths[name](q)
                        if r >= WARMUP:
                            seconds[name].append(time.perf_counter() - t0)
                cat, repeat = copies(model.config, dtype, rows, n, q)
                kv = cat / (n + q) * n  # the cache a forward reads
                for name, run in paths.items():
                    out.append(
                        {
                            "rows": rows,
                            "context": n,
                            "q": q,
                            "path": name,
                            "ms": 1000 * statistics.median(seconds[name]),
                            "MB allocated": allocated(lambda run=run, q=q: run(q)) / 2**20,
                            "MB copied (shapes)": (cat + repeat) / 2**20 if name == "transformers" else 0.0,
                            "floor ms": 1000 * (weights + kv) / bw,
                        }
                    )
    t = pd.DataFrame(out)
    t["x floor"] = t["ms"] / t["floor ms"]
    t.attrs["bandwidth GB/s"] = bw / 1e9
    return t


def page(t: pd.DataFrame, command: str) -> str:
    wide = t.pivot_table(index=["rows", "context", "q"], columns="path", values=["ms", "MB allocated"])
    wide.columns = [f"{a} ({b})" for a, b in wide.columns]
    wide["engine / transformers"] = wide["ms (engine)"] / wide["ms (transformers)"]
    wide = wide.reset_index()
    return "\n".join(
        [
            "# What a target forward costs",
            "",
            f"Generated by `{command}`; {torch.get_num_threads()} threads, memory bandwidth "
            f"{t.attrs.get('bandwidth GB/s', float('nan')):.1f} GB/s (a 256 MB copy). Medians of {REPEATS} forwards "
            "a setting, the two paths alternating (pipelines/forward_costs.py says how each is fed).",
            "",
            "## By batch size, context and query tokens",
            "",
            to_markdown(wide, floatfmt=".2f"),
            "",
            "## Each path, with the copies and the memory floor",
            "",
            "MB copied (shapes): what transformers' path copies a forward, the cache's concatenation and repeat_kv, "
            "computed from the shapes (this engine writes only the new keys and values, in place). Floor: the bytes "
            "a forward must read (the weights and every row's keys and values) over the measured bandwidth.",
            "",
            to_markdown(t, floatfmt=".2f"),
            "",
        ]
    )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--model", default="embedded:smollm2_135m")
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--rows", type=int, nargs="+", default=[1, 4, 16])
    parser.add_argument("--contexts", type=int, nargs="+", default=[128, 512])
    parser.add_argument("--q", type=int, nargs="+", default=[1, 5, 8])
    args = parser.parse_args(argv)
    try:
        target = Target(load_model(args.model, dtype=args.dtype, device="cpu"))
        t = measure(target, args.rows, args.contexts, args.q)
    except SpecbenchError as exc:
        exit_on(exc)
    args.out.mkdir(parents=True, exist_ok=True)
    t.to_csv(args.out / "forward_costs.csv", index=False)
    command = "python -m specbench.pipelines.forward_costs " + " ".join(
        sys.argv[1:] if argv is None else argv
    )
    atomic_write_text(args.out / "forward_costs.md", page(t, command.strip()))
    print(to_markdown(t, floatfmt=".2f"))


if __name__ == "__main__":
    main()
