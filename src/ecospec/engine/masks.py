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


_FILL: dict[tuple[torch.dtype, torch.device], tuple[torch.Tensor, torch.Tensor]] = {}


def to_4d(visible: torch.Tensor, dtype: torch.dtype, additive: bool) -> torch.Tensor:
    """[q, kv] bool -> [1, 1, q, kv] (or per row [B, q, kv] -> [B, 1, q, kv]): bool for SDPA-style kernels,
    additive float (0 / dtype min) for eager and SDPA (`forward.additive_masks`). Two ops (a view and a `where` on
    cached scalars): it runs for every forward of a step, where each op has a fixed cost on a CPU."""
    rows = visible.view(1, 1, *visible.shape) if visible.dim() == 2 else visible.unsqueeze(1)
    if not additive:
        return rows
    key = (dtype, rows.device)
    fill = _FILL.get(key)
    if fill is None:
        with torch.inference_mode(False):  # plain tensors: usable inside and outside inference mode
            fill = _FILL[key] = (
                torch.zeros((), dtype=dtype, device=rows.device),
                torch.full((), torch.finfo(dtype).min, dtype=dtype, device=rows.device),
            )
    return torch.where(rows, *fill)
