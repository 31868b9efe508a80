"""Routing-overlap statistics on synthetic routes with known answers, the maximum-entropy IPF model against the
overlap paper's Table 20 and a brute-force solver, and the two-group comparison against scipy."""

from __future__ import annotations

from itertools import combinations

import numpy as np
import pytest
from scipy import optimize
from scipy import stats as sps

from ecospec.analysis.ipf import pattern_distribution, unique_experts
from ecospec.analysis.overlap import RoutingStats, pooled
from ecospec.analysis.stats import compare_groups

# Overlap paper, Table 17 (overlap ratio by step distance, steps 1-3) with k / N from Table 6 / Table 20, and
# Table 20's "Uniform IPF" unique experts in a four-token window (K = 3).
TABLE20_UNIFORM_IPF = [
    ("Mixtral-8x7B", 2, 8, (0.355, 0.303, 0.298), 4.99),
    ("Qwen2-57B", 8, 64, (0.204, 0.150, 0.149), 24.72),
    ("GLM-4.7-Flash", 4, 64, (0.319, 0.277, 0.245), 11.16),
    ("Qwen3-30B", 8, 128, (0.431, 0.356, 0.328), 20.08),
    ("Qwen3-235B", 8, 128, (0.447, 0.378, 0.354), 19.67),
]


def _one(routes, n_experts: int, max_distance: int = 4, window: int = 4) -> RoutingStats:
    """The statistics of one sequence: `pooled` over it alone."""
    return pooled([routes], n_experts, max_distance=max_distance, window=window).all


def _random_sets(rng, tokens, layers, n, k, weights=None):
    """i.i.d. expert sets: k distinct experts per token and layer, drawn without replacement ∝ weights."""
    logits = np.zeros(n) if weights is None else np.log(weights)
    keys = logits + rng.gumbel(size=(tokens, layers, n))
    return np.argsort(-keys, axis=-1)[..., :k]


# ---- overlap statistics ----


def test_identical_consecutive_sets_overlap_fully():
    routes = np.repeat([[[3, 5], [0, 7]]], 20, axis=0)  # [20 tokens, 2 layers, k = 2]
    s = _one(routes, 8)
    assert np.allclose(s.overlap, 1.0)
    assert s.unique_empirical == 2 and s.unique_ratio == 1.0
    assert np.allclose(s.layer_overlap, 1.0)


def test_disjoint_alternating_sets():
    sets = np.array([[0, 1], [2, 3]])
    routes = sets[np.arange(30) % 2][:, None, :]  # {0,1}, {2,3}, {0,1}, ...
    s = _one(routes, 4)
    assert np.allclose(s.overlap, [0, 1, 0, 1])
    assert s.unique_empirical == 4
    assert s.uniform == 0.5 and np.isclose(s.independence, 4 * 0.5**2 / 2)  # π = 1/2 for every expert


def test_iid_uniform_routing_overlaps_k_over_n():
    rng = np.random.default_rng(0)
    n, k = 32, 4
    routes = _random_sets(rng, 4000, 6, n, k)
    s = _one(routes, n, max_distance=3)
    assert np.allclose(s.overlap, k / n, atol=0.005)
    assert abs(s.independence - k / n) < 0.002
    assert abs(s.temporal) < 0.005
    assert s.unique_empirical == pytest.approx(s.unique_uniform, abs=0.05)


def test_iid_skewed_routing_matches_independence_baseline():
    rng = np.random.default_rng(1)
    n, k = 16, 2
    weights = np.geomspace(1, 30, n)
    routes = _random_sets(rng, 20000, 3, n, k, weights)
    s = _one(routes, n)
    assert s.independence > 1.5 * s.uniform  # skew raises the baseline
    assert np.allclose(s.overlap, s.independence, atol=0.006)
    assert np.allclose(s.layer_overlap, s.layer_independence, atol=0.01)
    assert abs(s.temporal_share) < 0.03
    assert np.allclose(s.probs.sum(axis=1), k)
    assert s.unique_independence < s.unique_uniform
    assert s.unique_empirical == pytest.approx(s.unique_independence, rel=0.01)


