"""The core every command shares, one room per concern:

- ``core``: ``Session``, one per run: opens the run directory and loads what a timed run needs, then decodes
  (the one loop, with the run's ``DecodeSpec``), seeds, warms up and writes records;
- ``run_dir``: the run directory: validation, the lock (one process, one command), settings a resume must match;
- ``settings``: what the config leaves to this machine, resolved once as the run opens (the target's dtype, the
  tie tolerance of greedy certification in that dtype, the cascade rule);
- ``prompting``: the queries, the target and the prompt builder; the target's context;
- ``schedule``: the order and the seeds of a run's generations;
- ``run_records``: ``examples.jsonl`` + ``rounds.jsonl``, written as each generation finishes and resumed.

``Session`` lives in ``core`` (``from specbench.pipelines.session.core import Session``); this face re-exports
nothing, so a light import of one room (``run_dir`` for ``reproduce``) does not load the decoding stack.
"""
