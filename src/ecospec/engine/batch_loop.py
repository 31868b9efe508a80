"""The decode loop for a batch (docs/design.md, "Batches"): every sequence drafts its own tree and selects its own
nodes; one target forward verifies every sequence's block; each sequence accepts, compacts its cache row and,
once finished, leaves the batch.

Reads like `loop.generate`, with a row axis. Each sequence's tokens and per-step records equal `generate()` on
its prompt alone (greedy: token for token; sampling: each row has its own generator seeded with `seed`). The
drafter and the predictor are batched as well (`begin_rows` / `expand_rows` / `predict_rows`): one drafter
forward per tree level and one predictor forward per step for the whole batch.
"""

from __future__ import annotations

from contextlib import nullcontext
from dataclasses import dataclass, field

import torch

from ecospec.engine.batch import RowBlock, compact_rows, drop_rows, forward_rows
from ecospec.engine.budget import ExpertBudget
from ecospec.engine.forward import attention_layout, cache_len, crop_cache, new_cache
from ecospec.engine.records import GenerateResult, StepStats, StepTrace, mean_experts
from ecospec.engine.routing import RoutingCapture, expert_bitmasks, pass_counts
from ecospec.engine.scope import BATCH_BUFFERS
from ecospec.engine.step import Block, check_args, eos_set, first_token
from ecospec.engine.timer import StepTimer
from ecospec.engine.tree import DraftTree, ancestor_mask, grow_trees
from ecospec.methods import method
from ecospec.models.adapters import moe_info
from ecospec.selection import select, select_batch


@dataclass
class BatchStepStats:
    """One batched verify pass."""

    sequences: int  # sequences in the pass
    verified: int  # tokens verified, all sequences (padding excluded)
    experts: list[int]  # unique experts per MoE layer over the whole pass
    t_draft: float = 0.0  # seconds, all sequences
    t_pred: float = 0.0
    t_select: float = 0.0
    t_verify: float = 0.0  # the batched target forward + acceptance + compaction
    t_total: float = 0.0
    t_cpu: float = 0.0  # the thread's CPU time over the pass (StepStats.t_cpu)


@dataclass
class BatchResult:
    results: list[GenerateResult]  # per prompt, in input order
    steps: list[BatchStepStats] = field(default_factory=list)
    t_prefill: float = 0.0
    t_prefill_cpu: float = 0.0

    @property
    def experts_per_layer(self) -> float:
        """E of the batched passes: mean over passes and MoE layers of the unique experts per layer."""
        return mean_experts(self.steps)


