"""Tiny configurations of the real HF MoE architectures, for tests and CPU experiments.

Each entry is a ``model_type`` plus keyword arguments for that family's config class (the real
architecture code runs; only the sizes are tiny). A forward over 64 tokens takes milliseconds on CPU.
Token ids: pad 0, bos 1, eos 2 (vocab 256).

Variants exercise the structural features the engine must handle:

* ``qwen3_moe-a``: every layer MoE (N=8, k=2). ``qwen3_moe-b``: dense layers 0 and 2 via
  ``mlp_only_layers`` (N=16, k=4).
* ``gpt_oss-a``/``-b``: alternating sliding/full attention layers (window 8 / 16, so prompts of 20+
  tokens exceed the window), attention sinks, biased router and experts.
* ``deepseek_v3-a``: MLA with q-LoRA, grouped routing (4 groups, 2 kept), one dense first layer,
  one shared expert. ``deepseek_v3-b``: MLA without q-LoRA, two dense first layers, 2 groups.
* ``mixtral-a``: full attention. ``mixtral-b``: a sliding window of 12 for all layers.
"""

from __future__ import annotations

_IDS = {
    "vocab_size": 256,
    "pad_token_id": 0,
    "bos_token_id": 1,
    "eos_token_id": 2,
    "tie_word_embeddings": False,
}

PRESETS: dict[str, dict] = {
    "qwen3_moe-a": {
        "model_type": "qwen3_moe",
        **_IDS,
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
        **_IDS,
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
    "gpt_oss-a": {
        "model_type": "gpt_oss",
        **_IDS,
        "hidden_size": 48,
        "intermediate_size": 32,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 12,
        "num_local_experts": 8,
        "num_experts_per_tok": 2,
        "sliding_window": 8,
        "layer_types": ["sliding_attention", "full_attention"],
    },
    "gpt_oss-b": {
        "model_type": "gpt_oss",
        **_IDS,
        "hidden_size": 64,
        "intermediate_size": 32,
        "num_hidden_layers": 4,
        "num_attention_heads": 4,
        "num_key_value_heads": 1,
        "head_dim": 16,
        "num_local_experts": 16,
        "num_experts_per_tok": 4,
        "sliding_window": 16,
        "layer_types": ["sliding_attention", "full_attention"] * 2,
    },
    # DeepSeek-V3: 16 experts in 4 groups of 4; a token picks its 2 best groups (group score = sum of the
    # group's top-2 biased sigmoid scores), then its top-4 experts within those 8.
    "deepseek_v3-a": {
        "model_type": "deepseek_v3",
        **_IDS,
        "hidden_size": 48,
        "intermediate_size": 96,
        "moe_intermediate_size": 32,
        "num_hidden_layers": 3,
        "num_attention_heads": 4,
        "num_key_value_heads": 4,
        "n_routed_experts": 16,
        "num_experts_per_tok": 4,
        "n_group": 4,
        "topk_group": 2,
        "n_shared_experts": 1,
        "first_k_dense_replace": 1,
        "q_lora_rank": 24,
        "kv_lora_rank": 16,
        "qk_nope_head_dim": 8,
        "qk_rope_head_dim": 8,  # rotary dim: must be even
        "v_head_dim": 12,
        "max_position_embeddings": 1024,
    },
    "deepseek_v3-b": {
        "model_type": "deepseek_v3",
        **_IDS,
        "hidden_size": 64,
        "intermediate_size": 128,
        "moe_intermediate_size": 24,
        "num_hidden_layers": 4,
        "num_attention_heads": 4,
        "num_key_value_heads": 4,
        "n_routed_experts": 8,
        "num_experts_per_tok": 2,
        "n_group": 2,
        "topk_group": 1,
        "n_shared_experts": 2,
        "first_k_dense_replace": 2,
        "q_lora_rank": None,
        "kv_lora_rank": 24,
        "qk_nope_head_dim": 12,
        "qk_rope_head_dim": 4,
        "v_head_dim": 16,
        "max_position_embeddings": 1024,
    },
    "mixtral-a": {
        "model_type": "mixtral",
        **_IDS,
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
        **_IDS,
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
}