def test_constructed_windows_and_hand_computed_baselines():
    # layer 0: a sliding pair {t, t+1} mod 8 -> every 4-token window covers 5 experts; π uniform = 1/4
    # layer 1: expert 0 always, the other slot cycles 1, 2, 3 -> windows of 4 cover {0, 1, 2, 3}
    t = np.arange(24)
    layer0 = np.stack([t % 8, (t + 1) % 8], axis=-1)
    layer1 = np.stack([np.zeros_like(t), 1 + t % 3], axis=-1)
    routes = np.stack([layer0, layer1], axis=1)
    s = _one(routes, 8, max_distance=3)
    assert s.unique_empirical == pytest.approx((5 + 4) / 2)
    assert s.unique_ratio == pytest.approx(4.5 / 2)
    assert s.unique_uniform == pytest.approx(8 * (1 - 0.75**4))
    indep_layer1 = 1 + 3 * (1 - (2 / 3) ** 4)  # π = (1, 1/3, 1/3, 1/3, 0, ...)
    assert s.unique_independence == pytest.approx((8 * (1 - 0.75**4) + indep_layer1) / 2)
    assert s.layer_independence == pytest.approx([8 * 0.25**2 / 2, (1 + 3 / 9) / 2])
    # step overlaps: layer 0 shares one expert at d=1, none after; layer 1 shares expert 0, both at d=3
    assert s.overlap == pytest.approx([(0.5 + 0.5) / 2, (0 + 0.5) / 2, (0 + 1) / 2])
    assert s.layer_overlap == pytest.approx([0.5, 0.5])
    assert s.temporal == pytest.approx(s.overlap[0] - s.independence)
    assert s.temporal_share == pytest.approx(s.temporal / s.overlap[0])


def test_many_words_match_a_set_reference():
    rng = np.random.default_rng(2)
    n, k = 200, 6  # four 64-bit words
    routes = _random_sets(rng, 60, 3, n, k)
    routes[1:40:2] = routes[0:39:2]  # add temporal overlap
    s = _one(routes, n, window=3)
    sets = [[set(routes[t, layer]) for layer in range(3)] for t in range(60)]
    for d in range(1, 5):
        ref = np.mean([len(sets[t][la] & sets[t + d][la]) / k for t in range(60 - d) for la in range(3)])
        assert s.overlap[d - 1] == pytest.approx(ref)
    ref_unique = np.mean([len(sets[t][la] | sets[t + 1][la] | sets[t + 2][la]) for t in range(58) for la in range(3)])
    assert s.unique_empirical == pytest.approx(ref_unique)


def test_pooled_never_pairs_across_sequences_and_reports_slice_spread():
    a = np.tile([[[0, 1]]], (10, 1, 1))  # always {0, 1}
    b = np.tile([[[2, 3]]], (6, 1, 1))  # always {2, 3}
    c = np.array([[0, 1], [2, 3]])[np.arange(8) % 2][:, None, :]  # alternating
    p = pooled([a, b, c], n_experts=4, slices=["x", "x", "y"], max_distance=2, window=2)
    assert p.all.overlap == pytest.approx([(9 + 5 + 0) / 21, (8 + 4 + 6) / 18])
    assert p.all.tokens == 24
    assert p.slices["x"].overlap == pytest.approx([1, 1])
    assert p.slices["y"].overlap == pytest.approx([0, 1])
    assert p.all.probs[0] == pytest.approx([14 / 24, 14 / 24, 10 / 24, 10 / 24])
    assert p.all.unique_empirical == pytest.approx((9 * 2 + 5 * 2 + 7 * 4) / 21)
    spread = p.spread("overlap")
    assert spread.min == pytest.approx([0, 1]) and spread.max == pytest.approx([1, 1])
    assert spread.mean == pytest.approx([0.5, 1])
    share = p.spread("temporal_share")
    assert share.max == pytest.approx(p.slices["x"].temporal_share)
    assert set(pooled([a, b], n_experts=4).slices) == {0, 1}  # no labels: each sequence is a slice


