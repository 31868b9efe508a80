"""Draft-token selection: which `budget` nodes of a draft tree the target model verifies.

On an MoE target, verifying a token costs the experts its forward activates that are not already
loaded for the step. Confidence-only selection (EAGLE) ignores that cost; EcoSpec (paper §4.2, Alg. 1)
trades the draft probability P against the number of *new* experts a token's trajectory brings.
All policies share one interface and return prefix-closed node sets, i.e. valid verification trees.

Expert sets come as iterables of (layer, expert) pairs or as int bitmasks (bit layer*N+expert); both
become int bitmasks here, so union is `|`, difference `& ~` and size `int.bit_count()`.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable, Sequence

POLICIES = ("confidence", "global_cost", "ecospec", "oracle")

ExpertSet = int | Iterable[tuple[int, int]]


def select(
    policy: str,
    parents: Sequence[int],
    probs: Sequence[float],
    experts: Sequence[ExpertSet] | None,
    budget: int,
    root_experts: ExpertSet | None = None,
    eps: float = 1e-6,
) -> list[int]:
    """Pick min(budget, n) nodes to verify; return their indices sorted ascending.

    `parents[i]` is node i's parent (-1 = the root; parents precede children), `probs[i]` its
    cumulative draft probability P, `experts[i]` its own predicted expert set. E_traj(i) is the union
    of expert sets from the first-level ancestor down to i. Every policy grows the selection greedily
    over the frontier (unselected nodes whose parent is the root or selected), so results are
    prefix-closed:

    - confidence: largest P (the same as plain top-budget by P when P(child) <= P(parent)).
    - global_cost: largest static P / (|E_traj(i)| + eps); no buffer.
    - ecospec / oracle: largest P / (|E_traj(i) minus B| + eps) with buffer B starting at
      `root_experts` and absorbing E_traj of every pick (oracle = ecospec fed the true router sets).

    Ties go to larger P, then smaller depth, then smaller index.
    """
    if policy not in POLICIES:
        raise ValueError(f"unknown policy {policy!r}; allowed: {', '.join(POLICIES)}")
    n = len(parents)
    if len(probs) != n:
        raise ValueError(f"len(probs) = {len(probs)} does not match len(parents) = {n}")
    if experts is not None and len(experts) != n:
        raise ValueError(f"len(experts) = {len(experts)} does not match len(parents) = {n}")
    depth: list[int] = []
    children: list[list[int]] = [[] for _ in range(n)]
    roots: list[int] = []
    for i, p in enumerate(parents):
        if not -1 <= p < i:
            raise ValueError(f"parents[{i}] = {p}: must be -1 (the root) or a smaller node index")
        if p < 0:
            roots.append(i)
            depth.append(1)
        else:
            children[p].append(i)
            depth.append(depth[p] + 1)
    if policy != "confidence":
        if experts is None or any(e is None for e in experts):
            raise ValueError(f"policy {policy!r} needs an expert set for every node; got None")
        masks, buf = _to_masks(experts, root_experts)
        traj: list[int] = []
        for m, p in zip(masks, parents, strict=True):
            traj.append(m | traj[p] if p >= 0 else m)
    if budget <= 0:
        return []
    budget = min(budget, n)
    if policy == "confidence":
        return _greedy_static(probs, probs, depth, roots, children, budget)
    if policy == "global_cost":
        scores = [pr / (t.bit_count() + eps) for pr, t in zip(probs, traj, strict=True)]
        return _greedy_static(scores, probs, depth, roots, children, budget)
    return _greedy_buffered(probs, depth, roots, children, traj, buf, budget, eps)


def _to_masks(experts: Sequence[ExpertSet], root_experts: ExpertSet | None) -> tuple[list[int], int]:
    """Node and root expert sets as int bitmasks (pairs get bits in order of first appearance)."""
    kinds = {isinstance(e, int) for e in experts}
    if root_experts is not None:
        kinds.add(isinstance(root_experts, int))
    if len(kinds) > 1:
        raise ValueError("expert sets mix int bitmasks and (layer, expert) pair iterables; use one kind")
    if kinds != {False}:
        return list(experts), root_experts or 0
    bits: dict[tuple[int, int], int] = {}

    def mask(pairs: Iterable[tuple[int, int]]) -> int:
        m = 0
        for layer, expert in pairs:
            m |= 1 << bits.setdefault((layer, expert), len(bits))
        return m

    return [mask(e) for e in experts], (0 if root_experts is None else mask(root_experts))


def _greedy_static(
    scores: Sequence[float],
    probs: Sequence[float],
    depth: list[int],
    roots: list[int],
    children: list[list[int]],
    budget: int,
) -> list[int]:
    """Frontier-greedy by a fixed per-node score (a heap keyed by score, P, -depth, -index)."""
    heap = [(-scores[i], -probs[i], depth[i], i) for i in roots]
    heapq.heapify(heap)
    out = []
    for _ in range(budget):
        i = heapq.heappop(heap)[3]
        out.append(i)
        for c in children[i]:
            heapq.heappush(heap, (-scores[c], -probs[c], depth[c], c))
    out.sort()
    return out


def _greedy_buffered(
    probs: Sequence[float],
    depth: list[int],
    roots: list[int],
    children: list[list[int]],
    traj: list[int],
    buf: int,
    budget: int,
    eps: float,
) -> list[int]:
    """EcoSpec Alg. 1: frontier-greedy by P / (|E_traj \\ B| + eps), B absorbing each pick's E_traj."""
    frontier = list(roots)
    out = []
    for _ in range(budget):
        notbuf = ~buf
        best = -1
        best_key: tuple[float, float, int, int] | None = None
        for i in frontier:
            pr = probs[i]
            key = (pr / ((traj[i] & notbuf).bit_count() + eps), pr, -depth[i], -i)
            if best_key is None or key > best_key:
                best, best_key = i, key
        frontier.remove(best)
        frontier.extend(children[best])
        buf |= traj[best]
        out.append(best)
    out.sort()
    return out
