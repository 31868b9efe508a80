"""A method's state over the steps of one prompt, and the decisions the decode loop asks of it each step."""

from __future__ import annotations

from ecospec.selection import select


class Session:
    """The default: draft the configured tree every step and verify the `budget` nodes the method's rule picks
    (`ecospec.select`, so a session chooses exactly what the public API selects). A method with other decisions
    (how much to draft, whether to speculate at all) passes its own class as `MethodSpec.session`."""

    def __init__(self, spec, gamma: int, depth: int, topk: int, cost=None):
        self.spec, self.gamma, self.depth, self.topk, self.cost = spec, gamma, depth, topk, cost

    @property
    def draft_shape(self) -> tuple[int, int]:
        """(depth, top-k) of the largest tree this session drafts: what a compiled drafter is prepared for."""
        return self.depth, self.topk

    def shape(self) -> tuple[int, int]:
        """(depth, top-k) of this step's draft tree; depth 0 drafts nothing (the step verifies the root alone)."""
        return self.depth, self.topk

    def choose(self, tree, experts, root_experts, budget: int) -> list[int]:
        """The nodes of `tree` to verify (ascending, prefix-closed, at most `budget`); [] makes this an AR step."""
        return select(self.spec.name, tree.parents, tree.probs, experts, budget, root_experts)

    def observe(self, accepted: int, verified: int) -> None:
        """What the step produced (tokens, bonus included) from how many verified tokens."""
