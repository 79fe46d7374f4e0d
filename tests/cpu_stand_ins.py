"""Stand-ins that let the benchmark's GPU path run on CPU tensors in the tests: CpuTorch is real torch with a
torch.cuda of wall-clock events, no sleep, no-op synchronization and as much free memory as asked."""

from __future__ import annotations

import time
import types


class WallEvent:
    def __init__(self, enable_timing=True):
        self.t = 0.0

    def record(self):
        self.t = time.perf_counter()

    def elapsed_time(self, other):
        return (other.t - self.t) * 1e3


class CpuTorch:
    """Real torch (CPU tensors, CPU SDPA) with a stand-in torch.cuda: wall-clock events, no sleep, free memory."""

    def __init__(self, torch, free: int = 64 * 2**30):
        self._torch = torch
        self.cuda = types.SimpleNamespace(Event=WallEvent, synchronize=lambda: None, _sleep=lambda cycles: None,
                                          empty_cache=lambda: None, mem_get_info=lambda: (free, 2 * free),
                                          memory_reserved=lambda: 0, memory_allocated=lambda: 0)

    def __getattr__(self, name):
        return getattr(self._torch, name)
