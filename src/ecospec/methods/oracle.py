"""oracle: EcoSpec's rule fed the target router's true expert sets (analysis only: its look-ups are not timed)."""

from ecospec.methods import MethodSpec, register
from ecospec.methods._greedy import greedy_buffered

SPEC = register(
    MethodSpec(
        name="oracle",
        label="Oracle",
        colour="tab:green",
        role="oracle",
        predictor="oracle",
        buffered=True,
        rule=greedy_buffered,
        order=40,
    )
)
