"""The frontier-greedy walks the rules share: every pick is a node whose parent is the root or already picked, so
every result is prefix-closed. Ties: larger P, then smaller depth, then smaller index."""

from __future__ import annotations

import heapq
from collections.abc import Sequence

from ecospec.methods import Candidates


def greedy_static(c: Candidates, scores: Sequence[float], budget: int) -> list[int]:
    """Frontier-greedy by a fixed per-node score (a heap keyed by score, P, -depth, -index)."""
    return sorted(picks_static(c, scores, budget))


def by_probability(c: Candidates, budget: int) -> list[int]:
    """The `budget` nodes of largest P, frontier-greedy (EAGLE's confidence rerank; every method that verifies what a
    chain or a tree offers by P alone)."""
    return greedy_static(c, c.probs, budget)


def picks_static(c: Candidates, scores: Sequence[float], budget: int) -> list[int]:
    """`greedy_static`'s picks in the order it makes them: every prefix of the list is prefix-closed."""
    heap = [(-scores[i], -c.probs[i], c.depth[i], i) for i in c.roots]
    heapq.heapify(heap)
    out = []
    while heap and len(out) < budget:
        i = heapq.heappop(heap)[3]
        out.append(i)
        for child in c.children[i]:
            heapq.heappush(heap, (-scores[child], -c.probs[child], c.depth[child], child))
    return out


def greedy_buffered(c: Candidates, budget: int) -> list[int]:
    """EcoSpec Alg. 1: frontier-greedy by P / (|E_traj \\ B| + eps), B absorbing each pick's E_traj."""
    return sorted(picks_buffered(c, budget, c.eps, 1.0)[0])


def picks_buffered(c: Candidates, budget: int, fixed: float, per_expert: float) -> tuple[list[int], list[int]]:
    """(picks in order, the buffer B before the first pick and after each): frontier-greedy by
    P / (fixed + per_expert * |E_traj(i) \\ B|), B absorbing each pick's E_traj; ties to larger P, smaller depth,
    smaller index. EcoSpec's rule is fixed = eps, per_expert = 1; its priced form (`ecospec_adaptive`) prices a token
    and an expert in seconds."""
    frontier, buf = list(c.roots), c.buffer
    out, buffers = [], [buf]
    while frontier and len(out) < budget:
        notbuf = ~buf
        best, best_key = -1, None
        for i in frontier:
            pr = c.probs[i]
            key = (pr / (fixed + per_expert * (c.traj[i] & notbuf).bit_count()), pr, -c.depth[i], -i)
            if best_key is None or key > best_key:
                best, best_key = i, key
        frontier.remove(best)
        frontier.extend(c.children[best])
        buf |= c.traj[best]
        out.append(best)
        buffers.append(buf)
    return out, buffers
