"""Maximum-entropy (IPF) model of the unique experts a window of tokens activates, from routing-overlap statistics.

Overlap paper, Tables 3 and 20. Each expert's activation pattern over a window of w tokens is a point of {0,1}^w.
Its distribution is the maximum-entropy one that matches (a) the per-token marginal P(active at t) = π_e and
(b) for every pair of positions at distance d, P(active at t and t+d) = π_e · overlaps[d−1]: the chance that an
expert active at one token is active again d tokens later is the measured step-d overlap ratio (the overlap ratio
is Σ_e P(e at t and t+d) / k, so with π summing to k the pairs reproduce it exactly). The maximum-entropy
distribution under these constraints is the log-linear model with singleton and pairwise terms; iterative
proportional fitting of every pair's 2x2 table, started from the uniform distribution, converges to it.
The predicted number of unique experts in the window is Σ_e (1 − P_e(never active)).

"Uniform IPF" gives every expert π = k/N; "skewed IPF" gives each its own measured activation probability.
From the paper's Table 17 step overlaps the uniform IPF reproduces Table 20's column to 0.07 %
(`tests/test_overlap_ipf.py`).
"""

from __future__ import annotations

from itertools import combinations

import numpy as np

_TOL = 1e-12  # largest error of any pair's 2x2 table at convergence
_MAX_SWEEPS = 5000  # realistic overlaps take 10-50 sweeps; a near-deterministic Markov chain ~2000
_CHECK = 250  # every _CHECK sweeps the residual must at least halve, else IPF stops ...
_LOOSE = 1e-6  # ... and accepts a residual this small: targets at the edge of feasibility converge sublinearly
_SLACK = 1e-9  # rounding allowed in the bounds of the inputs


def unique_experts(k: int, n: int, overlaps, window: int = 4, loads=None) -> float:
    """Predicted unique experts per MoE layer in a window of `window` tokens (e.g. K+1 verified tokens).

    `overlaps[d-1]` is the overlap ratio at step distance d (d = 1 .. window−1; extra entries are ignored).
    `loads`: None for uniform IPF (π = k/n for every expert), else per-expert activation probabilities, shape
    [n] or [layers, n], each row in [0, 1] and summing to k (normalise counts first: counts / tokens); with
    several layers the result is the mean over layers.
    """
    if not (isinstance(k, int | np.integer) and isinstance(n, int | np.integer) and 1 <= k <= n):
        raise ValueError(f"need integers 1 <= k <= n, got k={k}, n={n}")
    if loads is None:
        probs = np.full((1, n), k / n)
    else:
        probs = np.atleast_2d(np.asarray(loads, dtype=float))
        if probs.ndim != 2 or probs.shape[1] != n:
            raise ValueError(f"loads must have shape [{n}] or [layers, {n}], got {np.shape(loads)}")
        sums = probs.sum(axis=1)
        worst = sums[np.argmax(np.abs(sums - k))]
        if abs(worst - k) > 1e-6 * k:
            raise ValueError(f"loads must sum to k={k} per layer (activation probabilities), got a sum of {worst:.6g}")
    patterns = pattern_distribution(probs.ravel(), overlaps, window)
    return float((1.0 - patterns[:, 0]).reshape(probs.shape).sum(axis=1).mean())


def pattern_distribution(probs, overlaps, window: int = 4) -> np.ndarray:
    """Maximum-entropy distribution of each expert's activation pattern: [experts, 2**window].

    Column c is the pattern whose token t (0 = first in the window) is active iff bit t of c is set; column 0 is
    "never active". `probs` are the experts' per-token activation probabilities π_e; `overlaps` as in
    `unique_experts`. Raises ValueError when the targets are out of range or not jointly feasible.
    """
    probs = np.atleast_1d(np.asarray(probs, dtype=float))
    overlaps = np.asarray(overlaps, dtype=float).ravel()
    if window < 1:
        raise ValueError(f"window must be >= 1 token, got {window}")
    if overlaps.size < window - 1:
        need = f"distances 1..{window - 1}"
        raise ValueError(f"a window of {window} tokens needs overlaps at {need}, got {overlaps.size} values")
    overlaps = overlaps[: window - 1]
    shown = np.round(overlaps, 4).tolist()
    if np.any((overlaps < 0) | (overlaps > 1)) or not np.all(np.isfinite(overlaps)):
        raise ValueError(f"overlaps must lie in [0, 1], got {shown}")
    if probs.ndim != 1 or np.any((probs < -_SLACK) | (probs > 1 + _SLACK)) or not np.all(np.isfinite(probs)):
        raise ValueError("activation probabilities must lie in [0, 1]")
    probs = probs.clip(0, 1)
    if window == 1:
        return np.stack([1 - probs, probs], axis=1)

    cells = np.arange(2**window)
    bits = (cells[:, None] >> np.arange(window)) & 1  # [cells, window]
    pairs = list(combinations(range(window), 2))
    # indicator of each pair's joint state s = 2·x_j + x_i for every cell: [pairs, cells, 4]
    states = np.stack([bits[:, j] * 2 + bits[:, i] for i, j in pairs])
    onehot = (states[..., None] == np.arange(4)).astype(float)

    # targets per pair and expert: P(00), P(10) = P(01), P(11) (x_i first)
    both = probs[None, :] * np.array([overlaps[j - i - 1] for i, j in pairs])[:, None]  # [pairs, experts]
    single = probs[None, :] - both
    none = 1.0 - 2.0 * probs[None, :] + both
    if np.any(none < -_SLACK):
        e = np.unravel_index(np.argmin(none), none.shape)[1]
        raise ValueError(
            f"infeasible: an expert with activation probability {probs[e]:.4g} is active at both of two tokens with "
            f"probability >= 2π − 1 = {2 * probs[e] - 1:.4g}, more than π · overlap allows for overlaps {shown}"
        )
    targets = np.stack([none.clip(0), single, single, both], axis=-1)  # [pairs, experts, 4]

    p = np.full((probs.size, 2**window), 2.0**-window)
    checkpoint = np.inf
    for sweep in range(1, _MAX_SWEEPS + 1):
        error = 0.0
        for a in range(len(pairs)):
            margin = p @ onehot[a]  # [experts, 4]
            error = max(error, float(np.abs(margin - targets[a]).max()))
            ratio = np.divide(targets[a], margin, out=np.zeros_like(margin), where=margin > 0)
            p *= ratio[:, states[a]]
        if error < _TOL:
            return p
        if sweep % _CHECK == 0:
            if error > 0.5 * checkpoint:
                break
            checkpoint = error
    if error < _LOOSE:
        return p
    raise ValueError(
        f"infeasible: no distribution over {window}-token patterns has overlaps {shown} "
        f"(IPF residual {error:.2g} after {sweep} sweeps)"
    )
