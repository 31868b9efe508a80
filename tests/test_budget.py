"""MoE-Spec's expert budget (engine/budget.py): budget = N changes nothing (outputs equal AR), a budget B < N caps
every SD verify pass at B experts per MoE layer (the records' E shows it) while prefill and AR are never budgeted,
and the kept set and the two policies follow docs/design.md's rule on every family."""

from __future__ import annotations

import pytest
import torch
from conftest import FAMILY_PRESETS, prompt

import ecospec
from ecospec.drafters.draft_model import DraftModelDrafter
from ecospec.engine.budget import ExpertBudget
from ecospec.models.adapters import moe_info, routers

FAMILIES = ["qwen3_moe-a", "gpt_oss-a", "deepseek_v3-a", "mixtral-a"]


@pytest.mark.parametrize("preset", FAMILY_PRESETS)
def test_budget_n_is_the_unbudgeted_target_and_b_caps_every_verify_pass(models64, preset):
    target, draft = models64(preset)
    info = moe_info(target)
    ids = prompt(14, target.config.vocab_size, seed=3)
    kw = dict(drafter=DraftModelDrafter(draft), max_new_tokens=12, eos_token_id=[])
    ar = ecospec.generate(target, ids, max_new_tokens=12, eos_token_id=[])
    full = ecospec.generate(target, ids, expert_budget=info.num_experts, **kw)
    assert full.tokens == ar.tokens
    for policy in ("truncate", "substitute"):
        cap = ecospec.generate(target, ids, expert_budget=info.top_k, budget_policy=policy, **kw)
        assert all(max(s.experts) <= info.top_k for s in cap.steps), policy
        assert len(cap.tokens) == 12
    ar_b = ecospec.generate(target, ids, expert_budget=info.top_k, max_new_tokens=12, eos_token_id=[])
    assert ar_b.tokens == ar.tokens  # AR steps are never budgeted
    batch = ecospec.generate_batch(target, [ids[0], ids[0, :9]], expert_budget=info.top_k, **kw)
    assert all(max(s.experts) <= info.top_k for s in batch.steps)  # the batched pass: one budget for the union


def _router_and_logits(models64, preset, tokens=6):
    target, _ = models64(preset)
    router = routers(target)[0]
    g = torch.Generator().manual_seed(7)
    hidden = torch.randn(tokens, target.config.hidden_size, generator=g, dtype=torch.float64)
    with torch.no_grad():
        logits, weights, indices = router(hidden)
    return target, router, logits, weights, indices


@pytest.mark.parametrize("preset", FAMILIES)
def test_kept_set_is_the_top_b_by_summed_score_and_both_policies_stay_inside_it(models64, preset):
    target, router, logits, weights, indices = _router_and_logits(models64, preset)
    info = moe_info(target)
    b = info.top_k + 1
    eb = ExpertBudget(target, b, "truncate")
    keep = eb.kept(router, logits)
    total = eb.scores(router, logits).sum(0)
    assert int(keep.sum()) == b and float(total[keep].min()) >= float(total[~keep].max())
    for policy in ("truncate", "substitute"):
        eb.policy = policy
        w, i = eb.apply(router, logits, weights, indices)
        assert bool(keep[i].all()), policy  # never an expert outside the kept set, zero-weight slots included
        untouched = keep[indices].all(dim=1)
        assert torch.equal(i[untouched], indices[untouched]) and torch.equal(w[untouched], weights[untouched])
    eb.policy = "truncate"
    w, i = eb.apply(router, logits, weights, indices)
    moved = ~keep[indices].all(dim=1) & keep[indices].any(dim=1)
    for r in moved.nonzero()[:, 0].tolist():  # truncation: own experts, the dropped ones at weight 0
        dropped = ~keep[indices[r]]
        assert float(w[r][dropped].abs().sum()) == 0.0
        assert torch.equal(i[r][~dropped], indices[r][~dropped])


def test_substitute_uses_the_models_own_rule_restricted_to_the_kept_set(models64):
    target, router, logits, weights, indices = _router_and_logits(models64, "qwen3_moe-a")
    eb = ExpertBudget(target, moe_info(target).top_k + 1, "substitute")
    keep = eb.kept(router, logits)
    w, i = eb.apply(router, logits, weights, indices)
    probs = torch.softmax(logits.float(), -1).masked_fill(~keep, -1.0)
    top, idx = probs.topk(moe_info(target).top_k, dim=-1)
    moved = ~keep[indices].all(dim=1)
    assert torch.equal(i[moved], idx[moved])
    want = top / top.sum(-1, keepdim=True) if router.norm_topk_prob else top
    torch.testing.assert_close(w[moved].float(), want[moved])


def test_bad_budgets_are_one_clear_error(models64):
    target, _ = models64("qwen3_moe-a")
    with pytest.raises(ValueError, match="expert_budget must be an integer >= top-k"):
        ecospec.generate(target, prompt(5, target.config.vocab_size), expert_budget=1)
    with pytest.raises(ValueError, match="budget_policy must be one of truncate, substitute"):
        ecospec.generate(target, prompt(5, target.config.vocab_size), expert_budget=4, budget_policy="drop")
