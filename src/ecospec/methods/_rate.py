"""What the cost-model methods share: pricing a step in seconds with the verify-cost profile
(`analysis.verify_profile.VerifyProfile`) and picking the block with the most expected tokens per second."""

from __future__ import annotations

from collections.abc import Sequence


def drafted_seconds(cost, passes: int, shape: str, predictor: bool = False) -> float:
    """What a step has spent before its verify pass: `passes` head passes of `shape` ("tree", "chain") and the
    expert predictor's pass, as the profile prices them (a drafter the profile has no pass for costs nothing)."""
    seconds = passes * cost.draft_pass_s.get(shape, 0.0)
    return seconds + ((cost.predictor_pass_s or 0.0) if predictor else 0.0)


def best_prefix(probs: Sequence[float], seconds: Sequence[float], base: float = 1.0) -> tuple[int, float]:
    """(n, its rate): the n (0 .. len(probs)) that maximises the expected tokens of a step verifying the first n
    candidates, `base` (the bonus tokens: one a sequence) + their summed acceptance estimates `probs`, per second
    of the step `seconds[n]`. Ties go to the smaller n (as many tokens for less work)."""
    best, best_rate, gained = 0, 0.0, base
    for n, t in enumerate(seconds):
        gained += probs[n - 1] if n else 0.0
        rate = gained / t
        if rate > best_rate * (1 + 1e-12):
            best, best_rate = n, rate
    return best, best_rate
