"""DeepSeek-V3 (DeepSeek-V3.1): a sigmoid router score plus e_score_correction_bias, grouped routing (n_group,
topk_group), top-k weights renormalised where norm_topk_prob says, then routed_scaling_factor; MLA attention;
the first first_k_dense_replace layers dense; shared experts.

Presets: `deepseek_v3-a` MLA with q-LoRA, grouped routing (4 groups, 2 kept), one dense first layer, one shared
expert; `deepseek_v3-b` MLA without q-LoRA, two dense first layers, 2 groups."""

from ecospec.families import IDS, Family, register
from ecospec.families._counts import Counts


def scores(router, logits):
    return logits.float().sigmoid() + router.e_score_correction_bias.float()


def truncate(router, logits, indices, inside, normalises: bool):
    raw = logits.float().sigmoid().gather(1, indices) * inside
    w = raw / (raw.sum(-1, keepdim=True) + 1e-20) if normalises else raw
    return w * router.routed_scaling_factor


def substitute(router, logits, keep, k: int, normalises: bool):
    """The model's own choice (bias, group limit) among the kept experts; where the groups hold fewer than k kept
    experts, the best remaining kept ones fill up."""
    import torch

    raw = logits.float().sigmoid()
    choice = (raw + router.e_score_correction_bias.float()).masked_fill(~keep, float("-inf"))
    groups = router.num_group
    per = keep.shape[0] // groups
    grouped = choice.view(-1, groups, per)
    group_scores = grouped.topk(min(2, per), dim=-1)[0].nan_to_num(neginf=-1e30).sum(-1)
    chosen = torch.topk(group_scores, k=router.topk_group, dim=-1)[1]
    mask = torch.zeros_like(group_scores, dtype=torch.bool).scatter_(1, chosen, True)
    in_groups = choice.masked_fill(~mask.repeat_interleave(per, dim=1), float("-inf"))
    idx = torch.topk(in_groups, k=k, dim=-1)[1]
    short = torch.isinf(in_groups.gather(1, idx))
    for r in short.any(dim=1).nonzero()[:, 0].tolist():
        good = [e for e, bad in zip(idx[r].tolist(), short[r].tolist(), strict=True) if not bad]
        best = [e for e in torch.argsort(choice[r], descending=True).tolist() if keep[e] and e not in good]
        idx[r] = torch.tensor(good + best[: k - len(good)], device=idx.device)
    w = raw.gather(1, idx)
    if normalises:
        w = w / (w.sum(-1, keepdim=True) + 1e-20)
    return w * router.routed_scaling_factor, idx


def mla_attention(c) -> int:
    """Multi-head latent attention: the low-rank Q (or a full one) and KV projections, their norms, and O."""
    h, heads, bias = c["hidden_size"], c["num_attention_heads"], bool(c.get("attention_bias"))
    qk = c["qk_nope_head_dim"] + c["qk_rope_head_dim"]
    q_lora, kv_lora = c.get("q_lora_rank"), c["kv_lora_rank"]
    q = h * heads * qk if q_lora is None else h * q_lora + bias * q_lora + q_lora + q_lora * heads * qk
    kv_a = h * (kv_lora + c["qk_rope_head_dim"]) + bias * (kv_lora + c["qk_rope_head_dim"]) + kv_lora
    kv_b = kv_lora * heads * (c["qk_nope_head_dim"] + c["v_head_dim"])
    return q + kv_a + kv_b + heads * c["v_head_dim"] * h + bias * h


FAMILY = register(
    Family(
        name="deepseek_v3",
        causal_lm="DeepseekV3ForCausalLM",
        config_class=("transformers.models.deepseek_v3.configuration_deepseek_v3", "DeepseekV3Config"),
        router="gate",
        presets={
            "deepseek_v3-a": {
                "model_type": "deepseek_v3",
                **IDS,
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
                **IDS,
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
        },
        check_preset="deepseek_v3-a",
        scores=scores,
        normalises=lambda router: bool(getattr(router, "norm_topk_prob", False)),
        truncate=truncate,
        substitute=substitute,
        counts=Counts(
            experts_keys=("n_routed_experts",),
            defaulted=("attention_bias", "q_lora_rank", "intermediate_size", "num_key_value_heads"),
            attention=mla_attention,
            moe_layers=lambda c, n: tuple(range(c["first_k_dense_replace"], c["num_hidden_layers"])),
            shared=lambda c: 3 * c["hidden_size"] * c["moe_intermediate_size"] * c["n_shared_experts"],
            head_dim=lambda c: c["qk_rope_head_dim"],  # the rope part, as the config class gives it
        ),
        order=30,
    )
)
