"""The build's budgets: every knob of the embedded default's recipe, one `Budget` per name (``"full"``, the released
one; ``"small"`` and ``"micro"``, the tests'; the across-builds study's other seeds), and each stage's recipe
dataclass. Plain data, no torch: what needs a budget (the cost model, config validation, the report's reading of a
build's files) does not import the build or its trainers."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace

from ecospec.tiny.corpus import BOS_ID, EOS_ID, PAD_ID


@dataclass(frozen=True)
class CorpusRecipe:
    max_bytes: int = 12_000_000  # cap on the sorted stdlib file list (above the 3.11 stdlib minus exclusions)
    val_every: int = 20  # every 20th file is held out
    vocab_size: int = 4096
    min_frequency: int = 2


@dataclass(frozen=True)
class TargetRecipe:
    """Model size and training knobs of the embedded target (all of it goes into the cache key)."""

    hidden_size: int = 64
    num_layers: int = 20
    # 2 heads of 32 (1 KV head): vLLM's CPU attention takes head sizes 32, 64, 80, ... (not 16), and the projections
    # keep the shapes (and costs) of the earlier 4 heads of 16
    num_heads: int = 2
    num_kv_heads: int = 1
    head_dim: int = 32
    num_experts: int = 32
    top_k: int = 4
    moe_intermediate_size: int = 64
    norm_topk_prob: bool = True
    tie_word_embeddings: bool = False
    initializer_range: float = 0.02
    rope_theta: float = 10000.0
    max_position_embeddings: int = 2048
    seq_len: int = 256
    batch_size: int = 4
    steps: int = 800
    lr: float = 3e-3
    min_lr_ratio: float = 0.1
    warmup_steps: int = 50
    weight_decay: float = 0.1
    beta2: float = 0.95
    grad_clip: float = 1.0
    router_aux_loss_coef: float = 0.04
    experts_implementation: str = "ecospec_sorted"
    eval_tokens: int = 32768
    seed: int = 0
    min_share: float = 0.001
    max_over_mean: float = 5.0

    def hf_config(self, vocab_size: int) -> dict:
        """The target's ``Qwen3MoeConfig`` arguments (with its ``model_type``): every layer MoE, no shared expert
        (Qwen3's layout). A plain mapping, so that the cost model counts the target without transformers."""
        return {
            "model_type": "qwen3_moe",
            "vocab_size": vocab_size,
            "hidden_size": self.hidden_size,
            "intermediate_size": 4 * self.hidden_size,  # dense MLP size; unused (no mlp_only_layers)
            "moe_intermediate_size": self.moe_intermediate_size,
            "num_hidden_layers": self.num_layers,
            "num_attention_heads": self.num_heads,
            "num_key_value_heads": self.num_kv_heads,
            "head_dim": self.head_dim,
            "num_experts": self.num_experts,
            "num_experts_per_tok": self.top_k,
            "norm_topk_prob": self.norm_topk_prob,
            "decoder_sparse_step": 1,
            "mlp_only_layers": [],
            "router_aux_loss_coef": self.router_aux_loss_coef,
            "output_router_logits": False,
            "initializer_range": self.initializer_range,
            "rope_parameters": {"rope_type": "default", "rope_theta": self.rope_theta},
            "max_position_embeddings": self.max_position_embeddings,
            "tie_word_embeddings": self.tie_word_embeddings,
            "pad_token_id": PAD_ID,
            "bos_token_id": BOS_ID,
            "eos_token_id": EOS_ID,
            "use_cache": True,
        }


@dataclass(frozen=True)
class DrafterRecipe:
    steps: int = 450
    lr: float = 3e-3
    batch_size: int = 4
    seq_len: int = 256
    ttt_steps: int = 3
    intermediate_size: int = 512  # the head's MLP (8 x hidden): agrees with the target better than 4 x hidden
    train_windows: int = 3000
    eval_windows: int = 32
    seed: int = 0


@dataclass(frozen=True)
class EvalRecipe:
    prompts: int = 8
    max_new_tokens: int = 64
    gamma: int = 4
    depth: int = 3
    topk: int = 2


@dataclass(frozen=True)
class GtoRecipe:
    steps: int = 100
    lr: float = 3e-4
    warmup_steps: int = 10
    batch_size: int = 2
    seq_len: int = 256
    groups: int = 8
    group_size: int = 8
    depth: int = 3
    topk: int = 2
    train_windows: int = 256  # texts (generated: 256 x 192 new tokens, batched)
    seed: int = 4
    data: str = "generated"  # generated: train-split prompts answered greedily by the target (GTO's data); corpus
    prompt_len: int = 64  # generated: each window is a prompt of the train stream + the target's continuation
    gen_batch: int = 128
    gto_weight: float = 0.5  # 0: continued EAGLE-3 training on the same texts (the ablation)

    def __post_init__(self) -> None:
        if self.data not in ("generated", "corpus"):
            raise ValueError(f"GtoRecipe.data: {self.data!r}; choose generated or corpus")
        if self.data == "generated" and not 0 < self.prompt_len < self.seq_len:
            raise ValueError(f"GtoRecipe: prompt_len {self.prompt_len} must be in (0, seq_len={self.seq_len})")


@dataclass(frozen=True)
class TracesRecipe:
    samples: int = 800  # windows of the corpus stream (80/20 split by sample at training time)
    length: int = 256
    seed: int = 2


@dataclass(frozen=True)
class PredictorRecipe:
    hidden_size: int = 64
    num_layers: int = 1
    num_heads: int = 2
    num_kv_heads: int = 1
    head_dim: int = 32
    intermediate_size: int = 128
    steps: int = 800
    lr: float = 2e-3
    batch_size: int = 8
    window: int = 256
    # (checkpoint name, held-out accuracy): the first checkpoint at or above each level is kept (Table 9)
    thresholds: tuple[tuple[str, float], ...] = (("acc50", 0.5), ("acc60", 0.65))
    seed: int = 0


@dataclass(frozen=True)
class CalibrateRecipe:
    prompts_per_dataset: int = 8
    max_new_tokens: int = 64
    depth: int = 3


# the calibrate stage's recipe by budget name (a budget of another name gets the default)
CALIBRATE_RECIPES = {"full": CalibrateRecipe(), "small": CalibrateRecipe(4, 32), "micro": CalibrateRecipe(2, 12)}


def calibrate_recipe(budget: Budget) -> dict:
    """The calibrate stage's part of a budget (its key)."""
    return asdict(CALIBRATE_RECIPES.get(budget.name, CalibrateRecipe()))


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
