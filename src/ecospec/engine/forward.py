"""One model forward over a block of tokens with an explicit visibility matrix.

Every forward of the engine (prefill, verification, oracle routing, draft-LM steps) goes through
here, so tree attention and sliding windows are handled in one place. Caches are plain
`DynamicCache`s with full-length layers: sliding windows are enforced by the mask, never by
evicting cache entries (an evicting cache cannot be compacted back to an accepted path).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from transformers import DynamicCache

from ecospec.engine.masks import apply_window, to_4d


@dataclass(frozen=True)
class AttentionLayout:
    """Sliding window per attention layer type, and whether the model takes one mask per type. With the model's
    mask format (`attention_layout(config, model)`: additive float masks for eager and SDPA, bool otherwise) a
    forward need not look it up: `model.dtype` walks the parameters, and the engine runs several forwards a step."""

    windows: dict[str, int | None]
    by_type: bool
    mask_dtype: torch.dtype | None = None  # None: read from the model at each forward
    additive: bool | None = None

    @property
    def windowed(self) -> bool:
        return any(w is not None for w in self.windows.values())


def attention_layout(config, model=None) -> AttentionLayout:
    """Models with `layer_types` (GPT-OSS) take {layer type: mask}; the others (Qwen3-MoE, Mixtral,
    DeepSeek-V3) one mask for all layers, windowed iff `sliding_window` is set (Qwen3 clears it
    unless `use_sliding_window`). `model`: also fix its mask format (call again if its attention changes)."""
    types = getattr(config, "layer_types", None)
    window = getattr(config, "sliding_window", None)
    if getattr(config, "use_sliding_window", True) is False:
        window = None
    fmt = {} if model is None else {"mask_dtype": model.dtype, "additive": additive_masks(config)}
    if types:
        windows = {t: (window if "sliding" in t else None) for t in sorted(set(types))}
        return AttentionLayout(windows, by_type=True, **fmt)
    if window is not None:
        return AttentionLayout({"sliding_attention": window}, by_type=False, **fmt)
    return AttentionLayout({"full_attention": None}, by_type=False, **fmt)


def additive_masks(config) -> bool:
    """Eager attention adds the mask; SDPA takes a float mask as is but turns a bool one into a float one in every
    layer (three ops a layer), so both get an additive float mask (0 / dtype min: the same softmax)."""
    return config._attn_implementation in ("eager", "sdpa")


def new_cache() -> DynamicCache:
    return DynamicCache()


def cache_len(cache: DynamicCache) -> int:
    return cache.get_seq_length()


def forward_block(
    model,
    layout: AttentionLayout,
    cache: DynamicCache,
    tokens: torch.Tensor | None,
    query_pos: torch.Tensor,
    key_pos: torch.Tensor | None,
    visible: torch.Tensor | None,
    *,
    hidden: bool = False,
    logits_to_keep: int = 0,
    embeds: torch.Tensor | None = None,
):
    """Run `tokens` [1, q] at positions `query_pos` [q] (or [1, q]) against cache + themselves.

    key_pos [kv] are the positions of the cached entries followed by query_pos (None: no sliding window reads
    them); visible is bool [q, kv]. Per row, for a batch: tokens [B, q], query_pos [B, q], key_pos [B, kv],
    visible [B, q, kv]. `visible=None`: the block is causal and follows the cache contiguously (a prefill, an AR
    step), so the model builds its own mask (sliding windows included), as in HF's `generate`.
    `embeds` [B, q, H] replaces `tokens` as `inputs_embeds` (models fed embeddings, e.g. the
    expert predictor's backbone). Returns the HF output (logits, and hidden_states when `hidden`).
    """
    mask = None
    if visible is not None:
        dtype = layout.mask_dtype if layout.mask_dtype is not None else model.dtype
        additive = layout.additive if layout.additive is not None else additive_masks(model.config)
        masks = {
            t: to_4d(apply_window(visible, query_pos, key_pos, w), dtype, additive=additive)
            for t, w in layout.windows.items()
        }
        mask = masks if layout.by_type else next(iter(masks.values()))
    inputs = {"input_ids": tokens} if embeds is None else {"inputs_embeds": embeds}
    return model(
        **inputs,
        position_ids=query_pos if query_pos.dim() == 2 else query_pos[None],
        attention_mask=mask,
        cache=cache,
        use_cache=True,
        output_hidden_states=hidden,
        logits_to_keep=logits_to_keep,
    )


def crop_cache(cache: DynamicCache, width: int) -> None:
    """Drop every cache slot from `width` on (transformers >= 5.24: `crop(-n)` drops the last n)."""
    extra = cache.get_seq_length() - width
    if extra > 0:
        cache.crop(-extra)


def filled_layers(cache: DynamicCache):
    """The cache layers that hold entries (lazily initialised layers of a fresh cache are skipped)."""
    for layer in cache.layers:
        if getattr(layer, "is_initialized", True) and layer.keys is not None and layer.keys.numel():
            yield layer


def compact_cache(cache: DynamicCache, start: int, keep: list[int]) -> None:
    """Keep cache entries [0, start) followed by entries start + keep[i], drop the rest.

    Used after verification: the accepted path's KV moves right after the prefix.
    """
    n = start + len(keep)
    contiguous = keep == list(range(len(keep)))
    if contiguous and cache.get_seq_length() == n:  # nothing to drop (an AR step, a fully accepted block)
        return
    idx = None if contiguous else torch.tensor(keep) + start
    for layer in filled_layers(cache):
        if idx is not None:
            i = idx.to(layer.keys.device)
            layer.keys[..., start:n, :] = layer.keys[..., i, :]
            layer.values[..., start:n, :] = layer.values[..., i, :]
        layer.keys = layer.keys[..., :n, :]
        layer.values = layer.values[..., :n, :]
