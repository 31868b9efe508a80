"""Parameter counts of a supported MoE target from its HF config as a plain mapping (`PretrainedConfig.to_dict()`:
config.json's fields with the class defaults filled in), by its family's rules (`Family.counts`: a new family says
how its modules differ in its own module), without building the model:
no torch, any size. `tests/test_param_count.py` holds it equal to the count of the model built on the meta device
(`adapters.config_moe_info`) for every family's presets and every conf/model's facts.

Per decoder layer: attention (Q/K/V/O, their biases where the config sets `attention_bias`; Qwen3-MoE's q/k norms,
GPT-OSS's per-head sinks, DeepSeek-V3's low-rank MLA projections and their norms), two RMS norms, and either a
dense gated MLP (3 x hidden x intermediate) or a MoE block: N routed experts, the router (GPT-OSS's with a bias)
and DeepSeek-V3's shared experts. Plus the input embedding, the final norm and the lm_head (once when tied).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from ecospec.families import Counts, family, names
from ecospec.families._counts import head_dim as decoder_head_dim


@dataclass(frozen=True)
class MoeInfo:
    family: str  # the HF model_type (`ecospec.families`)
    num_layers: int
    moe_layers: tuple[int, ...]  # decoder-layer indices that have a routed-expert block
    num_experts: int  # N routed experts per MoE layer
    top_k: int  # k experts per token
    expert_params: int  # parameters of ONE routed expert (incl. its biases for gpt-oss)
    shared_expert_params: int  # per MoE layer (DeepSeek shared experts), 0 otherwise
    dense_params: int  # every parameter that is not a routed expert

    @property
    def num_moe_layers(self) -> int:
        return len(self.moe_layers)

    @property
    def routed_params(self) -> int:
        """All routed-expert parameters of the model."""
        return self.expert_params * self.num_experts * len(self.moe_layers)

    @property
    def total_params(self) -> int:
        return self.dense_params + self.routed_params

    @property
    def active_params(self) -> int:
        """Parameters touched by one token (dense part + k routed experts per MoE layer)."""
        return self.dense_params + self.expert_params * self.top_k * len(self.moe_layers)


def _counts(c: Mapping) -> Counts:
    """The counting rules of the config's family (`families.<name>.counts`)."""
    kind = c.get("model_type")
    if kind not in names():
        raise ValueError(f"model_type {kind!r}: no parameter count; known: {', '.join(names())}")
    return family(kind).counts


def _num_experts(c: Mapping) -> int:
    return next(c[k] for k in _counts(c).experts_keys if c.get(k) is not None)


def head_dim(config: Mapping) -> int:
    """The attention head size as the family's config class gives it (DeepSeek-V3's is its rope part)."""
    return _counts(config).head_dim(config)


def moe_layer_params(config: Mapping) -> int:
    """One MoE decoder layer's parameters other than its routed experts: attention, two norms, router and shared
    experts (DeepSeek's MTP module is one such layer)."""
    rules = _counts(config)
    return (
        rules.attention(config)
        + 2 * config["hidden_size"]
        + rules.router(config, _num_experts(config))
        + rules.shared(config)
    )


# dense decoders the cost model counts (a draft LM, the expert predictor's backbone): model_type -> the fields read
# with a fallback that is not the config class's default
DENSE_CLASS_DEFAULTED = {
    "llama": ("num_key_value_heads",),
    "mistral": ("num_key_value_heads",),
    "qwen2": ("num_key_value_heads",),
    "qwen3": ("num_key_value_heads", "head_dim"),
}


def dense_decoder_params(config: Mapping) -> int | None:
    """A dense decoder's parameters without its input embedding and lm_head (its layers and final norm); None for
    a model_type or a config this does not count (`DENSE_CLASS_DEFAULTED`: transformers' class fills it in)."""
    c = config
    kind = c.get("model_type")
    if kind not in DENSE_CLASS_DEFAULTED or not all(k in c for k in DENSE_CLASS_DEFAULTED[kind]):
        return None
    h, heads, kv = c["hidden_size"], c["num_attention_heads"], c["num_key_value_heads"] or c["num_attention_heads"]
    head = decoder_head_dim(c)
    qkv_bias = heads * head + 2 * kv * head
    attention = 2 * h * heads * head + 2 * h * kv * head
    if kind == "qwen2":
        attention += qkv_bias  # q, k and v carry a bias
    elif c.get("attention_bias"):
        attention += qkv_bias + h
    if kind == "qwen3":
        attention += 2 * head  # q_norm, k_norm
    mlp = 3 * h * c["intermediate_size"] + (2 * c["intermediate_size"] + h if c.get("mlp_bias") else 0)
    return c["num_hidden_layers"] * (attention + mlp + 2 * h) + h


def counts_complete(config: Mapping) -> bool:
    """Whether `config` names every field `count_params` reads: config.json as a checkpoint writes it may leave
    fields at their class defaults, which only transformers' config class fills in."""
    try:
        count_params(config)
    except (KeyError, ValueError):
        return False
    return all(key in config for key in ("tie_word_embeddings", *_counts(config).defaulted))


def count_params(config: Mapping) -> MoeInfo:
    """`MoeInfo` of a supported target from its HF config mapping (class defaults filled in)."""
    c, rules = config, _counts(config)
    h, n = c["hidden_size"], _num_experts(c)
    moe = rules.moe_layers(c, n)
    shared, router = rules.shared(c), rules.router(c, n)
    dense_mlp = 3 * h * c.get("intermediate_size", 0)
    layers = c["num_hidden_layers"]
    per_layer = rules.attention(c) + 2 * h
    non_expert = layers * per_layer + len(moe) * (router + shared) + (layers - len(moe)) * dense_mlp
    table = c["vocab_size"] * h
    dense = non_expert + h + table * (1 if c.get("tie_word_embeddings") else 2)
    return MoeInfo(
        family=c["model_type"],
        num_layers=layers,
        moe_layers=moe,
        num_experts=n,
        top_k=c["num_experts_per_tok"],
        expert_params=rules.expert(c),
        shared_expert_params=shared,
        dense_params=dense,
    )
