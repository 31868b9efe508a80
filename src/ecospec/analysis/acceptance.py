"""Acceptance and routing (overlap paper, Tables 14-16 and Figure 9): do accepted draft tokens route like their
parent more, or less, than rejected ones?

Deconfounded as the paper does: deeper tokens overlap less with their parent and are accepted less, so accepted
and rejected tokens are compared within one draft depth j, and only first-rejected tokens (the first rejection on
a branch; see `analysis.traces`) stand for the rejected ones. Per depth: the consecutive overlap (token vs its
parent) of accepted vs first-rejected tokens via `analysis.stats.compare_groups` (Δ = accepted − rejected, Cohen's
d, Welch's p, size label), and the anchor overlap (token vs the root, depth 0 → j) of both groups.

Held-out summary (Table 16): per data slice (our slices: datasets) Δ_j and the anchor drop, then their medians
across slices. The anchor drop of a slice is the mean, over its compared tokens (accepted or first-rejected) at
depth >= 2, of consecutive overlap − anchor overlap: how much less a token shares with the root than with its
parent (the paper gives no formula; this reading puts Qwen3-30B's Table 17 overlaps, 0.431 − (0.356 + 0.328) / 2
= +0.089, in the range of its Table 16 column, +0.085 / +0.095).
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping
from dataclasses import dataclass

import numpy as np

from ecospec.analysis.stats import GroupComparison, compare_groups
from ecospec.analysis.traces import DraftTokens


@dataclass(frozen=True)
class DepthComparison:
    """Accepted vs first-rejected tokens at one draft depth; a comparison is None when a group has < 2 tokens."""

    depth: int
    n_accepted: int
    n_first_rejected: int
    overlap_accepted: float  # mean consecutive overlap (nan without tokens)
    overlap_first_rejected: float
    sem_accepted: float  # standard error of those means
    sem_first_rejected: float
    consecutive: GroupComparison | None
    anchor_accepted: float  # mean overlap with the root
    anchor_first_rejected: float
    anchor_sem_accepted: float
    anchor_sem_first_rejected: float
    anchor: GroupComparison | None


def _mean_sem(x: np.ndarray) -> tuple[float, float]:
    if x.size == 0:
        return float("nan"), float("nan")
    return float(x.mean()), float(x.std(ddof=1) / np.sqrt(x.size)) if x.size > 1 else float("nan")


def _compare(a: np.ndarray, b: np.ndarray) -> GroupComparison | None:
    return compare_groups(a, b) if a.size >= 2 and b.size >= 2 else None


def compare_by_depth(tokens: DraftTokens) -> list[DepthComparison]:
    """One comparison per draft depth present among the accepted or first-rejected tokens, by depth."""
    out = []
    for depth in np.unique(tokens.depth[tokens.accepted | tokens.first_rejected]):
        at = tokens.depth == depth
        acc, rej = tokens.select(at & tokens.accepted), tokens.select(at & tokens.first_rejected)
        (oa, sa), (orj, srj) = _mean_sem(acc.overlap), _mean_sem(rej.overlap)
        (aa, asa), (arj, asr) = _mean_sem(acc.anchor), _mean_sem(rej.anchor)
        out.append(
            DepthComparison(
                depth=int(depth),
                n_accepted=len(acc),
                n_first_rejected=len(rej),
                overlap_accepted=oa,
                overlap_first_rejected=orj,
                sem_accepted=sa,
                sem_first_rejected=srj,
                consecutive=_compare(acc.overlap, rej.overlap),
                anchor_accepted=aa,
                anchor_first_rejected=arj,
                anchor_sem_accepted=asa,
                anchor_sem_first_rejected=asr,
                anchor=_compare(acc.anchor, rej.anchor),
            )
        )
    return out


def anchor_drop(tokens: DraftTokens) -> float:
    """Mean consecutive − anchor overlap of the compared tokens at depth >= 2 (nan if there are none)."""
    keep = (tokens.accepted | tokens.first_rejected) & (tokens.depth >= 2)
    return float((tokens.overlap[keep] - tokens.anchor[keep]).mean()) if keep.any() else float("nan")


@dataclass(frozen=True)
class HeldOut:
    """Medians across data slices of Δ_j (accepted − first-rejected consecutive overlap) and of the anchor drop."""

    delta: dict[int, float]  # depth -> median Δ over the slices where it is defined
    anchor_drop: float
    slices: int  # slices with at least one defined value


def held_out(tokens_by_slice: Mapping[Hashable, DraftTokens]) -> HeldOut:
    """Table 16's summary over data slices (a slice's Δ_j needs two tokens in each group at depth j)."""
    deltas: dict[int, list[float]] = {}
    drops, used = [], 0
    for tokens in tokens_by_slice.values():
        any_value = False
        for c in compare_by_depth(tokens):
            if c.consecutive is not None:
                deltas.setdefault(c.depth, []).append(c.consecutive.delta)
                any_value = True
        drop = anchor_drop(tokens)
        if np.isfinite(drop):
            drops.append(drop)
            any_value = True
        used += any_value
    median = {d: float(np.median(v)) for d, v in sorted(deltas.items())}
    return HeldOut(median, float(np.median(drops)) if drops else float("nan"), used)
