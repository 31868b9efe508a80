"""Qwen3-MoE (Qwen3-235B-A22B, Qwen3-30B-A3B): a softmax router over all experts, top-k renormalised where the
config's norm_topk_prob says; dense layers via mlp_only_layers / decoder_sparse_step.

Presets: `qwen3_moe-a` every layer MoE (N=8, k=2); `qwen3_moe-b` dense layers 0 and 2 via mlp_only_layers (N=16,
k=4)."""

from ecospec.families import IDS, Family, register
from ecospec.families import _softmax as rule
from ecospec.families._counts import Counts, attention, head_dim


def moe_layers(c, n: int) -> tuple[int, ...]:
    """Every `decoder_sparse_step`-th layer not in `mlp_only_layers`."""
    step, dense = c["decoder_sparse_step"], set(c.get("mlp_only_layers") or ())
    return tuple(i for i in range(c["num_hidden_layers"]) if i not in dense and n > 0 and (i + 1) % step == 0)


FAMILY = register(
    Family(
        name="qwen3_moe",
        causal_lm="Qwen3MoeForCausalLM",
        config_class=("transformers.models.qwen3_moe.configuration_qwen3_moe", "Qwen3MoeConfig"),
        router="gate",
        presets={
            "qwen3_moe-a": {
                "model_type": "qwen3_moe",
                **IDS,
                "hidden_size": 48,
                "intermediate_size": 96,
                "moe_intermediate_size": 32,
                "num_hidden_layers": 2,
                "num_attention_heads": 4,
                "num_key_value_heads": 2,
                "head_dim": 12,
                "num_experts": 8,
                "num_experts_per_tok": 2,
                "norm_topk_prob": True,
                "max_position_embeddings": 1024,
            },
            "qwen3_moe-b": {
                "model_type": "qwen3_moe",
                **IDS,
                "hidden_size": 64,
                "intermediate_size": 128,
                "moe_intermediate_size": 32,
                "num_hidden_layers": 4,
                "num_attention_heads": 4,
                "num_key_value_heads": 2,
                "head_dim": 16,
                "num_experts": 16,
                "num_experts_per_tok": 4,
                "norm_topk_prob": False,
                "mlp_only_layers": [0, 2],
                "max_position_embeddings": 1024,
            },
        },
        check_preset="qwen3_moe-a",
        scores=rule.scores,
        normalises=lambda router: bool(getattr(router, "norm_topk_prob", True)),
        truncate=rule.truncate,
        substitute=rule.substitute,
        counts=Counts(
            experts_keys=("num_experts", "num_local_experts"),
            defaulted=("attention_bias", "mlp_only_layers", "num_key_value_heads"),
            attention=lambda c: attention(c) + 2 * head_dim(c),  # + q_norm, k_norm
            moe_layers=moe_layers,
        ),
        order=10,
    )
)
