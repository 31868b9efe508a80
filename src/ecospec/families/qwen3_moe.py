"""Qwen3-MoE (Qwen3-235B-A22B, Qwen3-30B-A3B): a softmax router over all experts, top-k renormalised where the
config's norm_topk_prob says; dense layers via mlp_only_layers / decoder_sparse_step.

Presets: `qwen3_moe-a` every layer MoE (N=8, k=2); `qwen3_moe-b` dense layers 0 and 2 via mlp_only_layers (N=16,
k=4)."""

from ecospec.families import IDS, Family, register
from ecospec.families import _softmax as rule

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
        order=10,
    )
)
