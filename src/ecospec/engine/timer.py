"""Phase timings of a decode step through one timer. On a GPU every mark records a CUDA event and the step's
durations are read once, at its end: one synchronisation a step, not one per phase (each would stall the host
until the device drains, and the host's lead is what hides launch overhead). On a CPU the marks are
`perf_counter` readings. Either way the decoding thread's CPU time of the step is read beside them.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import torch


class StepTimer:
    """`start()`, then `mark(name)` at the end of each phase, then `stop()` -> {phase: seconds, "total": s,
    "cpu": s}. `event` and `synchronize` are injectable (tests count synchronisations without a GPU)."""

    def __init__(self, device: torch.device, event: Callable | None = None, synchronize: Callable | None = None):
        self.cuda = device.type == "cuda"
        if self.cuda:
            self._event = event or (lambda: torch.cuda.Event(enable_timing=True))
            self._sync = synchronize or (lambda: torch.cuda.synchronize(device))
        else:
            self._event, self._sync = event, synchronize
        self._marks: list[tuple[str, object]] = []
        self._cpu0 = 0.0

    def _now(self):
        if self._event is None:
            return time.perf_counter()
        e = self._event()
        e.record()
        return e

    def start(self) -> None:
        self._marks = [("", self._now())]
        self._cpu0 = time.thread_time()

    def mark(self, name: str) -> None:
        self._marks.append((name, self._now()))

    def stop(self, mark: str | None = None) -> dict[str, float]:
        """Seconds of every phase since the previous mark (`mark`: one more, ending now), the step's total and its
        CPU time (one sync)."""
        if mark is not None:
            self.mark(mark)
        cpu = time.thread_time() - self._cpu0
        if self._sync is not None:
            self._sync()
        out: dict[str, float] = {}
        for (_, a), (name, b) in zip(self._marks, self._marks[1:], strict=False):
            out[name] = out.get(name, 0.0) + self._seconds(a, b)
        out["total"] = self._seconds(self._marks[0][1], self._marks[-1][1])
        out["cpu"] = cpu
        return out

    @staticmethod
    def _seconds(a, b) -> float:
        if isinstance(a, float):
            return b - a
        return a.elapsed_time(b) / 1e3  # CUDA events: milliseconds
