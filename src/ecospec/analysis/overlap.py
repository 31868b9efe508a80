"""Routing-overlap statistics of expert sets across tokens (overlap paper, Tables 2/3, 13, 17-20, Figure 10).

Input: `routes`, an int array [tokens, MoE layers, k] of one sequence's routed experts (distinct within a set).
Definitions, all per MoE layer and then averaged over layers with equal weight:

* overlap at step distance d: mean over token pairs (t, t+d) of |S_t ∩ S_{t+d}| / k.
* baselines of the step overlap: uniform k/N; independence Σ_e π_e² / k, with π_e the layer's per-token
  activation probability of expert e measured on the same tokens (Σ_e π_e = k). Two tokens routed
  independently with these marginals share Σ_e π_e² experts on average.
* temporal = empirical step-1 overlap − independence; temporal share = temporal / empirical, the paper's
  "fraction of overlap attributable to temporal overlap" (Table 2, lines 37-41 of the paper's text, and Table 13:
  Mixtral 0.102 / 0.355 = 28.7 %, Qwen3-30B 0.312 / 0.431 = 72.4 %; dividing by empirical − uniform would give
  97 % for Mixtral).
* unique experts in a window of w consecutive tokens (w = K+1 verified tokens): empirical = mean over all
  w-token windows (every start position) of |∪ S_t|; uniform N(1 − (1 − k/N)^w); independence
  Σ_e 1 − (1 − π_e)^w; unique ratio = empirical / k (Table 20's "Emp/k").

Pooling over many sequences sums the counts (token pairs and windows never cross sequences, π is measured on
all pooled tokens); `pooled` also reports each slice's statistics and their spread (Table 18).
Expert sets are held as 64-bit bitsets, so intersections and unions are AND/OR plus a popcount.
"""

from __future__ import annotations

import operator
import warnings
from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from functools import reduce

import numpy as np

_CHUNK = 1024  # tokens per block: keeps the temporaries in cache


@dataclass(frozen=True)
class RoutingCounts:
    """Sufficient statistics of routed expert sets; `+` pools two of them (same k, N, layers, distances, window)."""

    k: int
    n_experts: int
    window: int
    tokens: int
    pairs: np.ndarray  # [max_distance] token pairs (t, t+d)
    intersections: np.ndarray  # [max_distance, layers] Σ over pairs of |S_t ∩ S_{t+d}|
    activations: np.ndarray  # [layers, N] tokens that routed to each expert
    windows: int  # w-token windows
    unions: np.ndarray  # [layers] Σ over windows of |∪ S_t|

    def __add__(self, other: RoutingCounts) -> RoutingCounts:
        if (self.k, self.n_experts, self.window, self.pairs.shape, self.activations.shape) != (
            other.k,
            other.n_experts,
            other.window,
            other.pairs.shape,
            other.activations.shape,
        ):
            raise ValueError("cannot pool routing counts with different k, N, layers, distances or window")
        return RoutingCounts(
            self.k,
            self.n_experts,
            self.window,
            self.tokens + other.tokens,
            self.pairs + other.pairs,
            self.intersections + other.intersections,
            self.activations + other.activations,
            self.windows + other.windows,
            self.unions + other.unions,
        )


