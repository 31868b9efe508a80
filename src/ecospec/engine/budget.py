"""MoE-Spec's expert budget (docs/design.md, "Expert budget"; lossy, for comparison): during a verify pass every MoE
layer loads at most `budget` experts, the ones with the largest score summed over the pass's tokens.

The score is the router's softmax over all experts (Qwen3-MoE, Mixtral, GPT-OSS) or DeepSeek-V3's sigmoid score plus
`e_score_correction_bias`; ties go to the smaller expert id. A token whose top-k lies inside the kept set is
untouched. Otherwise `truncate` keeps its own top-k, gives the experts outside the kept set weight 0 and renormalises
the rest where the model normalises top-k weights (Qwen3 with norm_topk_prob, Mixtral, GPT-OSS's softmax over its
top-k, DeepSeek with norm_topk_prob, then its routed scaling); a token with none of its experts kept is substituted
instead. `substitute` re-chooses the token's experts by the model's own rule restricted to the kept set (DeepSeek:
bias and group limit, the best remaining kept experts filling up where the groups leave fewer than k) and weighs
them as the model does. A zero-weight slot points at a kept expert, so the pass never touches an expert outside the
set. `budget` = N changes nothing; prefill and AR steps are never budgeted (the loops switch it on for SD verify
passes only).

It acts on the same router modules as the routing capture (a forward hook that returns the router's new output,
registered first so that the capture records what the experts really ran).
"""

from __future__ import annotations

import torch

from ecospec.families import family
from ecospec.models.adapters import bypasses_router, moe_blocks, moe_info, routers

POLICIES = ("truncate", "substitute")


class ExpertBudget:
    """`with ExpertBudget(target, budget, policy) as eb:` ... `eb.active = True` around a verify forward, with
    `eb.real` a bool [tokens] mask of the pass's real tokens (batched passes pad; padding never counts)."""

    def __init__(self, target, budget: int, policy: str = "truncate"):
        info = moe_info(target)
        if policy not in POLICIES:
            raise ValueError(f"budget_policy must be one of {', '.join(POLICIES)}, got {policy!r}")
        if not isinstance(budget, int) or budget < info.top_k:
            raise ValueError(f"expert_budget must be an integer >= top-k = {info.top_k}, got {budget!r}")
        self.family, self.budget, self.policy = family(info.family), min(budget, info.num_experts), policy
        self.num_experts, self.top_k = info.num_experts, info.top_k
        self.routers = routers(target)
        if any(bypasses_router(b) for b in moe_blocks(target)):
            raise ValueError(
                "expert_budget: this target routes inside transformers' MXFP4 Triton kernel (kept "
                "MXFP4 experts), which no budget can re-route; load it dequantized (without `kernels`)"
            )
        self.active = False
        self.real: torch.Tensor | None = None
        self._handles: list = []

    def __enter__(self) -> ExpertBudget:
        self._handles = [r.register_forward_hook(self._hook) for r in self.routers]
        return self

    def __exit__(self, *exc) -> None:
        for h in self._handles:
            h.remove()
        self._handles = []

    def _hook(self, router, args, output):
        if not self.active or self.budget >= self.num_experts:
            return None
        logits, weights, indices = output
        return logits, *self.apply(router, logits, weights, indices)

    # -- the rule -------------------------------------------------------------------------------------------------

    def scores(self, router, logits: torch.Tensor) -> torch.Tensor:
        """[tokens, N] the score the kept set is ranked by (the family's)."""
        return self.family.scores(router, logits)

    def kept(self, router, logits: torch.Tensor) -> torch.Tensor:
        """bool [N]: the `budget` experts with the largest score summed over the pass's real tokens."""
        s = self.scores(router, logits)
        if self.real is not None:
            s = s[self.real.to(s.device)]
        total = s.sum(dim=0).double()
        order = sorted(range(self.num_experts), key=lambda e: (-float(total[e]), e))
        keep = torch.zeros(self.num_experts, dtype=torch.bool, device=logits.device)
        keep[order[: self.budget]] = True
        return keep

    def apply(self, router, logits, weights, indices) -> tuple[torch.Tensor, torch.Tensor]:
        keep = self.kept(router, logits)
        inside = keep[indices]  # [tokens, k]
        fine = inside.all(dim=1)
        if bool(fine.all()):
            return weights, indices
        weights, indices = weights.clone(), indices.clone()
        rows = (~fine).nonzero()[:, 0]
        sub = rows if self.policy == "substitute" else rows[~inside[rows].any(dim=1)]
        trunc = rows if self.policy == "truncate" else rows[:0]
        trunc = trunc[inside[trunc].any(dim=1)]
        if len(trunc):
            w, i = self._truncate(router, logits[trunc], weights[trunc], indices[trunc], keep)
            weights[trunc], indices[trunc] = w.to(weights.dtype), i
        if len(sub):
            w, i = self._substitute(router, logits[sub], keep)
            weights[sub], indices[sub] = w.to(weights.dtype), i
        return weights, indices

    def _truncate(self, router, logits, weights, indices, keep):
        inside = keep[indices]
        first_kept = int(keep.nonzero()[0])
        w = self.family.truncate(router, logits, indices, inside, self.family.normalises(router))
        return w, torch.where(inside, indices, torch.full_like(indices, first_kept))

    def _substitute(self, router, logits, keep):
        return self.family.substitute(router, logits, keep, self.top_k, self.family.normalises(router))
