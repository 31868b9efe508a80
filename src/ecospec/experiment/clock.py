"""Which clock a cell's tokens/s and speedup divide by.

`wall`: perf_counter (with device synchronisation on a GPU). On a shared CPU machine it also counts the moments the
OS gave the core to another process, so a busy neighbour moves a cell's speedup. `thread_cpu`: the decoding
thread's own CPU time (`time.thread_time`), which those moments do not move. It is the cost of the work only when
that thread does all of it: torch at one intra-op thread (the CPU cells' default), never on a GPU, where the host
thread waits for the device. Every prompt row holds both (`seconds`, `cpu_seconds`), so a record can be read under
either; `summary.clock` says which the summary used.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

CLOCKS = ("auto", "wall", "thread_cpu")
# what `clock: auto` picks on a CPU at one intra-op thread (benchmarks/studies/clock_spread.py measured the choice)
CPU_DEFAULT = "thread_cpu"


def pick_clock(requested: str | None, device: torch.device) -> tuple[str, str | None]:
    """(the clock the cell uses, why it is not the requested one or None). thread_cpu needs a CPU device at one
    intra-op thread; anywhere else the cell keeps wall time and says why."""
    requested = requested or "auto"
    if requested not in CLOCKS:
        raise ValueError(f"clock must be one of {', '.join(CLOCKS)}, got {requested!r}")
    if requested == "wall":
        return "wall", None
    if device.type != "cpu":
        return "wall", None if requested == "auto" else f"thread_cpu is a CPU clock; {device.type} cells keep wall"
    import torch  # here: validation reads CLOCKS without torch

    if torch.get_num_threads() != 1:
        why = f"thread_cpu counts one thread's work; torch runs {torch.get_num_threads()} intra-op threads"
        return "wall", None if requested == "auto" else why
    return (CPU_DEFAULT if requested == "auto" else requested), None


def now() -> tuple[float, float]:
    """(wall, this thread's CPU time) in seconds, read together."""
    return time.perf_counter(), time.thread_time()
