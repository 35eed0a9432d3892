"""Clocks for honest timing: CUDA work is synchronised at every boundary we read the clock at."""

from __future__ import annotations

import time

import torch


class Clock:
    """Wall clock that first waits for queued device work, so a reading covers what was launched.

    On CPU this is ``time.perf_counter``. On CUDA every reading synchronises the device, which is
    what makes per-round draft/verify times meaningful (and costs a few microseconds per reading).
    """

    def __init__(self, device: torch.device | str = "cpu"):
        self.device = torch.device(device)
        self._cuda = self.device.type == "cuda"

    def now(self) -> float:
        if self._cuda:
            torch.cuda.synchronize(self.device)
        return time.perf_counter()
