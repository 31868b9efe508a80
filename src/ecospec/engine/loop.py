"""The decode loop: draft a tree, pick γ-1 nodes, verify them in one target pass, accept, repeat.

One loop for one sequence and for a batch. `decode` reads top to bottom: the target interface of the engine
(`engine.targets`: eager or compiled, the same calls, with a sequence axis), prefill (which gives each sequence's
first new token, its first root), then one SD step per iteration over every sequence still in the batch, its
phases timed by one timer (`engine.timer`); a sequence that finishes leaves the batch. `generate` is the loop on one
prompt, `generate_batch` on several. `drafter=None` is autoregressive decoding through the same loop (a step
verifies only the root). It runs under `torch.inference_mode`, and an AR step of one sequence builds no mask: the
denominator must be at least as fast as transformers' own `generate` (`benchmarks/ar_denominator.py`).
"""

from __future__ import annotations

import torch

from ecospec.engine.records import BatchResult, BatchStepStats, GenerateResult, StepStats
from ecospec.engine.routing import expert_bitmasks, pass_counts
from ecospec.engine.scope import BATCH_BUFFERS
from ecospec.engine.step import Block, check_args, commit, eos_set, first_token
from ecospec.engine.targets import open_target
from ecospec.engine.timer import StepTimer
from ecospec.engine.tree import DraftTree, grow_trees
from ecospec.methods import method
from ecospec.methods._batch import choose_rows
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
    (`analysis.verify_profile.VerifyProfile`) a method that prices passes in seconds needs
    (`analysis.profiles.load_profile`)."""
    check_args(
        target, input_ids, drafter, selector, predictor, gamma, depth, topk, temperature, top_p, max_new_tokens, profile
    )
    out = decode(
        target,
        [input_ids[0]],
        [seed],
        drafter=drafter,
        selector=selector,
        predictor=predictor,
        gamma=gamma,
        depth=depth,
        topk=topk,
        temperature=temperature,
        max_new_tokens=max_new_tokens,
        top_p=top_p,
        eos_token_id=eos_token_id,
        trace=trace,
        draft_stop=draft_stop,
        expert_budget=expert_budget,
        budget_policy=budget_policy,
        engine=engine,
        profile=profile,
    )
    res = out.results[0]
    res.t_prefill, res.t_prefill_cpu = out.t_prefill, out.t_prefill_cpu  # the one sequence's prefill is the batch's
    return res


@torch.inference_mode()
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
    engine="eager",
    profile=None,
) -> BatchResult:
    """Generate up to `max_new_tokens` tokens for each of `prompts` (1-D token lists or tensors, any lengths): every
    sequence drafts its own tree and selects its own nodes, one target pass verifies every sequence's block (docs/
    design.md, "Batches"); a method with per-prompt state keeps a session per sequence. Each sequence's tokens and
    per-step records equal `generate()` on its prompt alone (greedy: token for token; sampling: each row has its own
    generator).

    `batch_buffer="batch"` (ecospec, ecospec_adaptive): one expert buffer for the batch (`methods/_batch.py`), since
    the verify pass loads the union of every sequence's experts. `seed`: one for every row (each row then samples
    exactly as `generate(seed=seed)` on its prompt alone) or one per row (independent samples of repeated prompts)."""
    rows = [torch.as_tensor(p, dtype=torch.long).reshape(-1) for p in prompts]
    if not rows:
        raise ValueError("generate_batch: no prompts (pass a non-empty list of token-id lists)")
    empty = [i for i, p in enumerate(rows) if p.numel() == 0]
    if empty:
        raise ValueError(f"generate_batch: prompt {empty[0]} is empty (every prompt needs at least one token)")
    for p in rows:
        check_args(
            target,
            p[None],
            drafter,
            selector,
            predictor,
            gamma,
            depth,
            topk,
            temperature,
            top_p,
            max_new_tokens,
            profile,
        )
    seeds = [seed] * len(rows) if isinstance(seed, int) else list(seed)
    if len(seeds) != len(rows) or not all(isinstance(s, int) for s in seeds):
        raise ValueError(f"generate_batch: seed must be an int or one int per prompt ({len(rows)}), got {seed!r}")
    if batch_buffer not in BATCH_BUFFERS:
        raise ValueError(f"batch_buffer must be one of {', '.join(BATCH_BUFFERS)}, got {batch_buffer!r}")
    return decode(
        target,
        rows,
        seeds,
        drafter=drafter,
        selector=selector,
        predictor=predictor,
        gamma=gamma,
        depth=depth,
        topk=topk,
        temperature=temperature,
        max_new_tokens=max_new_tokens,
        top_p=top_p,
        eos_token_id=eos_token_id,
        trace=trace,
        expert_budget=expert_budget,
        budget_policy=budget_policy,
        engine=engine,
        profile=profile,
        shared_buffer=batch_buffer == "batch",
    )


def decode(
    target,
    prompts: list[torch.Tensor],
    seeds: list[int],
    *,
    drafter,
    selector: str,
    predictor,
    gamma: int,
    depth: int,
    topk: int,
    temperature: float,
    max_new_tokens: int,
    top_p: float,
    eos_token_id,
    trace: bool,
    expert_budget: int | None,
    budget_policy: str,
    engine,
    profile,
    draft_stop: float | None = None,
    shared_buffer: bool = False,
) -> BatchResult:
    """The loop over checked arguments (`generate`, `generate_batch`): prompts [n_b] each, one seed each."""
    spec = method(selector)
    sessions = [spec.open(gamma, depth, topk, profile) for _ in prompts]
    shared_buffer = shared_buffer and spec.buffered  # one expert buffer for the batch: a method with a buffer
    needs_experts = spec.predictor is not None
    block = gamma if drafter is not None else 1  # an AR step verifies the root alone
    longest = max(p.shape[0] for p in prompts) + max_new_tokens + block
    tgt = open_target(engine, target, drafter, expert_budget, budget_policy, block, longest, rows=len(prompts))
    shape = dict(zip(("depth", "topk"), sessions[0].draft_shape, strict=True))
    drafter, predictor = tgt.prepare_parts(
        drafter, predictor, gamma=gamma, **shape, depths=sessions[0].draft_depths, predicted=needs_experts
    )
    num_experts = moe_info(target).num_experts
    if predictor == "oracle":  # the target's own routers, one look-up pass a step (analysis only)
        predictor = RouterOracle(tgt, num_experts)
    eos, timer = eos_set(target, eos_token_id), StepTimer(target.device)
    gens = [torch.Generator().manual_seed(s) for s in seeds]
    prompts = [p.to(target.device) for p in prompts]
    for part in (drafter, predictor):
        if part is not None:
            part.reset(rows=len(prompts))
    out = BatchResult(results=[GenerateResult(tokens=[], prompt_len=p.shape[0]) for p in prompts])
    passes: list[tuple[int, int, StepStats]] = []  # (pass, sequence, its step) of every verified block, in route order

    with tgt:
        # Prefill the prompts; each one's last position gives its first new token (its first root), as HF's
        # generate does: AR then costs one forward per new token after the prefill, SD verifies from that token on.
        timer.start()
        last, hidden_new = tgt.prefill(prompts)
        roots = [first_token(last[b : b + 1].float(), temperature, top_p, gens[b]) for b in range(len(prompts))]
        t = timer.stop("prefill")
        out.t_prefill, out.t_prefill_cpu = t["total"], t["cpu"]
        # what each drafter has not seen yet, piece by piece (joined once, when it drafts: steps that draft nothing
        # only append their tokens and features)
        hidden_new = [None if h is None else [h] for h in hidden_new or [None] * len(prompts)]
        new_tokens = [[torch.cat([p, p.new_tensor([r])])] for p, r in zip(prompts, roots, strict=True)]
        unseen = [len(t[0]) for t in new_tokens]
        active = list(range(len(prompts)))  # the sequences in the batch, in row order
        priced_for = 1  # the batch size the sessions price their passes at (`VerifyProfile.at_batch`)
        keep = [r for r, s in enumerate(active) if not commit(out.results[s].tokens, [roots[s]], eos, max_new_tokens)]

        while True:
            active = leave(active, keep, tgt, drafter, predictor)
            if not active:
                break
            if profile is not None and len(active) != priced_for:  # a sequence's pass is the batch's pass
                priced_for, priced = len(active), profile.at_batch(len(active), shared_buffer)
                for s in active:
                    sessions[s].cost = priced
            timer.start()
            # 1. Draft each sequence's tree as deep as its method asks this step (depth 0: none): the batch drafts
            # to the deepest, and each tree is cut to its own depth.
            shapes = (
                [sessions[s].shape(unseen[s], max_new_tokens - len(out.results[s].tokens)) for s in active]
                if drafter is not None
                else [(0, 0)] * len(active)
            )
            d, k = step_shape(shapes)
            trees = [DraftTree() for _ in active]
            if d:
                feats = None if hidden_new[active[0]] is None else [joined(hidden_new[s]) for s in active]
                root_logp, root_ids = drafter.begin_rows([joined(new_tokens[s]) for s in active], feats, k, depth=d)
                grown = grow_trees(root_logp, root_ids, drafter.expand_rows, d, draft_stop)
                trees = [t.cut(depth) for t, (depth, _) in zip(grown, shapes, strict=True)]
            timer.mark("draft")

            # 2. Expert sets of the candidates (learned predictor, or the target router for the oracle).
            experts = root_experts = [None] * len(active)
            if d and needs_experts and sessions[active[0]].wants_experts:
                root_experts, experts = predictor.predict_rows([joined(new_tokens[s]) for s in active], trees)
            timer.mark("pred")

            # 3. The method picks at most gamma-1 nodes per sequence (prefix-closed, ascending so parents precede
            # children): each sequence's session, or one rule or one expert buffer for the batch.
            rows = [sessions[s] for s in active]
            chosen = choose_rows(spec, rows, trees, experts, root_experts, gamma - 1, shared_buffer, profile)
            timer.mark("select")

            # 4. Verify every sequence's root + chosen nodes in one target pass, accept, compact the caches.
            blocks = [Block.of(roots[s], t, c) for s, t, c in zip(active, trees, chosen, strict=True)]
            logits, feats = tgt.verify(blocks)
            accepted = [
                b.accept(lg.float(), temperature, top_p, gens[s])
                for s, b, lg in zip(active, blocks, logits, strict=True)
            ]
            paths = [path for path, _ in accepted]
            tgt.compact(paths)
            step_hidden = [None] * len(active) if feats is None else [f[p] for f, p in zip(feats, paths, strict=True)]
            timer.mark("verify")

            # 5. Each sequence records its step and commits what it produced; finished ones leave the batch.
            t = timer.stop()
            keep = []
            for r, s in enumerate(active):
                blk, (path, bonus) = blocks[r], accepted[r]
                produced = [blk.tokens[j] for j in path[1:]] + [bonus]
                st = blk.stats(t, path, len(produced), trace, max(trees[r].depths, default=0))
                out.results[s].steps.append(st)
                passes.append((len(out.steps), s, st))
                sessions[s].observe(len(produced), len(blk.tokens))
                if commit(out.results[s].tokens, produced, eos, max_new_tokens):
                    continue
                keep.append(r)
                roots[s] = bonus
                if drafter is not None:  # unseen: this step's tokens, after those of steps that drafted none
                    step_tokens = new_tokens[s][0].new_tensor(produced)
                    new_tokens[s] = [step_tokens] if d else [*new_tokens[s], step_tokens]
                    unseen[s] = len(produced) if d else unseen[s] + len(produced)
                    h = step_hidden[r]
                    hidden_new[s] = None if h is None else [h] if d or hidden_new[s] is None else [*hidden_new[s], h]
            out.steps.append(batch_step(t, blocks))
        summarise_passes(out, tgt.take_routes(), passes, num_experts)
    return out


def joined(pieces: list[torch.Tensor]) -> torch.Tensor:
    """The pieces a drafter has not seen, as one tensor (joined in place, once)."""
    if len(pieces) > 1:
        pieces[:] = [torch.cat(pieces)]
    return pieces[0]


def leave(active: list[int], keep: list[int], tgt, drafter, predictor) -> list[int]:
    """The sequences that stay (rows `keep` of `active`); the others leave the target's, drafter's and predictor's
    rows."""
    if 0 < len(keep) < len(active):
        tgt.drop(keep)
        for part in (drafter, predictor):
            if part is not None:
                part.keep_rows(keep)
    return [active[r] for r in keep]


def step_shape(shapes: list[tuple[int, int]]) -> tuple[int, int]:
    """(depth, top-k) the batch drafts this step from each sequence's: the deepest, at the one top-k of the rows
    that draft (a batched drafter grows its rows alike; the methods vary their depth, not their width)."""
    depth = max(d for d, _ in shapes)
    widths = {k for d, k in shapes if d}
    if len(widths) > 1:
        raise ValueError(f"the sequences of a batch ask for draft trees of different top-k this step: {sorted(widths)}")
    return depth, widths.pop() if widths else 0


def batch_step(times: dict[str, float], blocks: list[Block]) -> BatchStepStats:
    """The pass's record; its experts are filled in from the routes after the decode."""
    return BatchStepStats(
        sequences=len(blocks),
        verified=sum(len(b.tokens) for b in blocks),
        experts=[],
        t_draft=times["draft"],
        t_pred=times["pred"],
        t_select=times["select"],
        t_verify=times["verify"],
        t_total=times["total"],
        t_cpu=times["cpu"],
    )