@torch.inference_mode()  # no autograd bookkeeping on any op (faster than no_grad: docs/benchmarks.md)
def generate_batch(
    target,
    prompts,
    drafter=None,
    selector: str = "confidence",
    predictor=None,
    gamma: int = 4,
    depth: int = 3,
    topk: int = 2,
    temperature: float = 0.0,
    max_new_tokens: int = 64,
    seed: int | list[int] = 0,
    top_p: float = 1.0,
    eos_token_id: int | list[int] | None = None,
    trace: bool = False,
    batch_buffer: str = "sequence",
    expert_budget: int | None = None,
    budget_policy: str = "truncate",
) -> BatchResult:
    """Generate up to `max_new_tokens` tokens for each of `prompts` (1-D token lists or tensors, any lengths).

    `batch_buffer="batch"` (ecospec): one expert buffer for the batch (`select_batch(shared_buffer=True)`), since
    the verify pass loads the union of every sequence's experts. `seed`: one for every row (each row then samples
    exactly as `generate(seed=seed)` on its prompt alone) or one per row (independent samples of repeated prompts)."""
    rows_in = [torch.as_tensor(p, dtype=torch.long).reshape(-1) for p in prompts]
    if not rows_in:
        raise ValueError("generate_batch: no prompts (pass a non-empty list of token-id lists)")
    empty = [i for i, p in enumerate(rows_in) if p.numel() == 0]
    if empty:
        raise ValueError(f"generate_batch: prompt {empty[0]} is empty (every prompt needs at least one token)")
    for p in rows_in:
        check_args(
            target, p[None], drafter, selector, predictor, gamma, depth, topk, temperature, top_p, max_new_tokens
        )
    if drafter is not None and method(selector).session is not None:
        raise ValueError(
            f"selector {selector!r} decides each prompt's steps itself (its session): generate_batch "
            "runs the methods that draft the configured tree; decode it at batch size 1"
        )
    seeds = [seed] * len(rows_in) if isinstance(seed, int) else list(seed)
    if len(seeds) != len(rows_in) or not all(isinstance(s, int) for s in seeds):
        raise ValueError(f"generate_batch: seed must be an int or one int per prompt ({len(rows_in)}), got {seed!r}")
    if batch_buffer not in BATCH_BUFFERS:
        raise ValueError(f"batch_buffer must be one of {', '.join(BATCH_BUFFERS)}, got {batch_buffer!r}")
    info = moe_info(target)
    layout = attention_layout(target.config, target)
    device = target.device
    eos = eos_set(target, eos_token_id)
    size = len(rows_in)
    feats = drafter.hidden_layers if drafter is not None else ()
    if drafter is not None:
        drafter.reset(rows=size)
    if predictor is not None and predictor != "oracle":
        predictor.reset(rows=size)
    gens = [torch.Generator().manual_seed(s) for s in seeds]
    results = [GenerateResult(tokens=[], prompt_len=len(p)) for p in rows_in]
    loads = [torch.zeros(info.num_moe_layers, info.num_experts, dtype=torch.long) for _ in range(size)]
    out = BatchResult(results=results)
    cache = new_cache()
    timer = StepTimer(device)
    needs_experts = method(selector).predictor is not None

    budget = ExpertBudget(target, expert_budget, budget_policy) if expert_budget is not None else nullcontext()
    with budget, RoutingCapture(target) as cap:  # the budget's router hook first: the capture sees what ran
        # Prefill every prompt in one forward; each row's last prompt position gives its first new token (its first
        # root), as in `generate`.
        timer.start()
        active = list(range(size))  # sequences still in the batch, in cache-row order
        blocks = [RowBlock(p.tolist(), list(range(len(p))), _causal(len(p))) for p in rows_in]
        res, _ = forward_rows(target, layout, cache, [0] * size, blocks, hidden=bool(feats))
        hidden_new: list[torch.Tensor | None] = [None] * size
        roots = []
        for b, p in enumerate(rows_in):
            if feats:
                hidden_new[b] = torch.cat([res.hidden_states[i][b : b + 1, : len(p)] for i in feats], -1)
            roots.append(first_token(res.logits[b, len(p) - 1 : len(p)].float(), temperature, top_p, gens[b]))
        lengths = [len(p) for p in rows_in]
        cap.clear()
        timer.mark("prefill")
        t = timer.stop()
        out.t_prefill, out.t_prefill_cpu = t["total"], t["cpu"]
        # committed since the drafter last saw the sequence (the prompt and the root); last = root
        new_tokens = [torch.cat([p, torch.tensor([r])])[None].to(device) for p, r in zip(rows_in, roots, strict=True)]
        active, lengths = _commit(
            results, {s: [roots[s]] for s in active}, active, lengths, cache, drafter, predictor, eos, max_new_tokens
        )

        while active:
            timer.start()
            # 1. Every sequence drafts its tree: one drafter forward per tree level for the whole batch.
            trees = {s: DraftTree() for s in active}
            if drafter is not None:
                hid = [hidden_new[s][0] for s in active] if feats else None
                root_logp, root_ids = drafter.begin_rows([new_tokens[s][0] for s in active], hid, topk)
                trees.update(zip(active, grow_trees(root_logp, root_ids, drafter.expand_rows, depth), strict=True))
            timer.mark("draft")

            # 2. Expert sets of every candidate (cost-aware selectors): one predictor forward for the batch.
            experts = dict.fromkeys(active)
            root_experts = dict.fromkeys(active)
            if drafter is not None and needs_experts:
                if predictor == "oracle":
                    roots_m, nodes_m = _oracle_rows(target, layout, cache, cap, info, lengths, roots, trees, active)
                else:
                    roots_m, nodes_m = predictor.predict_rows(
                        [new_tokens[s][0] for s in active], [trees[s] for s in active]
                    )
                root_experts.update(zip(active, roots_m, strict=True))
                experts.update(zip(active, nodes_m, strict=True))
            timer.mark("pred")

            # 3. Select gamma-1 nodes per sequence (with one buffer for the batch when asked).
            with_nodes = [s for s in active if len(trees[s])]
            chosen = dict.fromkeys(active, [])
            if batch_buffer == "batch" and with_nodes:
                picks = select_batch(
                    selector,
                    [trees[s].parents for s in with_nodes],
                    [trees[s].probs for s in with_nodes],
                    [experts[s] for s in with_nodes],
                    gamma - 1,
                    [root_experts[s] for s in with_nodes],
                    shared_buffer=True,
                )
                chosen.update(zip(with_nodes, picks, strict=True))
            else:
                for s in with_nodes:
                    t = trees[s]
                    chosen[s] = select(selector, t.parents, t.probs, experts[s], gamma - 1, root_experts[s])
            timer.mark("select")

            # 4. Verify every sequence's root + chosen nodes in one target forward; accept; compact each row.
            blks = {s: Block.of(roots[s], trees[s], chosen[s]) for s in active}
            blocks = [
                RowBlock(b.tokens, b.depths, ancestor_mask([p - 1 for p in b.parents[1:]])) for b in blks.values()
            ]
            start = cache_len(cache)
            if expert_budget is not None:  # one budget for the whole batched pass (it loads the union); SD only
                budget.active = drafter is not None
                budget.real = _real_tokens(blocks)
            res, real = forward_rows(target, layout, cache, lengths, blocks, hidden=bool(feats))
            if expert_budget is not None:
                budget.active = False
            q = real.shape[1]
            routes = cap.take().view(info.num_moe_layers, len(active), q, -1)
            in_pass = torch.zeros(info.num_moe_layers, info.num_experts, dtype=torch.long)
            paths, produced = [], {}
            for r, s in enumerate(active):
                blk = blks[s]
                m = len(blk.tokens)
                counts = pass_counts(routes[:, r, :m], [m], info.num_experts)[0]
                loads[s] += counts
                in_pass += counts
                path, bonus = blk.accept(res.logits[r, :m].float(), temperature, top_p, gens[s])
                paths.append(path)
                if feats:
                    hidden_new[s] = torch.cat([res.hidden_states[i][r : r + 1, path] for i in feats], dim=-1)
                produced[s] = [blk.tokens[j] for j in path[1:]] + [bonus]
                step_trace = None
                if trace:
                    step_trace = StepTrace(
                        blk.tokens, blk.parents, list(blk.depths), list(path), routes[:, r, :m].tolist()
                    )
                results[s].steps.append(
                    StepStats(
                        accepted=len(produced[s]),
                        verified=m,
                        experts=(counts > 0).sum(dim=1).tolist(),
                        trace=step_trace,
                        drafted_depth=max(trees[s].depths, default=0),
                    )
                )
            lengths = compact_rows(cache, lengths, start, paths)
            timer.mark("verify")
            t = timer.stop()
            for s in active:  # each sequence's step is the batched pass's (its phases and its CPU time)
                st = results[s].steps[-1]
                st.t_draft, st.t_pred, st.t_select, st.t_verify = t["draft"], t["pred"], t["select"], t["verify"]
                st.t_total = st.t_draft + st.t_pred + st.t_select + st.t_verify
                st.t_cpu = t["cpu"]
            out.steps.append(
                BatchStepStats(
                    sequences=len(active),
                    verified=int(real.sum()),
                    experts=(in_pass > 0).sum(dim=1).tolist(),
                    t_draft=t["draft"],
                    t_pred=t["pred"],
                    t_select=t["select"],
                    t_verify=t["verify"],
                    t_total=t["total"],
                    t_cpu=t["cpu"],
                )
            )

            # 5. Commit; finished sequences leave the batch (and their cache rows).
            active, lengths = _commit(
                results, produced, active, lengths, cache, drafter, predictor, eos, max_new_tokens
            )
            for s in active:
                roots[s] = produced[s][-1]
                new_tokens[s] = torch.tensor([produced[s]], device=device)
    for s in range(size):
        results[s].expert_load = loads[s].tolist()
    return out


