"""Mixtral (Mixtral-8x7B): a softmax router over all experts, top-k always renormalised; every layer MoE.

Presets: `mixtral-a` full attention; `mixtral-b` a sliding window of 12 for all layers."""

from ecospec.families import IDS, Family, register
from ecospec.families import _softmax as rule
from ecospec.families._counts import Counts

FAMILY = register(
    Family(
        name="mixtral",
        causal_lm="MixtralForCausalLM",
        config_class=("transformers.models.mixtral.configuration_mixtral", "MixtralConfig"),
        router="gate",
        presets={
            "mixtral-a": {
                "model_type": "mixtral",
                **IDS,
                "hidden_size": 48,
                "intermediate_size": 32,
                "num_hidden_layers": 2,
                "num_attention_heads": 4,
                "num_key_value_heads": 2,
                "head_dim": 12,
                "num_local_experts": 8,
                "num_experts_per_tok": 2,
                "max_position_embeddings": 1024,
            },
            "mixtral-b": {
                "model_type": "mixtral",
                **IDS,
                "hidden_size": 64,
                "intermediate_size": 32,
                "num_hidden_layers": 3,
                "num_attention_heads": 4,
                "num_key_value_heads": 2,
                "head_dim": 16,
                "num_local_experts": 16,
                "num_experts_per_tok": 4,
                "sliding_window": 12,
                "max_position_embeddings": 1024,
            },
        },
        check_preset="mixtral-b",
        scores=rule.scores,
        normalises=lambda router: True,
        truncate=rule.truncate,
        substitute=rule.substitute,
        counts=Counts(
            experts_keys=("num_local_experts",), expert=lambda c: 3 * c["hidden_size"] * c["intermediate_size"]
        ),
        order=40,
    )
)
