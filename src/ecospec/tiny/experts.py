"""A training-time experts kernel for the tiny target: `experts_implementation="ecospec_sorted"`.

Same function as transformers' eager per-expert loop (the loop the target runs at decode time, so a pass's cost
grows with its unique experts), computed for training with a third fewer ops and deterministically:
the (token, slot) pairs are sorted by expert once, each expert multiplies one contiguous slice, and the results
are put back by a permutation. Transformers' `grouped_mm` is faster still but not run-to-run deterministic on a
2-thread CPU (its backward scatters with duplicate indices); this one is (`tests/test_tiny.py`). The step times
compared: docs/embedded-default.md, "How the recipe was chosen".
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from transformers.integrations.moe import ALL_EXPERTS_FUNCTIONS

NAME = "ecospec_sorted"


def sorted_experts_forward(
    self: torch.nn.Module, hidden_states: torch.Tensor, top_k_index: torch.Tensor, top_k_weights: torch.Tensor
) -> torch.Tensor:
    """Routed-expert output [tokens, H] of a fused experts module (gate_up_proj [N, 2I, H], down_proj [N, H, I])."""
    num_tokens, hidden = hidden_states.shape
    k = top_k_index.shape[-1]
    flat = top_k_index.reshape(-1)
    order = torch.argsort(flat, stable=True)  # pairs grouped by expert
    counts = torch.bincount(flat, minlength=self.num_experts).tolist()
    # repeat, then permute: both backwards are deterministic (a sum over k; a scatter without duplicates)
    x = hidden_states.repeat_interleave(k, dim=0).index_select(0, order)
    outs = []
    parts = zip(x.split(counts), self.gate_up_proj.unbind(0), self.down_proj.unbind(0), counts, strict=True)
    for xe, gate_up, down, n in parts:
        if n:
            gate, up = F.linear(xe, gate_up).chunk(2, dim=-1)
            outs.append(F.linear(self.act_fn(gate) * up, down))
    y = torch.cat(outs).index_select(0, torch.argsort(order)) * top_k_weights.reshape(-1, 1).to(hidden_states.dtype)
    return y.view(num_tokens, k, hidden).sum(dim=1)


ALL_EXPERTS_FUNCTIONS.register(NAME, sorted_experts_forward)