def _commit(results, produced, active, lengths, cache, drafter, predictor, eos, max_new_tokens):
    """Append each active sequence's produced tokens (up to eos or `max_new_tokens`); finished sequences leave the
    batch: their cache rows and the drafter's and predictor's slots. Returns the new (active, lengths)."""
    keep = []
    for r, s in enumerate(active):
        done = False
        for tok in produced[s]:
            results[s].tokens.append(tok)
            if tok in eos or len(results[s].tokens) >= max_new_tokens:
                done = True
                break
        if not done:
            keep.append(r)
    if len(keep) < len(active):
        drop_rows(cache, keep)
        for part in (drafter, predictor):
            if part is not None and part != "oracle":
                part.keep_rows(keep)
        lengths = [lengths[r] for r in keep]
        active = [active[r] for r in keep]
    return active, lengths


def _oracle_rows(target, layout, cache, cap, info, lengths, roots, trees, active):
    """True expert sets of every row's root and candidates: one extra target forward over all rows' trees
    (analysis only), whose cache slots are cut off again (they sit behind every row's entries)."""
    width = cache_len(cache)
    blocks = [
        RowBlock([roots[s], *trees[s].tokens], [0, *trees[s].depths], ancestor_mask(trees[s].parents)) for s in active
    ]
    _, real = forward_rows(target, layout, cache, lengths, blocks)
    crop_cache(cache, width)
    routes = cap.take().view(info.num_moe_layers, len(active), real.shape[1], -1)
    roots_m, nodes_m = [], []
    for r, blk in enumerate(blocks):
        masks = expert_bitmasks(routes[:, r, : len(blk.tokens)], info.num_experts)
        roots_m.append(masks[0])
        nodes_m.append(masks[1:])
    return roots_m, nodes_m


def _real_tokens(blocks) -> torch.Tensor:
    """bool [B * q] (batch-major, as the routers see the pass): which queries of the next forward_rows are real."""
    q = max(len(b.tokens) for b in blocks)
    return (torch.arange(q)[None, :] < torch.tensor([len(b.tokens) for b in blocks])[:, None]).reshape(-1)


def _causal(n: int) -> torch.Tensor:
    return torch.ones(n, n, dtype=torch.bool).tril()
