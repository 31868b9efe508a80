"""global_cost: the EcoSpec paper's ablation (Table 4), the largest static P / (|E_traj(i)| + eps), no buffer."""

from ecospec.methods import Candidates, MethodSpec, register
from ecospec.methods._greedy import greedy_static


def rule(c: Candidates, budget: int) -> list[int]:
    scores = [pr / (t.bit_count() + c.eps) for pr, t in zip(c.probs, c.traj, strict=True)]
    return greedy_static(c, scores, budget)


SPEC = register(
    MethodSpec(
        name="global_cost",
        label="Global Cost",
        colour="tab:orange",
        role="global_cost",
        predictor="learned",
        buffered=False,
        rule=rule,
        order=20,
    )
)
