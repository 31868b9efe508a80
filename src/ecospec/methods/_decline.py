"""What the methods that may decline to speculate share (EcoSpec-Adaptive, adaptive_verify): whether a step that
drafts could pay at all, whether starting to draft repays its catch-up, and how long to wait after a step that did
not pay before drafting again."""

from __future__ import annotations

from ecospec.methods._rate import drafted_seconds

FIRST_SKIP, GROWTH, MAX_SKIP = 8, 8, 64  # steps that draft nothing after a step that did not pay, and their growth


class Backoff:
    """The steps that draft nothing after one that did not pay: `FIRST_SKIP`, then `GROWTH` times as many each time
    in a row, up to `MAX_SKIP`; a step that pays starts over."""

    def __init__(self):
        self.skip, self.left = FIRST_SKIP, 0

    def waiting(self) -> bool:
        """Whether this step drafts nothing (and one step less to wait)."""
        waiting, self.left = self.left > 0, max(0, self.left - 1)
        return waiting

    def lost(self) -> None:
        self.left, self.skip = self.skip, min(GROWTH * self.skip, MAX_SKIP)

    def paid(self) -> None:
        self.skip = FIRST_SKIP


def best_gain(cost, depth: int, gamma: int, predictor: bool = False) -> float:
    """Seconds per token produced that a step drafting `depth` levels of a tree saves over AR steps when every
    drafted token on its path is accepted (the best case: its other nodes add time, not tokens); <= 0: it cannot
    pay."""
    path = min(depth, gamma - 1)
    drafted = drafted_seconds(cost, depth, "tree", predictor=predictor)
    return ((1 + path) * cost.ar_step_s - cost.t_step(drafted, path + 1)) / (1 + path)


def repays(cost, gain: float, behind: int, left: int | None, gamma: int, predictor: bool = False) -> bool:
    """Whether drafting now could repay its catch-up over the `behind` tokens the drafter has not seen
    (`VerifyProfile.t_catchup`): at best each of the `left` tokens still to come gains `gain` (`best_gain`)."""
    catchup = cost.t_catchup(behind, gamma, predictor=predictor)
    return not catchup or left is None or gain * left > catchup
