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
        self.family, self.budget, self.policy = info.family, min(budget, info.num_experts), policy
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
        """[tokens, N] the score the kept set is ranked by."""
        if self.family == "deepseek_v3":
            return logits.float().sigmoid() + router.e_score_correction_bias.float()
        return torch.softmax(logits.float(), dim=-1)

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

    def _normalises(self, router) -> bool:
        return {"qwen3_moe": bool(getattr(router, "norm_topk_prob", True)), "mixtral": True, "gpt_oss": True,
                "deepseek_v3": bool(getattr(router, "norm_topk_prob", False))}[self.family]  # fmt: skip

    def _truncate(self, router, logits, weights, indices, keep):
        inside = keep[indices]
        first_kept = int(keep.nonzero()[0])
        if self.family == "gpt_oss":  # its weights are a softmax over its top-k logits: over the kept ones now
            top = logits.gather(1, indices).float().masked_fill(~inside, float("-inf"))
            w = torch.softmax(top, dim=-1)
        elif self.family == "deepseek_v3":
            raw = logits.float().sigmoid().gather(1, indices) * inside
            w = raw / (raw.sum(-1, keepdim=True) + 1e-20) if self._normalises(router) else raw
            w = w * router.routed_scaling_factor
        else:
            probs = torch.softmax(logits.float(), dim=-1).gather(1, indices) * inside
            w = probs / probs.sum(-1, keepdim=True) if self._normalises(router) else probs
        return w, torch.where(inside, indices, torch.full_like(indices, first_kept))

    def _substitute(self, router, logits, keep):
        k = self.top_k
        if self.family == "deepseek_v3":
            scores = logits.float().sigmoid()
            choice = (scores + router.e_score_correction_bias.float()).masked_fill(~keep, float("-inf"))
            groups = router.num_group
            per = self.num_experts // groups
            grouped = choice.view(-1, groups, per)
            group_scores = grouped.topk(min(2, per), dim=-1)[0].nan_to_num(neginf=-1e30).sum(-1)
            chosen = torch.topk(group_scores, k=router.topk_group, dim=-1)[1]
            mask = torch.zeros_like(group_scores, dtype=torch.bool).scatter_(1, chosen, True)
            in_groups = choice.masked_fill(~mask.repeat_interleave(per, dim=1), float("-inf"))
            idx = torch.topk(in_groups, k=k, dim=-1)[1]
            short = torch.isinf(in_groups.gather(1, idx))  # the groups hold fewer than k kept experts: fill up
            for r in short.any(dim=1).nonzero()[:, 0].tolist():
                good = [e for e, bad in zip(idx[r].tolist(), short[r].tolist(), strict=True) if not bad]
                best = [e for e in torch.argsort(choice[r], descending=True).tolist() if keep[e] and e not in good]
                idx[r] = torch.tensor(good + best[: k - len(good)], device=idx.device)
            w = scores.gather(1, idx)
            if self._normalises(router):
                w = w / (w.sum(-1, keepdim=True) + 1e-20)
            return w * router.routed_scaling_factor, idx
        if self.family == "gpt_oss":
            top, idx = torch.topk(logits.float().masked_fill(~keep, float("-inf")), k=k, dim=-1)
            return torch.softmax(top, dim=-1), idx
        probs = torch.softmax(logits.float(), dim=-1)
        top, idx = torch.topk(probs.masked_fill(~keep, -1.0), k=k, dim=-1)
        return (top / top.sum(-1, keepdim=True) if self._normalises(router) else top), idx
