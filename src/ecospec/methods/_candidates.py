"""One draft tree as a method's rule sees it (`Candidates`), built and validated from the tree's arrays, and the
rule applied to it (`pick`): what `ecospec.select` and every method's session share. Expert sets come as iterables
of (layer, expert) pairs or as int bitmasks (bit layer*N+expert); both become int bitmasks here, so union is `|`,
difference `& ~` and size `int.bit_count()`."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

ExpertSet = int | Iterable[tuple[int, int]]


@dataclass
class Candidates:
    """One draft tree as a rule sees it. `traj[i]`: E_traj(i) as an int bitmask (None for a rule that needs no
    expert sets); `buffer`: the experts the pass loads anyway (the root's), as a bitmask."""

    parents: Sequence[int]
    probs: Sequence[float]
    depth: list[int]  # first level = 1
    roots: list[int]  # the first level's nodes
    children: list[list[int]]
    traj: list[int] | None
    buffer: int
    eps: float


def candidates(
    spec,
    parents: Sequence[int],
    probs: Sequence[float],
    experts: Sequence[ExpertSet] | None,
    root_experts: ExpertSet | None = None,
    eps: float = 1e-6,
) -> Candidates:
    """One draft tree as `policy`'s rule sees it (validated; expert trajectories as bitmasks when the policy reads
    expert sets), for a method's session that decides more than `select` does."""
    depth, children, roots = structure(spec, parents, probs, experts)
    traj, buf = None, 0
    if spec.predictor is not None:
        masks, buf = to_masks(experts, root_experts)
        traj = trajectories(masks, parents)
    return Candidates(parents, probs, depth, roots, children, traj, buf, eps)


def pick(spec, c: Candidates, budget: int) -> list[int]:
    """The nodes `spec`'s rule verifies out of `c` at this budget (none at a budget of 0)."""
    return spec.rule(c, min(budget, len(c.parents))) if budget > 0 else []


def structure(
    spec, parents: Sequence[int], probs: Sequence[float], experts: Sequence[ExpertSet] | None
) -> tuple[list[int], list[list[int]], list[int]]:
    """Validate one tree's arrays; return each node's depth (first level = 1), its children, the first level."""
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
    if spec.predictor is not None and (experts is None or any(e is None for e in experts)):
        raise ValueError(f"policy {spec.name!r} needs an expert set for every node; got None")
    return depth, children, roots


def trajectories(masks: list[int], parents: Sequence[int]) -> list[int]:
    """E_traj(i): the union of the sets from the first-level ancestor down to i (parents precede children)."""
    traj: list[int] = []
    for m, p in zip(masks, parents, strict=True):
        traj.append(m | traj[p] if p >= 0 else m)
    return traj


def to_masks(
    experts: Sequence[ExpertSet], root_experts: ExpertSet | None, bits: dict[tuple[int, int], int] | None = None
) -> tuple[list[int], int]:
    """Node and root expert sets as int bitmasks (pairs get bits in order of first appearance, in `bits` when
    given, so several trees can share one numbering)."""
    kinds = {isinstance(e, int) for e in experts}
    if root_experts is not None:
        kinds.add(isinstance(root_experts, int))
    if len(kinds) > 1:
        raise ValueError("expert sets mix int bitmasks and (layer, expert) pair iterables; use one kind")
    if kinds != {False}:
        return list(experts), root_experts or 0
    bits = {} if bits is None else bits

    def mask(pairs: Iterable[tuple[int, int]]) -> int:
        m = 0
        for layer, expert in pairs:
            m |= 1 << bits.setdefault((layer, expert), len(bits))
        return m

    return [mask(e) for e in experts], (0 if root_experts is None else mask(root_experts))
