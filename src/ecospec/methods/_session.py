"""A method's state over the steps of one prompt, and the decisions the decode loop asks of it each step."""

from __future__ import annotations

from ecospec.methods._candidates import candidates, pick


class Session:
    """The default: draft the configured tree every step and verify the `budget` nodes the method's rule picks
    (`ecospec.select`, so a session chooses exactly what the public API selects). A method with other decisions
    (how much to draft, whether to speculate at all) passes its own class as `MethodSpec.session`. `cost`: the
    verify-cost profile (`analysis.verify_profile.VerifyProfile`) of a method that prices passes in seconds, else None;
    in a batch the loop sets it to the batch's prices each time the batch's size changes (`VerifyProfile.at_batch`)."""

    def __init__(self, spec, gamma: int, depth: int, topk: int, cost=None):
        self.spec, self.gamma, self.depth, self.topk, self.cost = spec, gamma, depth, topk, cost

    @property
    def draft_shape(self) -> tuple[int, int]:
        """(depth, top-k) of the largest tree this session drafts: what a compiled drafter is prepared for."""
        return self.depth, self.topk

    @property
    def draft_depths(self) -> tuple[int, ...]:
        """Every tree depth a step may draft (a compiled drafter prepares a graph for each)."""
        return (self.draft_shape[0],)

    @property
    def wants_experts(self) -> bool:
        """Whether this step's candidates need expert sets (the predictor's pass): a method that reads them may
        decide that a pass costs more than it can save."""
        return self.spec.predictor is not None

    def shape(self, behind: int = 0, left: int | None = None) -> tuple[int, int]:
        """(depth, top-k) of this step's draft tree; depth 0 drafts nothing (the step verifies the root alone).
        `behind`: the tokens the drafter has not seen yet, which a step that drafts first runs it over (the prompt
        and the root at the first step; after steps that drafted nothing, their tokens too); `left`: the tokens the
        sequence may still produce (None: unknown)."""
        return self.depth, self.topk

    def choose(self, tree, experts, root_experts, budget: int) -> list[int]:
        """The nodes of `tree` to verify (ascending, prefix-closed, at most `budget`); [] makes this an AR step."""
        return pick(self.spec, candidates(self.spec, tree.parents, tree.probs, experts, root_experts), budget)

    def observe(self, accepted: int, verified: int) -> None:
        """What the step produced (tokens, bonus included) from how many verified tokens."""