def test_routes_refusals():
    with pytest.raises(ValueError, match="repeat an expert"):
        _one(np.array([[[1, 1]], [[0, 2]]]), 4)
    with pytest.raises(ValueError, match="expert ids must lie"):
        _one(np.array([[[1, 4]]]), 4)
    with pytest.raises(ValueError, match="int array"):
        _one(np.zeros((3, 2)), 4)


# ---- IPF ----


@pytest.mark.parametrize(("model", "k", "n", "overlaps", "paper"), TABLE20_UNIFORM_IPF)
def test_uniform_ipf_reproduces_table20(model, k, n, overlaps, paper):
    ours = unique_experts(k, n, overlaps, window=4)
    assert ours == pytest.approx(paper, rel=0.005), model
    assert ours == pytest.approx(unique_experts(k, n, overlaps + (0.2,), window=4))  # step 4 is not used


def _brute_force_max_entropy(pi, overlaps, window):
    """Maximise −Σ p log p over the 2^window pattern probabilities subject to the same linear constraints."""
    bits = (np.arange(2**window)[:, None] >> np.arange(window)) & 1
    rows, values = [np.ones(2**window)], [1.0]
    for t in range(window):
        rows.append(bits[:, t].astype(float))
        values.append(pi)
    for i, j in combinations(range(window), 2):
        rows.append((bits[:, i] * bits[:, j]).astype(float))
        values.append(pi * overlaps[j - i - 1])
    a, b = np.array(rows), np.array(values)

    def neg_entropy(p):
        return float(np.sum(p * np.log(p)))

    def gradient(p):
        return np.log(p) + 1

    p0 = np.linalg.lstsq(a, b, rcond=None)[0].clip(1e-3)
    result = optimize.minimize(
        neg_entropy,
        p0,
        jac=gradient,
        method="SLSQP",
        bounds=[(1e-12, 1)] * 2**window,
        constraints=[{"type": "eq", "fun": lambda p: a @ p - b, "jac": lambda p: a}],
        options={"ftol": 1e-15, "maxiter": 1000},
    )
    assert result.success, result.message
    return result.x


@pytest.mark.parametrize(
    ("pi", "overlaps", "window"),
    [(0.25, (0.355, 0.303), 3), (1 / 16, (0.431, 0.356), 3), (0.4, (0.5, 0.3), 3), (0.125, (0.3, 0.2, 0.15), 4)],
)
def test_ipf_is_the_maximum_entropy_solution(pi, overlaps, window):
    ipf = pattern_distribution([pi], overlaps, window)[0]
    brute = _brute_force_max_entropy(pi, overlaps, window)
    assert np.abs(ipf - brute).max() < 1e-6


@pytest.mark.parametrize(("k", "n"), [(2, 8), (8, 128), (4, 64)])
def test_independence_overlaps_give_the_uniform_formula(k, n):
    # P(active at t and t+d) = π · k/N = π²: no temporal correlation, patterns are i.i.d. Bernoulli(π)
    for window in (2, 4, 6):
        expected = n * (1 - (1 - k / n) ** window)
        assert unique_experts(k, n, (k / n,) * (window - 1), window=window) == pytest.approx(expected, abs=1e-9)


def test_extreme_overlaps():
    assert unique_experts(8, 128, (1, 1, 1)) == pytest.approx(8)  # the same set every token
    assert unique_experts(8, 128, (0, 0, 0)) == pytest.approx(32)  # disjoint sets
    assert unique_experts(8, 128, (), window=1) == pytest.approx(8)


