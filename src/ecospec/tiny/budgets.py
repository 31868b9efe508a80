"""The build's budgets: every knob of the embedded default's recipe, one `Budget` per name (``"full"``, the released
one; ``"small"`` and ``"micro"``, the tests'; the across-builds study's other seeds). Each stage module owns its
recipe dataclass; this module only gathers them, so that what needs a budget (the cost model, config validation)
does not import the build."""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from ecospec.tiny.corpus import CorpusRecipe
from ecospec.tiny.drafter import DrafterRecipe
from ecospec.tiny.evaluate import EvalRecipe
from ecospec.tiny.gto import GtoRecipe
from ecospec.tiny.predictor import PredictorRecipe, TracesRecipe
from ecospec.tiny.target import TargetRecipe


@dataclass(frozen=True)
class Budget:
    """Every knob of the build. Stages read their part; all of it goes into the cache version."""

    name: str
    corpus: CorpusRecipe = field(default_factory=CorpusRecipe)
    target: TargetRecipe = field(default_factory=TargetRecipe)
    drafter: DrafterRecipe = field(default_factory=DrafterRecipe)
    traces: TracesRecipe = field(default_factory=TracesRecipe)
    predictor: PredictorRecipe = field(default_factory=PredictorRecipe)
    evaluate: EvalRecipe = field(default_factory=EvalRecipe)
    gto: GtoRecipe = field(default_factory=GtoRecipe)


BUDGETS: dict[str, Budget] = {
    "full": Budget("full"),
    "small": Budget(
        "small",
        corpus=CorpusRecipe(max_bytes=3_000_000, vocab_size=2048),
        target=TargetRecipe(
            num_layers=8,
            moe_intermediate_size=48,
            seq_len=256,
            batch_size=4,
            steps=300,
            warmup_steps=20,
            eval_tokens=16384,
        ),
        drafter=DrafterRecipe(steps=120, intermediate_size=256, train_windows=600, eval_windows=16),
        traces=TracesRecipe(samples=120),
        predictor=PredictorRecipe(hidden_size=64, head_dim=16, intermediate_size=128, steps=120),
        evaluate=EvalRecipe(prompts=4, max_new_tokens=32),
        gto=GtoRecipe(steps=20, seq_len=128, groups=4),
    ),
    "micro": Budget(
        "micro",
        corpus=CorpusRecipe(max_bytes=150_000, val_every=5, vocab_size=320),
        target=TargetRecipe(
            hidden_size=32,
            num_layers=2,
            num_heads=2,
            num_kv_heads=1,
            head_dim=16,
            num_experts=8,
            top_k=2,
            moe_intermediate_size=16,
            seq_len=64,
            batch_size=4,
            steps=30,
            warmup_steps=3,
            eval_tokens=1024,
        ),
        drafter=DrafterRecipe(
            steps=10, batch_size=2, seq_len=64, intermediate_size=64, train_windows=40, eval_windows=4
        ),
        traces=TracesRecipe(samples=24, length=64),
        predictor=PredictorRecipe(
            hidden_size=32,
            num_layers=1,
            num_heads=2,
            num_kv_heads=1,
            head_dim=16,
            intermediate_size=64,
            steps=10,
            window=64,
            thresholds=(),
        ),
        evaluate=EvalRecipe(prompts=2, max_new_tokens=8),
        gto=GtoRecipe(steps=3, seq_len=32, groups=2, group_size=4, train_windows=20, prompt_len=16),
    ),
}


def with_seed(budget: Budget, seed: int, name: str) -> Budget:
    """`budget` with every stage's seed moved by `seed` (target init and data order, the drafter's and the
    predictor's init and windows, the traces' windows): the same recipe, another draw of its weights."""
    return replace(
        budget,
        name=name,
        target=replace(budget.target, seed=budget.target.seed + seed),
        drafter=replace(budget.drafter, seed=budget.drafter.seed + seed),
        traces=replace(budget.traces, seed=budget.traces.seed + seed),
        predictor=replace(budget.predictor, seed=budget.predictor.seed + seed),
    )


# the across-builds study's other draws of the full recipe (benchmarks/studies/across_builds.py): trained into the cache
# on first use, never released (the release is seed 0)
BUDGETS.update({f"full-seed{k}": with_seed(BUDGETS["full"], 1000 * k, f"full-seed{k}") for k in (1, 2)})


def get_budget(budget: str | Budget) -> Budget:
    if isinstance(budget, Budget):
        return budget
    if budget not in BUDGETS:
        raise ValueError(f"unknown budget {budget!r}; choose one of {', '.join(BUDGETS)} or pass a Budget")
    return BUDGETS[budget]
