"""4-D attention masks for tree attention over a KV cache, with optional sliding windows."""

from __future__ import annotations

import torch


def visibility(prefix_len: int, tree_mask: torch.Tensor, cached_tree: torch.Tensor | None = None) -> torch.Tensor:
    """Bool [q, prefix + cached tree slots + q]: every query sees the whole prefix, the cached tree
    slots given by `cached_tree` (bool [q, slots]) and the new block by `tree_mask` (bool [q, q])."""
    q = tree_mask.shape[0]
    parts = [torch.ones(q, prefix_len, dtype=torch.bool, device=tree_mask.device)]
    if cached_tree is not None:
        parts.append(cached_tree)
    parts.append(tree_mask)
    return torch.cat(parts, dim=1)


def apply_window(
    visible: torch.Tensor, query_pos: torch.Tensor, key_pos: torch.Tensor, window: int | None
) -> torch.Tensor:
    """Restrict visibility to keys with position > query position - window (HF's sliding window). `visible`
    [q, kv] with positions [q] / [kv], or per row: [B, q, kv] with [B, q] / [B, kv]."""
    if window is None:
        return visible
    return visible & (key_pos[..., None, :] > query_pos[..., :, None] - window)


def to_4d(visible: torch.Tensor, dtype: torch.dtype, additive: bool) -> torch.Tensor:
    """[q, kv] bool -> [1, 1, q, kv] (or per row [B, q, kv] -> [B, 1, q, kv]): bool for SDPA-style kernels,
    additive float (0 / dtype min) for eager."""
    rows = visible if visible.dim() == 3 else visible[None]
    if not additive:
        return rows[:, None]
    mask = torch.zeros(rows.shape, dtype=dtype, device=rows.device)
    mask.masked_fill_(~rows, torch.finfo(dtype).min)
    return mask[:, None]
