"""The decode loop: draft a tree, pick γ-1 nodes, verify them in one target pass, accept, repeat.

Reads top to bottom: checks, the target interface of the engine (`engine.targets`: eager or compiled, the same
calls), prefill (which gives the first new token, the first root), then one SD step per iteration, its phases timed
by one timer (`engine.timer`). `drafter=None` is autoregressive decoding through the same loop (a step verifies
only the root). It runs under `torch.inference_mode`, and an AR step builds no mask: the denominator must be at
least as fast as transformers' own `generate` (`benchmarks/ar_denominator.py`).
"""

from __future__ import annotations

import torch

from ecospec.engine.records import GenerateResult
from ecospec.engine.routing import expert_bitmasks, pass_counts
from ecospec.engine.step import Block, check_args, commit, eos_set, first_token
from ecospec.engine.targets import open_target
from ecospec.engine.timer import StepTimer
from ecospec.engine.tree import DraftTree, grow_tree
from ecospec.methods import method
from ecospec.models.adapters import moe_info


@torch.inference_mode()  # no autograd bookkeeping on any op (faster than no_grad: docs/benchmarks.md)
def generate(
    target,
    input_ids: torch.Tensor,
    drafter=None,
    selector: str = "confidence",
    predictor=None,
    gamma: int = 4,
    depth: int = 3,
    topk: int = 2,
    temperature: float = 0.0,
    max_new_tokens: int = 64,
    seed: int = 0,
    top_p: float = 1.0,
    eos_token_id: int | list[int] | None = None,
    trace: bool = False,
    draft_stop: float | None = None,
    expert_budget: int | None = None,
    budget_policy: str = "truncate",
    engine="eager",
    profile=None,
) -> GenerateResult:
    """Generate up to `max_new_tokens` tokens for one prompt (see docs/design.md, Public API).

    `trace=True` keeps each verify pass's block (tokens, parents, depths), accepted path and routes in
    `StepStats.trace`, for routing analyses (cost: L x gamma x k ints per step). `draft_stop`: adaptive
    drafting (off by default), see `grow_tree`. `expert_budget` (MoE-Spec, lossy): every SD verify pass loads at
    most that many experts per MoE layer (`engine.budget`; `budget_policy` truncate | substitute). `engine`:
    "eager" (transformers' forward, the paper's prototype regime), "compiled" (`engine.compiled`, prepared per call)
    or a `CompiledTarget` prepared once for many calls. `profile`: the verify-cost profile
    (`analysis.cost.VerifyProfile`) a method that prices passes in seconds needs (`analysis.profiles.load_profile`)."""
    check_args(
        target, input_ids, drafter, selector, predictor, gamma, depth, topk, temperature, top_p, max_new_tokens, profile
    )
    spec = method(selector)
    session, needs_experts = spec.open(gamma, depth, topk, profile), spec.predictor is not None
    block = gamma if drafter is not None else 1  # an AR step verifies the root alone
    tgt = open_target(
        engine,
        target,
        drafter,
        expert_budget,
        budget_policy,
        block,
        input_ids.shape[1] + max_new_tokens + block,
    )
    shape = dict(zip(("depth", "topk"), session.draft_shape, strict=True))
    drafter, predictor = tgt.prepare_parts(
        drafter, predictor, gamma=gamma, **shape, depths=session.draft_depths, predicted=needs_experts
    )
    num_experts = moe_info(target).num_experts
    eos, gen, timer = eos_set(target, eos_token_id), torch.Generator().manual_seed(seed), StepTimer(target.device)
    ids = input_ids.to(target.device)
    for part in (drafter, predictor):
        if part is not None and part != "oracle":
            part.reset()
    out = GenerateResult(tokens=[], prompt_len=ids.shape[1])
    sizes: list[int] = []  # tokens of each verify pass; their routes stay with the target until the end

    with tgt:
        # Prefill the prompt; its last position gives the first new token (the first root), as HF's generate
        # does: AR then costs one forward per new token after the prefill, SD verifies from that token on.
        timer.start()
        last, hidden_new = tgt.prefill(ids[0])
        root = first_token(last.float(), temperature, top_p, gen)
        t = timer.stop("prefill")
        out.t_prefill, out.t_prefill_cpu = t["total"], t["cpu"]
        out.tokens.append(root)
        new_tokens = torch.cat([ids, torch.tensor([[root]], device=ids.device)], 1)  # not yet seen by the drafter
        done = root in eos or max_new_tokens == 1

        while not done:
            timer.start()
            # 1. Draft a tree as deep and wide as the method asks (depth 0: none this step).
            tree, (d, k) = DraftTree(), session.shape() if drafter is not None else (0, 0)
            if d:
                root_logp, root_ids = drafter.begin(new_tokens, hidden_new, k, depth=d)
                tree = grow_tree(root_logp, root_ids, drafter.expand, d, draft_stop)
            timer.mark("draft")

            # 2. Expert sets of the candidates (learned predictor, or the target router for the oracle).
            experts, root_experts = None, None
            if len(tree) and needs_experts and session.wants_experts:
                if predictor == "oracle":
                    root_experts, experts = oracle_experts(tgt, root, tree, num_experts)
                else:
                    root_experts, experts = predictor.predict(new_tokens, tree)
            timer.mark("pred")

            # 3. The method picks at most gamma-1 nodes (prefix-closed, ascending so parents precede children).
            chosen = session.choose(tree, experts, root_experts, gamma - 1) if len(tree) else []
            timer.mark("select")

            # 4. Verify root + chosen nodes in one target forward, accept, compact the cache.
            blk = Block.of(root, tree, chosen)
            logits, feats = tgt.verify(blk.tokens, blk.parents, blk.depths)
            sizes.append(len(blk.tokens))
            path, bonus = blk.accept(logits.float(), temperature, top_p, gen)
            tgt.compact(path)
            step_hidden = feats[:, path] if feats is not None else None
            timer.mark("verify")

            produced = [blk.tokens[j] for j in path[1:]] + [bonus]
            out.steps.append(blk.stats(timer.stop(), path, len(produced), trace, max(tree.depths, default=0)))
            session.observe(len(produced), len(blk.tokens))
            done = commit(out.tokens, produced, eos, max_new_tokens)
            root = bonus
            if drafter is not None:  # what it has not seen: this step's tokens, after those of steps that drafted none
                step_tokens = torch.tensor([produced], device=ids.device)
                new_tokens = step_tokens if d else torch.cat([new_tokens, step_tokens], 1)
                hidden_new = step_hidden if d or hidden_new is None else torch.cat([hidden_new, step_hidden], 1)
        summarise_passes(out, tgt.take_routes(), sizes, num_experts)
    return out


def oracle_experts(tgt, root: int, tree: DraftTree, num_experts: int) -> tuple[int, list[int]]:
    """True expert sets of the root and every candidate, as bitmasks: the target's own pass over the whole tree
    (`lookup`, analysis only: dropped from the cache again)."""
    masks = expert_bitmasks(tgt.lookup(root, tree), num_experts)
    return masks[0], masks[1:]


def summarise_passes(out: GenerateResult, routes: torch.Tensor, sizes: list[int], num_experts: int) -> None:
    """Unique experts per MoE layer of every verify pass, the expert load and the traces' routes, from the passes'
    routes back to back ([L, sum(sizes), k]) in one count: counting every step cost AR a dozen small ops a token."""
    counts = pass_counts(routes, sizes, num_experts)  # [passes, L, N]
    for st, e in zip(out.steps, (counts > 0).sum(dim=2).tolist(), strict=True):
        st.experts = e
    out.expert_load = counts.sum(dim=0).tolist()
    if any(st.trace is not None for st in out.steps):
        for st, r in zip(out.steps, routes.to("cpu").split(sizes, dim=1), strict=True):
            if st.trace is not None:
                st.trace.routes = r.tolist()
