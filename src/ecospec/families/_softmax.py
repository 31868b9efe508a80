"""The routing rule of families whose router takes a softmax over all experts and its top-k (Qwen3-MoE, Mixtral):
the budget's score is that softmax; a truncated token keeps the softmax of its kept slots (renormalised where the
model normalises its top-k), a substituted token the top-k of the softmax among the kept experts."""

from __future__ import annotations


def scores(router, logits):
    import torch

    return torch.softmax(logits.float(), dim=-1)


def truncate(router, logits, indices, inside, normalises: bool):
    probs = scores(router, logits).gather(1, indices) * inside
    return probs / probs.sum(-1, keepdim=True) if normalises else probs


def substitute(router, logits, keep, k: int, normalises: bool):
    import torch

    top, idx = torch.topk(scores(router, logits).masked_fill(~keep, -1.0), k=k, dim=-1)
    return (top / top.sum(-1, keepdim=True) if normalises else top), idx
