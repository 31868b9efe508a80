"""confidence: EAGLE-2/3's rerank, the largest cumulative draft probability P (the baseline)."""

from ecospec.methods import Candidates, MethodSpec, register
from ecospec.methods._greedy import greedy_static


def rule(c: Candidates, budget: int) -> list[int]:
    return greedy_static(c, c.probs, budget)


SPEC = register(MethodSpec(name="confidence", label="", colour="tab:blue", role="baseline", predictor=None,
                           buffered=False, rule=rule, order=10))  # fmt: skip
