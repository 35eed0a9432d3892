"""Clocks for honest timing.

A generation is timed between two ``boundary`` readings, each of which first waits for queued
device work (one CUDA synchronisation at each end, as for Hugging Face ``generate``). Per-phase
readings inside a generation (``now``: select, draft, verify, switch) synchronise the device only
with ``phases=True`` (config ``timing.phases``), which is off for headline numbers: syncing every
phase would charge autoregressive decoding one sync per token and speculative decoding one per
round. On CPU both readings are ``time.perf_counter``.
"""

from __future__ import annotations

import time

import torch


class Clock:
    def __init__(self, device: torch.device | str = "cpu", phases: bool = False):
        self.device = torch.device(device)
        self._cuda = self.device.type == "cuda"
        self.phases = bool(phases)
        self.syncs = 0  # device synchronisations so far (tests count them)

    def _sync(self) -> None:
        if self._cuda:
            torch.cuda.synchronize(self.device)
            self.syncs += 1

    def boundary(self) -> float:
        """A reading at the start or end of a timed region: always waits for the device."""
        self._sync()
        return time.perf_counter()

    def now(self) -> float:
        """A reading inside a timed region: waits for the device only with ``phases``."""
        if self.phases:
            self._sync()
        return time.perf_counter()
