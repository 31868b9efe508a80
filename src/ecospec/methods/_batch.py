"""What a method picks for every sequence of a step at once (`engine.loop`): its batch rule where it has one, one
expert buffer for the batch where asked, else each sequence's own session."""

from __future__ import annotations

from ecospec.selection import select_batch


def choose_rows(spec, sessions, trees, experts, root_experts, budget: int, shared_buffer: bool = False, profile=None):
    """Each sequence's chosen nodes (ascending, prefix-closed, at most `budget`; [] verifies its root alone).
    `sessions`, `trees`, `experts`, `root_experts`: one per sequence, in row order; `profile`: the verify-cost
    profile a batch rule prices the whole pass with."""
    if not any(len(t) for t in trees):
        return [[] for _ in trees]
    if spec.batch_rule is not None:
        return spec.batch_rule(profile, trees, budget)
    if shared_buffer and spec.buffered and len(trees) > 1:
        parents, probs = [t.parents for t in trees], [t.probs for t in trees]
        return select_batch(spec.name, parents, probs, experts, budget, root_experts, shared_buffer=True)
    return [
        s.choose(t, e, r, budget) if len(t) else []
        for s, t, e, r in zip(sessions, trees, experts, root_experts, strict=True)
    ]
