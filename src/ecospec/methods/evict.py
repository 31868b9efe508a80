"""evict: EVICT (Pan et al., "Making Every Verified Token Count: Adaptive Verification for MoE Speculative
Decoding", arXiv 2605.00342), training-free and lossless: draft the configured tree, order its nodes best-first by
path probability P (every prefix of that order is a subtree), and verify the prefix of n nodes with the most
expected tokens per second: 1 + the sum of their P over the step's time, the drafting already done plus the
profile's verify time for n + 1 tokens and the unique experts a block that size routes to (the profile's
expectation: EVICT has no expert predictor). n = 0 makes the step an AR step. This follows the reading the project
took from the abstract and from secondary summaries of the full text (which was not reachable): see
docs/methods.md."""

from ecospec.methods import MethodSpec, Session, register
from ecospec.methods._candidates import candidates
from ecospec.methods._greedy import by_probability, picks_static
from ecospec.methods._rate import best_prefix, drafted_seconds


class EvictSession(Session):
    def choose(self, tree, experts, root_experts, budget: int) -> list[int]:
        c = candidates(self.spec, tree.parents, tree.probs, None)
        order = picks_static(c, c.probs, budget)
        drafted = drafted_seconds(self.cost, max(tree.depths), "tree")
        n, _ = best_prefix(
            [c.probs[i] for i in order], [self.cost.t_step(drafted, m + 1) for m in range(len(order) + 1)]
        )
        return sorted(order[:n])


SPEC = register(
    MethodSpec(
        name="evict",
        label="EVICT",
        colour="tab:purple",
        role="evict",
        predictor=None,
        buffered=False,
        rule=by_probability,
        adaptive=True,
        order=32,
        cost_model=True,
        session=EvictSession,
    )
)
