"""Paired bootstrap intervals for the ratios a cell reports (speedup, α, E) and for method-against-method ratios.

Every statistic here is a function of column sums over resampling units: a unit is a prompt (all its turns: a
multi-turn prompt resamples as one) or, in a batched cell, a batch (its sequences decode together). The columns of
a unit hold what the cell sums over it (tokens and seconds of the method and of each AR, accepted tokens and steps,
expert counts and verify passes), so a resample recomputes the cell's own estimate, ratio of sums and all, on the
resampled units. Units may be split into strata (benchmarks): each stratum resamples on its own, so that an
average over benchmarks keeps one estimate per benchmark in every resample.

The interval is the expanded percentile interval (Hesterberg 2015, "What teachers should know about the
bootstrap", §4.4): the bootstrap distribution's quantiles at Φ(±√(n/(n−1)) t_{n−1}) instead of 2.5 % and 97.5 %,
which widens the percentile interval by what a small sample hides (its narrowness bias). At the cells' own 8
prompts a plain percentile interval of a speedup covers the truth too rarely and BCa no better; the expanded one
comes close to its nominal 95 % (`tests/test_bootstrap.py` measures it at 8 and 16 prompts; the coverages:
docs/grids.md). With strata, n is the number of
units less one per stratum beyond the first (each stratum's mean costs a degree of freedom). Seeded: the same units
give the same interval.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from statistics import NormalDist

import numpy as np
from scipy.special import stdtrit

RESAMPLES = 2000
LEVEL = 0.95
SEED = 0

# statistic(list of per-stratum column sums, each [R, k]) -> [R]
Statistic = Callable[[list[np.ndarray]], np.ndarray]


@dataclass(frozen=True)
class Interval:
    """A point estimate and its two-sided interval at `level`, from `resamples` resamples of `units` units."""

    estimate: float
    low: float
    high: float
    level: float
    method: str  # expanded | percentile (`bootstrap`'s argument)
    resamples: int
    units: int
    unit: str  # prompt | batch

    def holds(self, value: float) -> bool:
        return self.low <= value <= self.high

    def as_dict(self) -> dict:
        return asdict(self)


def bootstrap(
    strata: Sequence[np.ndarray],
    statistic: Statistic,
    resamples: int = RESAMPLES,
    level: float = LEVEL,
    seed: int = SEED,
    method: str = "expanded",
    unit: str = "prompt",
) -> Interval | None:
    """The interval of `statistic` over the units of `strata` (each an array [units, columns]); None when a stratum
    has fewer than 2 units or the estimate is undefined (nothing to resample, or a zero denominator)."""
    data = [np.asarray(s, dtype=float) for s in strata]
    if not data or any(d.ndim != 2 or len(d) < 2 for d in data):
        return None
    with np.errstate(divide="ignore", invalid="ignore"):
        estimate = float(statistic([d.sum(0)[None] for d in data])[0])
    if not np.isfinite(estimate):
        return None
    rng = np.random.default_rng(seed)
    sums = [rng.multinomial(len(d), np.full(len(d), 1 / len(d)), size=resamples) @ d for d in data]
    with np.errstate(divide="ignore", invalid="ignore"):
        boot = np.asarray(statistic(sums), dtype=float)
    boot = boot[np.isfinite(boot)]
    if len(boot) < resamples // 2:
        return None
    n = sum(len(d) for d in data)
    tail = (1 - level) / 2
    if method == "expanded":
        df = n - len(data)  # one degree of freedom per stratum
        tail = NormalDist().cdf(-np.sqrt((df + 1) / df) * t_quantile(1 - tail, df))
    elif method != "percentile":
        raise ValueError(f"unknown interval method {method!r}: expanded or percentile")
    lo, hi = np.quantile(boot, [tail, 1 - tail])
    return Interval(estimate, float(lo), float(hi), level, method, resamples, n, unit)


def t_quantile(q: float, df: int) -> float:
    """Student's t quantile (`scipy.special.stdtrit`, the inverse of the t CDF that `scipy.stats.t.ppf` calls)."""
    return float(stdtrit(df, q))


# -------------------------------------------------------------------------------------------- statistics


def ratio(num: int, den: int) -> Statistic:
    """sum(column num) / sum(column den) of a single stratum, e.g. α = accepted / steps."""
    return lambda sums: sums[0][:, num] / sums[0][:, den]


def ratio_of(a: Statistic, b: Statistic, columns_a: slice, columns_b: slice) -> Statistic:
    """a / b where a reads columns `columns_a` of each unit and b `columns_b`: two cells' estimates on the same
    units (method against method), each with its own denominator."""
    return lambda sums: a([s[:, columns_a] for s in sums]) / b([s[:, columns_b] for s in sums])


# a unit's columns for the speedup: the method's tokens and seconds, our AR's, transformers' generate's (0, 0: none)
SPEEDUP_COLUMNS = ("tokens", "seconds", "ar_tokens", "ar_seconds", "hf_tokens", "hf_seconds")


def speedup(sums: list[np.ndarray]) -> np.ndarray:
    """A cell's speedup from its summed columns (SPEEDUP_COLUMNS): the method's tokens/s over the faster AR's, the
    choice the cell makes (`experiment.cell`), remade on every resample."""
    s = sums[0]
    with np.errstate(divide="ignore", invalid="ignore"):
        ar = np.fmax(s[:, 2] / s[:, 3], s[:, 4] / s[:, 5])  # fmax: an AR that was not timed (0/0) is no candidate
        return (s[:, 0] / s[:, 1]) / ar