class RouterOracle:
    """The oracle's expert sets as a predictor: the target's own routers over every sequence's root and candidates
    (`lookup`: one pass over the whole trees, dropped from the cache again), as bitmasks."""

    def __init__(self, tgt, num_experts: int):
        self.tgt, self.num_experts = tgt, num_experts

    def reset(self, rows: int = 1) -> None:
        """It keeps no state of its own."""

    def keep_rows(self, keep: list[int]) -> None:
        """The target keeps its own rows."""

    def predict_rows(self, new_tokens: list[torch.Tensor], trees: list[DraftTree]) -> tuple[list[int], list[list[int]]]:
        roots = [int(t[-1]) for t in new_tokens]  # each row's root: the last token it committed
        masks = [expert_bitmasks(routes, self.num_experts) for routes in self.tgt.lookup(roots, trees)]
        return [m[0] for m in masks], [m[1:] for m in masks]


def summarise_passes(out: BatchResult, routes: torch.Tensor, passes: list, num_experts: int) -> None:
    """Unique experts per MoE layer of every verified block and of every batched pass, each sequence's expert load
    and the traces' routes, from the blocks' routes back to back ([L, sum of block sizes, k]) in one count:
    counting every step cost AR a dozen small ops a token."""
    sizes = [st.verified for _, _, st in passes]
    counts = pass_counts(routes, sizes, num_experts)  # [blocks, L, N]
    for (_, _, st), e in zip(passes, (counts > 0).sum(dim=2).tolist(), strict=True):
        st.experts = e
    owner = torch.tensor([s for _, s, _ in passes], dtype=torch.long)
    step = torch.tensor([p for p, _, _ in passes], dtype=torch.long)
    load = torch.zeros(len(out.results), *counts.shape[1:], dtype=torch.long).index_add_(0, owner, counts)
    for res, ld in zip(out.results, load.tolist(), strict=True):
        res.expert_load = ld
    union = torch.zeros(len(out.steps), *counts.shape[1:], dtype=torch.long).index_add_(0, step, counts)
    for st, e in zip(out.steps, (union > 0).sum(dim=2).tolist(), strict=True):
        st.experts = e
    if passes and passes[0][2].trace is not None:  # generate(trace=True): every step has its trace
        for (_, _, st), r in zip(passes, routes.to("cpu").split(sizes, dim=1), strict=True):
            st.trace.routes = r.tolist()
