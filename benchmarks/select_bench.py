"""Per-call latency of `ecospec.selection.select`: it runs on the host every decoding step, so it must be
cheap next to a target forward (< 100 µs in the paper's setting)."""

from __future__ import annotations

import random
import statistics
import time

from ecospec.selection import select, select_batch

LAYERS, N_EXPERTS, TOP_K = 48, 128, 8


def _experts(rng: random.Random) -> int:
    """One token's routing as an int bitmask: TOP_K experts in each of LAYERS layers."""
    m = 0
    for layer in range(LAYERS):
        for e in rng.sample(range(N_EXPERTS), TOP_K):
            m |= 1 << (layer * N_EXPERTS + e)
    return m


def _beam_tree(rng: random.Random, depth: int, k: int) -> tuple[list[int], list[float]]:
    """EAGLE-style pool: k children of the root, then each level expands the k best nodes by P."""
    parents = [-1] * k
    probs = sorted((rng.random() for _ in range(k)), reverse=True)
    beam = list(range(k))
    for _ in range(depth - 1):
        start = len(parents)
        for b in beam:
            for _ in range(k):
                parents.append(b)
                probs.append(probs[b] * rng.random())
        beam = sorted(range(start, len(parents)), key=lambda i: -probs[i])[:k]
    return parents, probs


def _random_tree(rng: random.Random, n: int) -> tuple[list[int], list[float]]:
    parents, probs = [], []
    for i in range(n):
        p = rng.randrange(-1, i)
        parents.append(p)
        probs.append(rng.random() * (probs[p] if p >= 0 else 1.0))
    return parents, probs


def _median_us(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter_ns()
        fn()
        times.append(time.perf_counter_ns() - t0)
    return statistics.median(times) / 1e3


def bench_select(repeats: int = 2000) -> dict[str, float]:
    """Median microseconds per `select` call for named (policy, tree, budget) settings."""
    rng = random.Random(0)
    paper = _beam_tree(rng, depth=3, k=2)  # 10 nodes
    big = _random_tree(rng, 60)
    root = _experts(rng)
    settings = {"paper n=10": paper, "random n=60": big}
    out = {}
    for tree_name, (parents, probs) in settings.items():
        experts = [_experts(rng) for _ in parents]
        budgets = (3,) if len(parents) == 10 else (10, 59)
        for policy in ("confidence", "global_cost", "ecospec"):
            for budget in budgets:
                call = lambda: select(policy, parents, probs, experts, budget, root)  # noqa: B023
                out[f"{policy:<11} {tree_name} budget={budget}"] = _median_us(call, repeats)
    # a batch of 4 paper-sized trees: per sequence, and with one buffer for the batch (select_batch)
    trees = [_beam_tree(rng, depth=3, k=2) for _ in range(4)]
    parents, probs = [t[0] for t in trees], [t[1] for t in trees]
    experts = [[_experts(rng) for _ in par] for par in parents]
    roots = [_experts(rng) for _ in trees]
    for shared in (False, True):
        call = lambda: select_batch("ecospec", parents, probs, experts, 3, roots, shared_buffer=shared)  # noqa: B023
        out[f"ecospec     batch 4 x n=10 budget=3 {'shared' if shared else 'per-seq'}"] = _median_us(call, repeats)
    return out


if __name__ == "__main__":
    print(f"experts: {LAYERS} layers x {N_EXPERTS} experts, top-{TOP_K} per token (int bitmasks)")
    print(f"{'setting':<40} {'median µs':>10}")
    for name, us in bench_select().items():
        print(f"{name:<40} {us:>10.1f}")
