"""How a family's HF config (a plain mapping, `PretrainedConfig.to_dict()`'s fields) gives its parameter counts
(`models.param_count`): each family's record holds a `Counts`, the standard decoder's rules by default, so that a new
family whose modules differ says how in its own module."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass


def head_dim(c: Mapping) -> int:
    """The attention head size: `head_dim`, else hidden / heads."""
    return c.get("head_dim") or c["hidden_size"] // c["num_attention_heads"]


def attention(c: Mapping) -> int:
    """Q/K/V/O and, where `attention_bias` is set, their biases."""
    h, heads, kv, head = c["hidden_size"], c["num_attention_heads"], c["num_key_value_heads"], head_dim(c)
    bias = bool(c.get("attention_bias"))
    return 2 * h * heads * head + 2 * h * kv * head + bias * (heads * head + 2 * kv * head + h)


def every_layer(c: Mapping, n: int) -> tuple[int, ...]:
    return tuple(range(c["num_hidden_layers"]))


def swiglu_expert(c: Mapping) -> int:
    """One routed SwiGLU expert of width `moe_intermediate_size`: gate, up and down."""
    return 3 * c["hidden_size"] * c["moe_intermediate_size"]


@dataclass(frozen=True)
class Counts:
    experts_keys: tuple[str, ...]  # the config keys that may hold N (config.json's name, then what `to_dict` writes)
    # the fields the count reads with a fallback (`.get`) that is not the config class's default: a config without
    # them is counted after transformers fills them in (`param_count.counts_complete`)
    defaulted: tuple[str, ...] = ("num_key_value_heads",)
    expert: Callable[[Mapping], int] = swiglu_expert  # one routed expert, its biases included
    attention: Callable[[Mapping], int] = attention  # one layer's attention, its norms included
    moe_layers: Callable[[Mapping, int], tuple[int, ...]] = every_layer  # (config, N) -> MoE decoder layers
    shared: Callable[[Mapping], int] = lambda c: 0  # one MoE layer's shared experts
    router: Callable[[Mapping, int], int] = lambda c, n: n * c["hidden_size"]  # (config, N) -> one router
    head_dim: Callable[[Mapping], int] = head_dim  # the attention head size as the config class gives it
