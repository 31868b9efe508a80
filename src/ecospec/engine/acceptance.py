"""Acceptance of a verified block (root + selected nodes): greedy and lossless sampling.

The block is ordered so that parents precede children; block index 0 is the root and
`parents[j]` is the block index of node j's parent (-1 for the root).
"""

from __future__ import annotations

import torch

from ecospec.engine.sampling import target_probs


def accept_greedy(tokens: list[int], parents: list[int], logits: torch.Tensor) -> tuple[list[int], int]:
    """Longest path whose draft tokens equal the target's argmax at their parent; + bonus token.

    Returns (accepted block indices from the root, bonus token)."""
    pred = logits.argmax(-1).tolist()
    ok = [True] * len(tokens)
    depth = [0] * len(tokens)
    best = 0
    for j in range(1, len(tokens)):
        p = parents[j]
        ok[j] = ok[p] and tokens[j] == pred[p]
        depth[j] = depth[p] + 1
        if ok[j] and depth[j] > depth[best]:
            best = j
    return _path(parents, best), pred[best]


def accept_sampling(
    tokens: list[int],
    parents: list[int],
    ranks: list[float],
    logits: torch.Tensor,
    temperature: float,
    top_p: float,
    generator: torch.Generator,
) -> tuple[list[int], int]:
    """Multi-draft recursive rejection sampling (SpecInfer/EAGLE with deterministic top-k drafts).

    At the current node, children are tried in draft-rank order (`ranks`: larger first, then
    smaller index); child x is accepted with probability p(x) (q(x) = 1 for deterministic drafts);
    on rejection p(x) is set to 0 and p renormalised. When every child is rejected, or a leaf is
    reached, the bonus token is sampled from the current p. The output distribution is exactly the
    target's, for any temperature > 0 and top-p."""
    children: list[list[int]] = [[] for _ in tokens]
    for j in range(1, len(tokens)):
        children[parents[j]].append(j)
    probs = target_probs(logits, temperature, top_p)
    cur = 0
    while True:
        p = probs[cur].clone()
        nxt = None
        for c in sorted(children[cur], key=lambda j: (-ranks[j], j)):
            x = tokens[c]
            if float(torch.rand((), generator=generator, dtype=torch.float64)) < float(p[x]):
                nxt = c
                break
            p[x] = 0.0
            total = p.sum()
            if total <= 0:  # only by rounding: x held all the mass yet was rejected
                p = probs[cur].clone()
                break
            p /= total
        if nxt is None:
            return _path(parents, cur), int(torch.multinomial(p, 1, generator=generator))
        cur = nxt


def _path(parents: list[int], node: int) -> list[int]:
    out = []
    while node >= 0:
        out.append(node)
        node = parents[node]
    return out[::-1]
