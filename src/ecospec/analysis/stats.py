"""Two-group comparisons as the overlap paper reports them (Tables 14-15: accepted vs. first-rejected tokens).

Δ = mean(a) − mean(b): `compare_groups(accepted, rejected)` gives the paper's sign (negative Δ and d = rejected
tokens have higher overlap). Cohen's d divides Δ by the pooled standard deviation
sqrt(((n_a − 1) s_a² + (n_b − 1) s_b²) / (n_a + n_b − 2)); the p-value is Welch's two-sided t-test. Size labels
follow Cohen's thresholds on |d|, as in Table 15 (d = −0.19 negligible, −0.26 small, −0.38 small).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy.special import stdtr

# Cohen's thresholds: |d| below each bound gets its label
_SIZES = ((0.2, "negligible"), (0.5, "small"), (0.8, "medium"), (np.inf, "large"))


@dataclass(frozen=True)
class GroupComparison:
    """Difference of means of two samples, its standardised size and significance."""

    delta: float  # mean(a) − mean(b)
    cohen_d: float
    p_value: float  # Welch's t-test, two-sided
    size: str  # negligible / small / medium / large
    n_a: int
    n_b: int


def compare_groups(a, b) -> GroupComparison:
    """Compare sample `a` with sample `b` (each needs at least two values)."""
    a, b = np.asarray(a, dtype=float).ravel(), np.asarray(b, dtype=float).ravel()
    if a.size < 2 or b.size < 2:
        raise ValueError(f"each group needs at least two values, got {a.size} and {b.size}")
    delta = float(a.mean() - b.mean())
    pooled_var = ((a.size - 1) * a.var(ddof=1) + (b.size - 1) * b.var(ddof=1)) / (a.size + b.size - 2)
    d = delta / np.sqrt(pooled_var) if pooled_var > 0 else float("nan")
    return GroupComparison(delta, float(d), welch_p(a, b), size_label(d), int(a.size), int(b.size))


def welch_p(a: np.ndarray, b: np.ndarray) -> float:
    """Welch's two-sided t-test p-value (unequal variances, Welch-Satterthwaite degrees of freedom): the steps of
    `scipy.stats.ttest_ind(a, b, equal_var=False)`, to the last bit, through `scipy.special.stdtr`, whose import
    costs a fraction of `scipy.stats`'s. nan when both samples are constant and equal, 0 when constant and
    different."""
    vn_a, vn_b = _sample_var(a) / a.size, _sample_var(b) / b.size
    diff = a.mean() - b.mean()
    if vn_a + vn_b == 0:
        return float("nan") if diff == 0 else 0.0
    df = (vn_a + vn_b) ** 2 / (vn_a**2 / (a.size - 1) + vn_b**2 / (b.size - 1))
    t = diff / np.sqrt(vn_a + vn_b)
    return float(2 * stdtr(df, -abs(t)))


def _sample_var(x: np.ndarray) -> float:
    """The unbiased variance as scipy computes it (the mean squared deviation, then n / (n − 1))."""
    return np.mean((x - x.mean()) ** 2) * (x.size / (x.size - 1))


def size_label(d: float) -> str:
    """Cohen's label of an effect size d: negligible (|d| < 0.2), small, medium, large (|d| >= 0.8); "undefined"
    for nan."""
    return next(label for bound, label in _SIZES if abs(d) < bound) if np.isfinite(d) else "undefined"