@dataclass(frozen=True)
class RoutingStats:
    """Overlap and unique-expert statistics of a set of tokens (see the module docstring for definitions)."""

    k: int
    n_experts: int
    window: int
    tokens: int
    overlap: np.ndarray  # [max_distance] empirical overlap ratio at d = 1 .. max_distance
    uniform: float  # k / N
    independence: float  # Σ_e π_e² / k, mean over layers
    layer_overlap: np.ndarray  # [layers] step-1 overlap (Table 19, Figure 10)
    layer_independence: np.ndarray  # [layers] Σ_e π_e² / k of each layer
    probs: np.ndarray  # [layers, N] π: per-token activation probability of each expert (rows sum to k)
    unique_uniform: float  # N (1 − (1 − k/N)^w)
    unique_independence: float  # Σ_e 1 − (1 − π_e)^w, mean over layers
    unique_empirical: float  # mean |∪ S_t| over w-token windows and layers

    @property
    def temporal(self) -> float:
        """Step-1 overlap beyond independence (Table 2 "Temporal")."""
        return float(self.overlap[0] - self.independence)

    @property
    def temporal_share(self) -> float:
        """Temporal / empirical step-1 overlap (Table 2 "Temp/Total"); nan when the empirical overlap is 0."""
        return self.temporal / self.overlap[0] if self.overlap[0] > 0 else float("nan")

    @property
    def unique_ratio(self) -> float:
        """Empirical unique experts per window / k (Table 20 "Emp/k")."""
        return self.unique_empirical / self.k

    @classmethod
    def from_counts(cls, c: RoutingCounts) -> RoutingStats:
        with np.errstate(invalid="ignore", divide="ignore"):
            layer_overlaps = c.intersections / (c.pairs[:, None] * c.k)  # nan where a distance has no pair
            probs = c.activations / c.tokens
            layer_independence = (probs**2).sum(axis=1) / c.k
            unique_layers = c.unions / c.windows
        n, k, w = c.n_experts, c.k, c.window
        return cls(
            k=k,
            n_experts=n,
            window=w,
            tokens=c.tokens,
            overlap=layer_overlaps.mean(axis=1),
            uniform=k / n,
            independence=float(layer_independence.mean()),
            layer_overlap=layer_overlaps[0],
            layer_independence=layer_independence,
            probs=probs,
            unique_uniform=n * (1 - (1 - k / n) ** w),
            unique_independence=float((1 - (1 - probs) ** w).sum(axis=1).mean()),
            unique_empirical=float(unique_layers.mean()),
        )


@dataclass(frozen=True)
class Spread:
    """A statistic across data slices: mean of the slices' values, and their min and max."""

    mean: float | np.ndarray
    min: float | np.ndarray
    max: float | np.ndarray


@dataclass(frozen=True)
class Pooled:
    """Statistics pooled over all sequences, and per data slice."""

    all: RoutingStats
    slices: dict[Hashable, RoutingStats]

    def spread(self, name: str) -> Spread:
        """Spread across slices of a `RoutingStats` field or property, e.g. "overlap" or "temporal_share"; slices
        where it is undefined (nan: no token pair at that distance, zero overlap for a share) are left out."""
        values = np.array([getattr(s, name) for s in self.slices.values()], dtype=float)
        with warnings.catch_warnings():  # a value undefined in every slice stays nan
            warnings.simplefilter("ignore", RuntimeWarning)
            stats = (np.nanmean(values, axis=0), np.nanmin(values, axis=0), np.nanmax(values, axis=0))
        return Spread(*(_scalar(x) for x in stats))


def _scalar(x: np.ndarray) -> float | np.ndarray:
    return float(x) if x.ndim == 0 else x


def routing_counts(routes, n_experts: int, max_distance: int = 4, window: int = 4) -> RoutingCounts:
    """Count what `RoutingStats` needs from one sequence's routes [tokens, layers, k]."""
    routes = _check(routes, n_experts)
    if max_distance < 1 or window < 1:
        raise ValueError(f"max_distance and window must be >= 1, got {max_distance} and {window}")
    tokens, layers, k = routes.shape
    bitsets = _bitsets(routes, n_experts)
    windows, unions = _window_unions(bitsets, window)
    activations = np.zeros((layers, n_experts), np.int64)
    layer_offsets = (np.arange(layers) * n_experts)[:, None]
    for start in range(0, tokens, _CHUNK):
        flat = (routes[start : start + _CHUNK].astype(np.int64) + layer_offsets).ravel()
        activations += np.bincount(flat, minlength=layers * n_experts).reshape(layers, n_experts)
    return RoutingCounts(
        k=k,
        n_experts=n_experts,
        window=window,
        tokens=tokens,
        pairs=np.maximum(tokens - np.arange(1, max_distance + 1), 0),
        intersections=_intersections(bitsets, max_distance),
        activations=activations,
        windows=windows,
        unions=unions,
    )


