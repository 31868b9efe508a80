"""What a method picks for every sequence of a step at once (`engine.loop`): its batch rule where it has one, one
expert buffer for the batch where asked, else each sequence's own session."""

from __future__ import annotations

from ecospec.methods._candidates import to_masks
from ecospec.selection import select_batch


def choose_rows(spec, sessions, trees, experts, root_experts, budget: int, shared_buffer: bool = False, profile=None):
    """Each sequence's chosen nodes (ascending, prefix-closed, at most `budget`; [] verifies its root alone).
    `sessions`, `trees`, `experts`, `root_experts`: one per sequence, in row order; `shared_buffer`: one expert
    buffer for the batch (a buffered method's); `profile`: the verify-cost profile a batch rule prices the pass with."""
    if not any(len(t) for t in trees):
        return [[] for _ in trees]
    if spec.batch_rule is not None:
        return spec.batch_rule(profile, trees, budget)
    if shared_buffer and len(trees) > 1:
        if spec.session is not None:  # a method that decides for itself: each row, its experts shared
            return shared_sessions(sessions, trees, experts, root_experts, budget)
        parents, probs = [t.parents for t in trees], [t.probs for t in trees]
        return select_batch(spec.name, parents, probs, experts, budget, root_experts, shared_buffer=True)
    return [
        s.choose(t, e, r, budget) if len(t) else []
        for s, t, e, r in zip(sessions, trees, experts, root_experts, strict=True)
    ]


def shared_sessions(sessions, trees, experts, root_experts, budget: int) -> list[list[int]]:
    """One expert buffer for the batch under sessions that decide for themselves (EcoSpec-Adaptive): the rows choose
    in order, each seeing as loaded every expert the pass loads already (every root's, the earlier rows' picks)."""
    bits: dict = {}
    masks = [None if e is None else to_masks(e, r, bits) for e, r in zip(experts, root_experts, strict=True)]
    loaded = 0
    for m in masks:
        loaded |= m[1] if m is not None else 0
    out = []
    for s, t, m in zip(sessions, trees, masks, strict=True):
        if m is None:  # no expert sets this step: nothing to share
            out.append(s.choose(t, None, None, budget) if len(t) else [])
            continue
        nodes = s.choose(t, m[0], loaded, budget) if len(t) else []
        for i in nodes:
            loaded |= m[0][i]
        out.append(nodes)
    return out
