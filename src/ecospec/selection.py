"""Draft-token selection: which `budget` nodes of a draft tree the target model verifies.

On an MoE target, verifying a token costs the experts its forward activates that are not already
loaded for the step. Confidence-only selection (EAGLE) ignores that cost; EcoSpec (paper §4.2, Alg. 1)
trades the draft probability P against the number of *new* experts a token's trajectory brings.
The policies are the methods of `ecospec.methods` (one module each); all return prefix-closed node sets, i.e.
valid verification trees.

Expert sets come as iterables of (layer, expert) pairs or as int bitmasks (bit layer*N+expert); both
become int bitmasks here, so union is `|`, difference `& ~` and size `int.bit_count()`.
"""

from __future__ import annotations

from collections.abc import Sequence

from ecospec.methods import method, names
from ecospec.methods._candidates import ExpertSet, candidates, pick, structure, to_masks, trajectories


def __getattr__(name: str):
    if name == "POLICIES":  # every registered method's name (looked up when asked: the methods import this module)
        return names()
    raise AttributeError(f"module 'ecospec.selection' has no attribute {name!r}")


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
    prefix-closed; each policy's score is its method's (`ecospec.methods`, docs/design.md "Selection rules").
    Ties go to larger P, then smaller depth, then smaller index.
    """
    spec = method(policy)
    return pick(spec, candidates(spec, parents, probs, experts, root_experts, eps), budget)


def select_batch(
    policy: str,
    parents: Sequence[Sequence[int]],
    probs: Sequence[Sequence[float]],
    experts: Sequence[Sequence[ExpertSet] | None] | None,
    budget: int | Sequence[int],
    root_experts: Sequence[ExpertSet | None] | None = None,
    eps: float = 1e-6,
    shared_buffer: bool = False,
) -> list[list[int]]:
    """`select` for a batch of draft trees (every argument a list over sequences; `budget` an int for all or one
    per sequence); returns each sequence's chosen node indices, sorted.

    `shared_buffer=False`, or a policy without a buffer: `select` per sequence.
    `shared_buffer=True` with a buffered policy (docs/design.md, "Batches"): one verify pass loads the union of the
    batch's experts, so one buffer B serves the batch. B starts as the union of the roots' sets; each
    sequence keeps its own budget. Repeat: among the frontier nodes of every sequence with budget left, take
    the largest P / (|E_traj(i) minus B| + eps), ties to larger P, smaller depth, smaller sequence index,
    smaller node index; B absorbs its E_traj. An expert another sequence already brought in costs nothing.
    """
    spec = method(policy)
    size = len(parents)
    budgets = [budget] * size if isinstance(budget, int) else list(budget)
    experts = [None] * size if experts is None else experts
    roots_in = [None] * size if root_experts is None else root_experts
    for name, arg in (("probs", probs), ("experts", experts), ("budget", budgets), ("root_experts", roots_in)):
        if len(arg) != size:
            raise ValueError(f"select_batch: {name} has {len(arg)} sequences, parents {size}")
    if not shared_buffer or not spec.buffered:
        return [select(policy, *args, eps=eps) for args in zip(parents, probs, experts, budgets, roots_in, strict=True)]
    kinds = {isinstance(e, int) for ex in experts for e in (ex or ())}
    kinds |= {isinstance(r, int) for r in roots_in if r is not None}
    if len(kinds) > 1:
        raise ValueError("expert sets mix int bitmasks and (layer, expert) pair iterables across the batch")
    # one bit numbering for the whole batch: a (layer, expert) pair is the same bit in every tree
    bits: dict[tuple[int, int], int] = {}
    trees, frontier, buf = [], [], 0
    for par, pr, ex, root in zip(parents, probs, experts, roots_in, strict=True):
        depth, children, first = structure(spec, par, pr, ex)
        masks, root_mask = to_masks(ex, root, bits)
        trees.append((depth, children, trajectories(masks, par)))
        frontier.append(first)
        buf |= root_mask
    left = [max(0, min(b, len(par))) for b, par in zip(budgets, parents, strict=True)]
    out: list[list[int]] = [[] for _ in range(size)]
    while True:
        notbuf = ~buf
        best, best_key = None, None
        for s, nodes in enumerate(frontier):
            if not left[s]:
                continue
            depth, _, traj = trees[s]
            for i in nodes:
                pr = probs[s][i]
                key = (pr / ((traj[i] & notbuf).bit_count() + eps), pr, -depth[i], -s, -i)
                if best_key is None or key > best_key:
                    best, best_key = (s, i), key
        if best is None:
            break
        s, i = best
        frontier[s].remove(i)
        frontier[s].extend(trees[s][1][i])
        buf |= trees[s][2][i]
        out[s].append(i)
        left[s] -= 1
    return [sorted(x) for x in out]
