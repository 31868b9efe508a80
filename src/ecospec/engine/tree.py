"""Draft trees: growth the EAGLE-2/3 way, ancestor masks and depth-based positions."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

import torch


@dataclass
class DraftTree:
    """Candidate pool of one SD step. Node i's parent is parents[i] (-1 = the root).

    Nodes are stored level by level, so a parent always has a smaller index than its children.
    `probs` is the cumulative draft probability P (product along the path from the root).
    """

    tokens: list[int] = field(default_factory=list)
    parents: list[int] = field(default_factory=list)
    probs: list[float] = field(default_factory=list)
    depths: list[int] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.tokens)

    def add(self, token: int, parent: int, prob: float) -> int:
        self.tokens.append(token)
        self.parents.append(parent)
        self.probs.append(prob)
        self.depths.append(1 if parent < 0 else self.depths[parent] + 1)
        return len(self.tokens) - 1

    def cut(self, depth: int) -> DraftTree:
        """The tree down to `depth` (levels are stored in order, so a prefix of the nodes): exactly the tree that
        growing `depth` levels gives, since a level depends only on the levels above it."""
        n = sum(1 for d in self.depths if d <= depth)
        if n == len(self):
            return self
        return DraftTree(self.tokens[:n], self.parents[:n], self.probs[:n], self.depths[:n])

    def path(self, node: int) -> list[int]:
        """Node indices from the first-level ancestor down to `node`."""
        out = []
        while node >= 0:
            out.append(node)
            node = self.parents[node]
        return out[::-1]


# expand(tree, beam, k) -> (log-probs [len(beam), k], target token ids [len(beam), k]) for the children of beam.
Expand = Callable[[DraftTree, list[int], int], tuple[torch.Tensor, torch.Tensor]]


def grow_tree(
    root_logp: torch.Tensor, root_ids: torch.Tensor, expand: Expand, depth: int, stop: float | None = None
) -> DraftTree:
    """Grow a draft tree with `depth` drafter forwards (the first one produced root_logp/root_ids).

    Level 1 = the top-k children of the root. Each further forward expands the current beam (the k
    best nodes of the previous level by P); every child enters the pool, the best k form the next beam.
    Pool size: k + (depth - 1) * k^2. `stop` (adaptive drafting, off by default: the paper's trees are
    fixed): no further level once the newest level's most probable child has a conditional probability
    below `stop` (the level itself is kept), as transformers' assisted generation stops its draft.
    The one-row form of `grow_trees`, which the decode loop calls.
    """

    def expand_rows(trees, beams, k):
        logp, ids = expand(trees[0], beams[0], k)
        return logp[None], ids[None]

    return grow_trees(root_logp[None], root_ids[None], expand_rows, depth, stop)[0]


# expand_rows(trees, beams, k) -> (log-probs [B, beam, k], ids [B, beam, k]): a batched drafter's `expand_rows`.
ExpandRows = Callable[[list[DraftTree], list[list[int]], int], tuple[torch.Tensor, torch.Tensor]]


def grow_trees(
    root_logp: torch.Tensor, root_ids: torch.Tensor, expand_rows: ExpandRows, depth: int, stop: float | None = None
) -> list[DraftTree]:
    """`grow_tree` for every row of a batch (root_logp / root_ids [B, k]), one drafter forward per level for all
    rows. Without `stop`, each row's tree is exactly the one `grow_tree` grows from its row alone; with it, the rows
    grow alike until no row's newest level is confident (one row: `grow_tree`'s stop)."""
    logp_rows = root_logp.tolist()
    grown = [_root_level(lp, ids) for lp, ids in zip(logp_rows, root_ids.tolist(), strict=True)]
    trees, beams = [t for t, _ in grown], [b for _, b in grown]
    confident = stop is None or any(math.exp(max(row)) >= stop for row in logp_rows)
    for _ in range(depth - 1):
        if not confident:
            break
        logp, ids = expand_rows(trees, beams, len(beams[0]))
        cond = [[[math.exp(x) for x in node] for node in row] for row in logp.tolist()]  # a few values: Python
        confident = stop is None or any(max(map(max, row)) >= stop for row in cond)
        ids = ids.tolist()
        beams = [_add_level(t, b, c, i) for t, b, c, i in zip(trees, beams, cond, ids, strict=True)]
    return trees


def _root_level(logp: list[float], ids: list[int]) -> tuple[DraftTree, list[int]]:
    tree = DraftTree()
    for lp, tok in zip(logp, ids, strict=True):
        tree.add(tok, -1, math.exp(lp))
    return tree, list(range(len(tree)))


def _add_level(tree: DraftTree, beam: list[int], cond: list[list[float]], ids: list[list[int]]) -> list[int]:
    """Add the beam's children (conditional probabilities `cond`, tokens `ids`, [beam][k]); return the next beam:
    the len(beam) most probable children (ties: smaller node index)."""
    children = []
    for parent, probs, toks in zip(beam, cond, ids, strict=True):
        for p, tok in zip(probs, toks, strict=True):
            children.append(tree.add(tok, parent, tree.probs[parent] * p))
    order = sorted(children, key=lambda i: (-tree.probs[i], i))
    return order[: len(beam)]


def ancestor_mask(parents: list[int], device: torch.device | None = None) -> torch.Tensor:
    """Bool [n+1, n+1] over root + nodes (given in an order where parents precede children):
    entry (q, k) is True when k is q itself or one of its ancestors. `parents` index into the same
    node list (-1 = root). Built as Python rows and turned into a tensor once: it runs every step."""
    n = len(parents) + 1
    rows = [[True] + [False] * (n - 1)]
    for i, p in enumerate(parents, start=1):
        row = list(rows[p + 1]) if p >= 0 else list(rows[0])
        row[i] = True
        rows.append(row)
    return torch.tensor(rows, dtype=torch.bool, device=device)


def missing_levels(tree: DraftTree, beam: list[int], done) -> list[list[int]]:
    """Nodes on the paths to `beam` that a recurrent drafter has not run yet (`done`: a container of node ids),
    grouped by depth, shallowest first: a node's input is its parent's output, so one forward per level."""
    needed = sorted({n for b in beam for n in tree.path(b)} - set(done))
    by_depth: dict[int, list[int]] = {}
    for n in needed:
        by_depth.setdefault(tree.depths[n], []).append(n)
    return [by_depth[d] for d in sorted(by_depth)]
