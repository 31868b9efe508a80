"""GPT-OSS (gpt-oss-120b): a biased router whose top-k weights are a softmax over the top-k logits; alternating
sliding / full attention with sinks. Transformers' tensor-parallel plan shards only its input embedding and its
expert-parallel forward fails (`broken`), so beyond one GPU it runs device_map.

Presets: `gpt_oss-a` / `-b` alternating sliding/full attention layers (window 8 / 16, so prompts of 20+ tokens
exceed the window), attention sinks, biased router and experts."""

from ecospec.families import IDS, Family, register
from ecospec.families._counts import Counts, attention
from ecospec.families._softmax import scores


def truncate(router, logits, indices, inside, normalises: bool):
    import torch

    top = logits.gather(1, indices).float().masked_fill(~inside, float("-inf"))
    return torch.softmax(top, dim=-1)  # a softmax over its top-k logits: over the kept ones now


def substitute(router, logits, keep, k: int, normalises: bool):
    import torch

    top, idx = torch.topk(logits.float().masked_fill(~keep, float("-inf")), k=k, dim=-1)
    return torch.softmax(top, dim=-1), idx


def expert(c) -> int:
    """gate_up and down, with their biases."""
    h, i = c["hidden_size"], c["intermediate_size"]
    return 3 * h * i + 2 * i + h


FAMILY = register(
    Family(
        name="gpt_oss",
        causal_lm="GptOssForCausalLM",
        config_class=("transformers.models.gpt_oss.configuration_gpt_oss", "GptOssConfig"),
        router="router",
        presets={
            "gpt_oss-a": {
                "model_type": "gpt_oss",
                **IDS,
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
                **IDS,
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
        },
        check_preset="gpt_oss-a",
        scores=scores,
        normalises=lambda router: True,
        truncate=truncate,
        substitute=substitute,
        broken={"ep": "transformers' expert-parallel GPT-OSS forward fails (router one-hot over local experts)"},
        counts=Counts(
            experts_keys=("num_local_experts",),
            defaulted=("attention_bias", "head_dim", "num_key_value_heads"),
            expert=expert,
            attention=lambda c: attention(c) + c["num_attention_heads"],  # + the per-head sinks
            router=lambda c, n: n * c["hidden_size"] + n,  # with a bias
        ),
        order=20,
    )
)
