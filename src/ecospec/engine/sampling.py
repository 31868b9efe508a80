"""The target's token distribution, shared by AR and SD so that both sample from the same p."""

from __future__ import annotations

import torch


def target_probs(logits: torch.Tensor, temperature: float, top_p: float = 1.0) -> torch.Tensor:
    """Softmax(logits / T) in float64, restricted to the top-p nucleus (HF semantics: keep the
    smallest prefix of the sorted tokens whose mass reaches top_p, at least one) and renormalised."""
    probs = torch.softmax(logits.double() / temperature, dim=-1)
    if top_p < 1.0:
        sorted_p, order = probs.sort(dim=-1, descending=True)
        before = sorted_p.cumsum(-1) - sorted_p  # mass strictly before each token
        drop = before >= top_p
        drop[..., 0] = False
        probs = probs.scatter(-1, order, sorted_p.masked_fill(drop, 0.0))
        probs = probs / probs.sum(-1, keepdim=True)
    return probs
