"""The RMSNorm of the drafters' heads and the expert predictor, as one function: normalised in float32 and scaled in
the input's dtype, as HF's Llama-style norms do, in one fused op where the input and weight are already in a dtype
it may stay in (drafting and prediction run it often). Our EAGLE-3 head keeps float64 in float64; a norm of an HF
module (`hf=True`: the predictor's backbone) normalises even float64 in float32, as its own forward does. (The
compiled target keeps transformers' Qwen3 formula, `static_qwen3._rms`, so that its logits match the eager
target's op for op.)"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float, hf: bool = False) -> torch.Tensor:
    if x.dtype in ((torch.float32,) if hf else (torch.float32, torch.float64)) and weight.dtype == x.dtype:
        return F.rms_norm(x, (x.shape[-1],), weight, eps)
    return weight * F.rms_norm(x.float(), (x.shape[-1],), None, eps).to(x.dtype)
