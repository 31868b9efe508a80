"""confidence: EAGLE-2/3's rerank, the largest cumulative draft probability P (the baseline)."""

from ecospec.methods import MethodSpec, register
from ecospec.methods._greedy import by_probability

SPEC = register(
    MethodSpec(
        name="confidence",
        label="",
        colour="tab:blue",
        role="baseline",
        predictor=None,
        buffered=False,
        rule=by_probability,
        order=10,
    )
)
