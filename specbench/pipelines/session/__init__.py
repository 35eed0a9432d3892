"""The core every command shares, one room per concern:

- ``core``: ``Session``, one per run: opens the run directory and loads what a timed run needs, then decodes
  (the one loop, with the run's ``DecodeSpec``), seeds, warms up and writes records;
- ``run_dir``: the run directory: validation, the lock (one process, one command), settings a resume must match;
- ``settings``: what the config leaves to this machine, resolved once as the run opens (the target's dtype, the
  tie tolerance of greedy certification in that dtype, the cascade rule);
- ``prompting``: the queries, the target and the prompt builder; the target's context;
- ``schedule``: the order and the seeds of a run's generations;
- ``run_records``: ``examples.jsonl`` + ``rounds.jsonl``, written as each generation finishes and resumed.

``Session`` (and ``alone_target``, ``policy_checkpoint``) are importable from here; they load on first use, so a
light import of one room (``run_dir`` for ``reproduce``) does not load the decoding stack.
"""

from __future__ import annotations

_CORE = ("Session", "alone_target", "policy_checkpoint")


def __getattr__(name: str):
    if name in _CORE:
        from specbench.pipelines.session import core

        return getattr(core, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