def pooled(
    routes_list: Sequence,
    n_experts: int,
    slices: Sequence[Hashable] | None = None,
    max_distance: int = 4,
    window: int = 4,
) -> Pooled:
    """Statistics over many sequences: pooled over all, and per slice (`slices[i]` labels sequence i, e.g. its
    dataset category; None makes each sequence its own slice)."""
    if slices is None:
        slices = range(len(routes_list))
    if len(slices) != len(routes_list):
        raise ValueError(f"{len(routes_list)} sequences but {len(slices)} slice labels")
    if not routes_list:
        raise ValueError("no sequences to pool")
    per_slice: dict[Hashable, RoutingCounts] = {}
    for label, routes in zip(slices, routes_list, strict=True):
        counts = routing_counts(routes, n_experts, max_distance, window)
        per_slice[label] = per_slice[label] + counts if label in per_slice else counts
    total = reduce(operator.add, per_slice.values())
    return Pooled(
        all=RoutingStats.from_counts(total),
        slices={label: RoutingStats.from_counts(c) for label, c in per_slice.items()},
    )


def _check(routes, n_experts: int) -> np.ndarray:
    routes = np.asarray(routes)
    if routes.ndim != 3 or not np.issubdtype(routes.dtype, np.integer) or routes.size == 0:
        raise ValueError(f"routes must be a non-empty int array [tokens, layers, k], got {routes.dtype} {routes.shape}")
    if routes.min() < 0 or routes.max() >= n_experts:
        raise ValueError(f"expert ids must lie in [0, {n_experts}), got {routes.min()}..{routes.max()}")
    return routes


def _bitsets(routes: np.ndarray, n_experts: int) -> np.ndarray:
    """Expert sets as bitsets [tokens, layers, words] (uint64; expert e is bit e % 64 of word e // 64)."""
    tokens, layers, k = routes.shape
    words = -(-n_experts // 64)
    out = np.zeros((tokens, layers, words), np.uint64)
    shift = np.empty((_CHUNK, layers), np.int64)
    for start in range(0, tokens, _CHUNK):
        block, bits = routes[start : start + _CHUNK], out[start : start + _CHUNK]
        s = shift[: len(block)]
        for j in range(k):
            for w in range(words):  # a shift outside [0, 64) (negative ones wrap to huge) gives 0 in numpy
                np.subtract(block[..., j], 64 * w, out=s, dtype=np.int64)
                bits[..., w] |= np.left_shift(np.uint64(1), s.view(np.uint64))
    counts = np.bitwise_count(out)
    sizes = reduce(operator.add, (counts[..., w].astype(np.int16) for w in range(words)))
    if np.any(sizes != k):
        raise ValueError("routes repeat an expert within a token's set")
    return out


def _intersections(bitsets: np.ndarray, max_distance: int) -> np.ndarray:
    """Σ over token pairs (t, t+d) of |S_t ∩ S_{t+d}|, per distance d = 1 .. max_distance and layer."""
    tokens, layers, _ = bitsets.shape
    out = np.zeros((max_distance, layers), np.int64)
    for d in range(1, max_distance + 1):
        for start in range(0, tokens - d, _CHUNK):
            stop = min(start + _CHUNK, tokens - d)
            out[d - 1] += _popcount(bitsets[start:stop] & bitsets[start + d : stop + d])
    return out


def _window_unions(bitsets: np.ndarray, window: int) -> tuple[int, np.ndarray]:
    """Number of `window`-token windows and Σ over them of |∪ S_t| per layer."""
    tokens, layers, _ = bitsets.shape
    windows = max(tokens - window + 1, 0)
    out = np.zeros(layers, np.int64)
    for start in range(0, windows, _CHUNK):
        stop = min(start + _CHUNK, windows)
        union = bitsets[start:stop].copy()
        for t in range(1, window):
            union |= bitsets[start + t : stop + t]
        out += _popcount(union)
    return windows, out


def _popcount(bitsets: np.ndarray) -> np.ndarray:
    """Σ over tokens of the set sizes, per layer."""
    return np.bitwise_count(bitsets).sum(axis=0, dtype=np.int64).sum(axis=-1)
