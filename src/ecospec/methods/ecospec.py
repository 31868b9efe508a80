"""ecospec: EcoSpec (paper §4.2, Alg. 1), the largest P / (|E_traj(i) \\ B| + eps), the buffer B absorbing each
pick's experts; the expert sets come from the learned predictor."""

from ecospec.methods import MethodSpec, register
from ecospec.methods._greedy import greedy_buffered

SPEC = register(
    MethodSpec(
        name="ecospec",
        label="EcoSpec",
        colour="tab:red",
        role="ecospec",
        predictor="learned",
        buffered=True,
        rule=greedy_buffered,
        order=30,
    )
)