def test_skewed_ipf():
    k, n, overlaps = 8, 128, (0.431, 0.356, 0.328)
    uniform = unique_experts(k, n, overlaps)
    assert unique_experts(k, n, overlaps, loads=np.full(n, k / n)) == pytest.approx(uniform, abs=1e-9)
    rng = np.random.default_rng(3)
    loads = rng.dirichlet(np.full(n, 2.0), size=3) * k
    per_layer = [unique_experts(k, n, overlaps, loads=row) for row in loads]
    assert unique_experts(k, n, overlaps, loads=loads) == pytest.approx(np.mean(per_layer))
    assert max(per_layer) < uniform  # concentrating the load on fewer experts lowers the count


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"overlaps": (1.2, 0.3, 0.3)}, "must lie in"),
        ({"overlaps": (0.3, -0.1, 0.3)}, "must lie in"),
        ({"overlaps": (0.3, 0.3)}, "needs overlaps at distances 1..3"),
        ({"loads": np.full(128, 0.1)}, "must sum to k=8"),
        ({"loads": np.full(64, 0.125)}, "shape"),
        ({"loads": np.r_[0.95, np.full(127, 7.05 / 127)], "overlaps": (0.05, 0.05, 0.05)}, "infeasible: an expert"),
        ({"overlaps": (1.0, 0.5, 0.5)}, "infeasible: no distribution"),
        ({"overlaps": (0.9, 0.1, 0.9)}, "infeasible: no distribution"),
    ],
)
def test_ipf_refusals(kwargs, message):
    args = {"k": 8, "n": 128, "overlaps": (0.431, 0.356, 0.328)} | kwargs
    with pytest.raises(ValueError, match=message) as err:
        unique_experts(**args)
    assert "\n" not in str(err.value)


# ---- group comparison ----


def test_compare_groups_hand_computed():
    r = compare_groups([1, 2, 3, 4, 5], [3, 4, 5, 6, 7])
    assert r.delta == -2.0  # mean(a) − mean(b): Table 14's accepted − first-rejected
    assert r.cohen_d == pytest.approx(-2 / np.sqrt(2.5))  # both variances 2.5 -> pooled SD √2.5
    assert r.size == "large"
    assert r.p_value == pytest.approx(sps.ttest_ind([1, 2, 3, 4, 5], [3, 4, 5, 6, 7], equal_var=False).pvalue)
    assert (r.n_a, r.n_b) == (5, 5)


def test_compare_groups_against_scipy_and_labels():
    rng = np.random.default_rng(4)
    a, b = rng.normal(0.40, 0.15, 800), rng.normal(0.44, 0.20, 300)
    r = compare_groups(a, b)
    pooled_sd = np.sqrt((799 * a.var(ddof=1) + 299 * b.var(ddof=1)) / 1098)
    assert r.cohen_d == pytest.approx((a.mean() - b.mean()) / pooled_sd)
    assert r.p_value == pytest.approx(sps.ttest_ind(a, b, equal_var=False).pvalue, rel=1e-12)
    for n_a, n_b in [
        (2, 3),
        (17, 40),
        (300, 9),
    ]:  # scipy's value to the last bit: the report's csv files print it whole
        x, y = rng.normal(0, rng.uniform(0.1, 2), n_a), rng.normal(0.3, rng.uniform(0.1, 2), n_b)
        assert compare_groups(x, y).p_value == sps.ttest_ind(x, y, equal_var=False).pvalue
    assert compare_groups([1.0, 1.0], [2.0, 2.0]).p_value == 0.0
    assert np.isnan(compare_groups([1.0, 1.0], [1.0, 1.0]).p_value)
    base = np.array([-1.0, 1.0])  # SD √2 with ddof = 1
    for d, label in [(0.0, "negligible"), (-0.19, "negligible"), (-0.26, "small"), (0.6, "medium"), (-0.8, "large")]:
        shifted = compare_groups(base + d * np.sqrt(2), base)
        assert shifted.cohen_d == pytest.approx(d) and shifted.size == label
    with pytest.raises(ValueError, match="at least two"):
        compare_groups([1.0], [1.0, 2.0])
