"""Whether a greedy output has degenerated into a loop: the `loop_share` of a cell's summary
(`experiment.metrics`) and of the tiny build's evaluate stage."""

from __future__ import annotations

LOOP_TAIL = 16  # tokens at the end of an output checked for a loop
LOOP_PERIOD = 2  # longest repeated pattern counted as a loop


def in_loop(tokens: list[int], tail: int = LOOP_TAIL, period: int = LOOP_PERIOD) -> bool | None:
    """Whether the last `tail` tokens are one token or one pattern of at most `period` tokens repeated (greedy
    decoding of a weak model degenerates so); None for outputs shorter than `tail` (stopped at eos early)."""
    if len(tokens) < tail:
        return None
    end = tokens[-tail:]
    return any(all(end[i] == end[i % p] for i in range(tail)) for p in range(1, period + 1))
