"""The decode loop for a batch (DESIGN.md, "Batches"): every sequence drafts its own tree and selects its own
nodes; one target forward verifies every sequence's block; each sequence accepts, compacts its cache row and,
once finished, leaves the batch.

Reads like `loop.generate`, with a row axis. Each sequence's tokens and per-step records equal `generate()` on
its prompt alone (greedy: token for token; sampling: each row has its own generator seeded with `seed`).
Not yet batched: the drafters and the predictor run once per sequence (a shallow copy each, sharing weights).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field

import torch

from ecospec.engine.acceptance import accept_greedy, accept_sampling
from ecospec.engine.batch import RowBlock, compact_rows, drop_rows, forward_rows
from ecospec.engine.forward import attention_layout, cache_len, new_cache
from ecospec.engine.loop import COST_AWARE, _check, _now, eos_set
from ecospec.engine.records import GenerateResult, StepStats, StepTrace, mean_experts
from ecospec.engine.routing import RoutingCapture, expert_counts
from ecospec.engine.tree import DraftTree, ancestor_mask, grow_tree
from ecospec.models.adapters import moe_info
from ecospec.selection import select, select_batch

BATCH_BUFFERS = ("sequence", "batch")


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


@dataclass
class BatchResult:
    results: list[GenerateResult]  # per prompt, in input order
    steps: list[BatchStepStats] = field(default_factory=list)
    t_prefill: float = 0.0

    @property
    def experts_per_layer(self) -> float:
        """E of the batched passes: mean over passes and MoE layers of the unique experts per layer."""
        return mean_experts(self.steps)


@torch.no_grad()
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
    seed: int = 0,
    top_p: float = 1.0,
    eos_token_id: int | list[int] | None = None,
    trace: bool = False,
    batch_buffer: str = "sequence",
) -> BatchResult:
    """Generate up to `max_new_tokens` tokens for each of `prompts` (1-D token lists or tensors, any lengths).

    `batch_buffer="batch"` (ecospec): one expert buffer for the batch (`select_batch(shared_buffer=True)`), since
    the verify pass loads the union of every sequence's experts."""
    rows_in = [torch.as_tensor(p, dtype=torch.long).reshape(-1) for p in prompts]
    if not rows_in:
        raise ValueError("generate_batch: no prompts")
    for p in rows_in:
        _check(target, p[None], drafter, selector, predictor, gamma, depth, topk, temperature, top_p, max_new_tokens)
    if batch_buffer not in BATCH_BUFFERS:
        raise ValueError(f"batch_buffer must be one of {', '.join(BATCH_BUFFERS)}, got {batch_buffer!r}")
    if predictor == "oracle":
        raise ValueError("generate_batch: the oracle's extra target forward is not batched yet; use generate()")
    info = moe_info(target)
    layout = attention_layout(target.config)
    device = target.device
    eos = eos_set(target, eos_token_id)
    size = len(rows_in)
    feats = drafter.hidden_layers if drafter is not None else ()
    drafters = [copy.copy(drafter) if drafter is not None else None for _ in range(size)]
    predictors = [copy.copy(predictor) if predictor is not None else None for _ in range(size)]
    for d, p in zip(drafters, predictors, strict=True):
        if d is not None:
            d.reset()
        if p is not None:
            p.reset()
    gens = [torch.Generator().manual_seed(seed) for _ in range(size)]
    results = [GenerateResult(tokens=[], prompt_len=len(p)) for p in rows_in]
    loads = [torch.zeros(info.num_moe_layers, info.num_experts, dtype=torch.long) for _ in range(size)]
    out = BatchResult(results=results)
    cache = new_cache()

    with RoutingCapture(target) as cap:
        # Prefill every prompt but its last token (each row's first root), in one forward.
        t0 = _now(device)
        active = list(range(size))  # sequences still in the batch, in cache-row order
        hidden_new: list[torch.Tensor | None] = [None] * size
        blocks = [RowBlock(p[:-1].tolist(), list(range(len(p) - 1)), _causal(len(p) - 1)) for p in rows_in]
        lengths = [0] * size
        if any(b.tokens for b in blocks):
            res, _ = forward_rows(target, layout, cache, lengths, blocks, hidden=bool(feats))
            for b, blk in enumerate(blocks):
                if feats:
                    hidden_new[b] = torch.cat([res.hidden_states[i][b : b + 1, : len(blk.tokens)] for i in feats], -1)
            lengths = [len(b.tokens) for b in blocks]
        cap.take()
        out.t_prefill = _now(device) - t0
        new_tokens = [p[None].to(device) for p in rows_in]  # committed since the drafter last saw it; last = root
        roots = [int(p[-1]) for p in rows_in]

        while active:
            t_start = _now(device)
            trees, t_draft, t_pred = {}, {}, {}
            experts, root_experts = {}, {}
            # 1-2. Each sequence drafts its tree and (cost-aware) predicts its candidates' experts.
            for s in active:
                t_a = _now(device)
                tree = DraftTree()
                if drafter is not None:
                    root_logp, root_ids = drafters[s].begin(new_tokens[s], hidden_new[s], topk)
                    tree = grow_tree(root_logp, root_ids, drafters[s].expand, depth)
                t_b = _now(device)
                experts[s] = root_experts[s] = None
                if len(tree) and selector in COST_AWARE:
                    root_experts[s], experts[s] = predictors[s].predict(new_tokens[s], tree)
                trees[s], t_draft[s], t_pred[s] = tree, t_b - t_a, _now(device) - t_b
            t_predicted = _now(device)

            # 3. Select gamma-1 nodes per sequence (with one buffer for the batch when asked).
            with_nodes = [s for s in active if len(trees[s])]
            chosen = dict.fromkeys(active, [])
            if batch_buffer == "batch" and with_nodes:
                picks = select_batch(
                    selector, [trees[s].parents for s in with_nodes], [trees[s].probs for s in with_nodes],
                    [experts[s] for s in with_nodes], gamma - 1, [root_experts[s] for s in with_nodes],
                    shared_buffer=True,
                )  # fmt: skip
                chosen.update(zip(with_nodes, picks, strict=True))
            else:
                for s in with_nodes:
                    t = trees[s]
                    chosen[s] = select(selector, t.parents, t.probs, experts[s], gamma - 1, root_experts[s])
            t_selected = _now(device)

            # 4. Verify every sequence's root + chosen nodes in one target forward; accept; compact each row.
            blocks, parents_of = [], {}
            for s in active:
                t, pick = trees[s], chosen[s]
                slot = {node: j + 1 for j, node in enumerate(pick)}
                parents_of[s] = [-1] + [slot.get(t.parents[i], 0) for i in pick]
                tokens = [roots[s]] + [t.tokens[i] for i in pick]
                depths = [0] + [t.depths[i] for i in pick]
                blocks.append(RowBlock(tokens, depths, ancestor_mask([p - 1 for p in parents_of[s][1:]])))
            start = cache_len(cache)
            res, real = forward_rows(target, layout, cache, lengths, blocks, hidden=bool(feats))
            q = real.shape[1]
            routes = cap.take().view(info.num_moe_layers, len(active), q, -1)
            pass_counts = torch.zeros(info.num_moe_layers, info.num_experts, dtype=torch.long)
            paths, produced = [], {}
            for r, s in enumerate(active):
                blk = blocks[r]
                m = len(blk.tokens)
                counts = expert_counts(routes[:, r, :m], info.num_experts)
                loads[s] += counts
                pass_counts += counts
                logits = res.logits[r, :m].float()
                if temperature == 0:
                    path, bonus = accept_greedy(blk.tokens, parents_of[s], logits)
                else:
                    ranks = [1.0] + [trees[s].probs[i] for i in chosen[s]]
                    path, bonus = accept_sampling(blk.tokens, parents_of[s], ranks, logits, temperature, top_p, gens[s])
                paths.append(path)
                if feats:
                    hidden_new[s] = torch.cat([res.hidden_states[i][r : r + 1, path] for i in feats], dim=-1)
                produced[s] = [blk.tokens[j] for j in path[1:]] + [bonus]
                step_trace = None
                if trace:
                    step_trace = StepTrace(
                        blk.tokens, parents_of[s], list(blk.offsets), list(path), routes[:, r, :m].tolist()
                    )
                results[s].steps.append(
                    StepStats(accepted=len(produced[s]), verified=m, experts=(counts > 0).sum(dim=1).tolist(),
                              t_pred=t_pred[s], t_draft=t_draft[s], trace=step_trace)
                )  # fmt: skip
            lengths = compact_rows(cache, lengths, start, paths)
            t_end = _now(device)
            for s in active:
                st = results[s].steps[-1]
                st.t_select, st.t_verify = t_selected - t_predicted, t_end - t_selected
                st.t_total = st.t_draft + st.t_pred + st.t_select + st.t_verify
            out.steps.append(
                BatchStepStats(
                    sequences=len(active), verified=int(real.sum()), experts=(pass_counts > 0).sum(dim=1).tolist(),
                    t_draft=sum(t_draft.values()), t_pred=sum(t_pred.values()), t_select=t_selected - t_predicted,
                    t_verify=t_end - t_selected, t_total=t_end - t_start,
                )
            )  # fmt: skip

            # 5. Commit; finished sequences leave the batch (and their cache rows).
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
                    roots[s] = produced[s][-1]
                    new_tokens[s] = torch.tensor([produced[s]], device=device)
            if len(keep) < len(active):
                drop_rows(cache, keep)
                lengths = [lengths[r] for r in keep]
                active = [active[r] for r in keep]
    for s in range(size):
        results[s].expert_load = loads[s].tolist()
    return out


def _causal(n: int) -> torch.Tensor:
    return torch.ones(n, n, dtype=torch.bool).tril()
