"""Top-k routing accuracy (paper App. B.1): mean overlap |predicted top-k ∩ true top-k| / k."""

from __future__ import annotations

import torch


def topk_overlap(logits: torch.Tensor, routes: torch.Tensor, k: int) -> torch.Tensor:
    """|pred ∩ true| / k per token and layer: logits [..., L, N], routes [..., L, k] -> [..., L]."""
    pred = logits.topk(k, dim=-1).indices
    hits = (pred[..., :, None] == routes[..., None, :].long()).any(dim=-1)  # [..., L, k]
    return hits.sum(dim=-1).double() / k


def topk_accuracy(logits: torch.Tensor, routes: torch.Tensor, k: int) -> float:
    """Mean of `topk_overlap` over all tokens and MoE layers."""
    return float(topk_overlap(logits, routes, k).mean())
