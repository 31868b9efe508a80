"""The decode loop: draft a tree, pick γ-1 nodes, verify them in one target pass, accept, repeat.

Reads top to bottom: validation, prefill (which gives the first new token, the first root), then one SD step per
iteration. `drafter=None` is autoregressive decoding through the same loop (a step verifies only the root). It runs
under `torch.inference_mode`, and an AR step builds no mask: the denominator must be at least as fast as
transformers' own `generate` (`benchmarks/ar_denominator.py`).
"""

from __future__ import annotations

import time
from contextlib import nullcontext

import torch

from ecospec.engine.acceptance import accept_greedy, accept_sampling
from ecospec.engine.budget import ExpertBudget
from ecospec.engine.compiled import ENGINES, CompiledTarget, prepare, refusal
from ecospec.engine.forward import attention_layout, compact_cache, forward_block, new_cache
from ecospec.engine.records import GenerateResult, StepStats, StepTrace
from ecospec.engine.routing import RoutingCapture, expert_bitmasks, pass_counts
from ecospec.engine.static_eagle3 import prepare_drafter
from ecospec.engine.static_predictor import prepare_predictor
from ecospec.engine.tree import DraftTree, ancestor_mask, grow_tree
from ecospec.methods import needing_experts
from ecospec.models.adapters import moe_info
from ecospec.selection import POLICIES, select

COST_AWARE = needing_experts()  # the methods whose rule reads expert sets (ecospec.methods)


def _check(target, input_ids, drafter, selector, predictor, gamma, depth, topk, temperature, top_p, max_new):
    if not (input_ids.dim() == 2 and input_ids.shape[0] == 1 and input_ids.shape[1] >= 1):
        raise ValueError(f"input_ids must have shape [1, n>=1] (batch size 1), got {tuple(input_ids.shape)}")
    if selector not in POLICIES:
        raise ValueError(f"unknown selector {selector!r}; choose one of {', '.join(POLICIES)}")
    if gamma < 2:
        raise ValueError(f"gamma must be >= 2 (tokens verified per step, root included), got {gamma}")
    if depth < 1:
        raise ValueError(f"depth must be >= 1 (draft forward steps), got {depth}")
    if topk < 1:
        raise ValueError(f"topk must be >= 1 (children per expanded node), got {topk}")
    if temperature < 0:
        raise ValueError(f"temperature must be >= 0, got {temperature}")
    if not 0 < top_p <= 1:
        raise ValueError(f"top_p must be in (0, 1], got {top_p}")
    if max_new < 1:
        raise ValueError(f"max_new_tokens must be >= 1, got {max_new}")
    if drafter is not None and drafter.vocab_size != target.config.vocab_size:
        raise ValueError(
            f"drafter vocabulary ({drafter.vocab_size} tokens) does not match the target's "
            f"({target.config.vocab_size} tokens)"
        )
    if drafter is not None and selector in COST_AWARE and predictor is None:
        raise ValueError(f"selector {selector!r} needs expert sets: pass predictor=<ExpertPredictor> or 'oracle'")
    if selector == "oracle" and predictor != "oracle":
        raise ValueError("selector 'oracle' takes the target router's true expert sets: pass predictor='oracle'")


def eos_set(target, eos_token_id: int | list[int] | None) -> set[int]:
    """The tokens that end a sequence: `eos_token_id`, or the target's generation config's when None."""
    if eos_token_id is None:
        eos_token_id = target.generation_config.eos_token_id if target.generation_config else None
    return set([eos_token_id] if isinstance(eos_token_id, int) else (eos_token_id or []))


def _now(device: torch.device) -> float:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter()


@torch.inference_mode()  # no autograd bookkeeping on any op: AR ~13 % faster than under no_grad
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
    engine: str | CompiledTarget = "eager",
) -> GenerateResult:
    """Generate up to `max_new_tokens` tokens for one prompt (see docs/design.md, Public API).

    `trace=True` keeps each verify pass's block (tokens, parents, depths), accepted path and routes in
    `StepStats.trace`, for routing analyses (cost: L x gamma x k ints per step). `draft_stop`: adaptive
    drafting (off by default), see `grow_tree`. `expert_budget` (MoE-Spec, lossy): every SD verify pass loads at
    most that many experts per MoE layer (`engine.budget`; `budget_policy` truncate | substitute). `engine`:
    "eager" (transformers' forward, the paper's prototype regime), "compiled" (`engine.compiled`, prepared per call)
    or a `CompiledTarget` prepared once for many calls."""
    _check(target, input_ids, drafter, selector, predictor, gamma, depth, topk, temperature, top_p, max_new_tokens)
    block = gamma if drafter is not None else 1  # an AR step verifies the root alone
    static = _compiled(engine, target, drafter, expert_budget, block, input_ids.shape[1] + max_new_tokens + block)
    if static is not None:  # the EAGLE-3 head's draft steps and the predictor's pass are compiled too
        drafter = prepare_drafter(drafter, gamma=gamma, depth=depth, topk=topk, max_len=static.max_len)
        if selector in COST_AWARE:
            predictor = prepare_predictor(predictor, gamma=gamma, depth=depth, topk=topk, max_len=static.max_len)
    info = moe_info(target)
    layout = attention_layout(target.config, target)
    device = target.device
    eos = eos_set(target, eos_token_id)
    gen = torch.Generator().manual_seed(seed)
    ids = input_ids.to(device)
    n_prompt = ids.shape[1]
    feats = drafter.hidden_layers if drafter is not None else ()
    cache = new_cache()
    if drafter is not None:
        drafter.reset()
    if predictor is not None and predictor != "oracle":
        predictor.reset()
    out = GenerateResult(tokens=[], prompt_len=n_prompt)

    budget = ExpertBudget(target, expert_budget, budget_policy) if expert_budget is not None else nullcontext()
    sizes: list[int] = []  # tokens of each verify pass; their routes stay in the capture until the end
    with budget, RoutingCapture(target) as cap:  # the budget's router hook first: the capture sees what ran
        # Prefill the prompt; its last position gives the first new token (the first root), as HF's generate
        # does: AR then costs one forward per new token after the prefill, SD verifies from that token on.
        t0, c0 = _now(device), time.thread_time()
        if static is None:
            res = forward_block(target, layout, cache, ids, torch.arange(n_prompt, device=device)[None], None, None,
                                hidden=bool(feats), logits_to_keep=1)  # fmt: skip
            last = res.logits[0, -1:]
            hidden_new = torch.cat([res.hidden_states[i] for i in feats], dim=-1) if feats else None
        else:
            last, hidden_new = static.prefill(ids[0])
        cap.clear()
        root = _first_token(last.float(), temperature, top_p, gen)
        out.t_prefill, out.t_prefill_cpu = _now(device) - t0, time.thread_time() - c0
        out.tokens.append(root)
        new_tokens = torch.cat([ids, torch.tensor([[root]], device=device)], 1)  # not yet seen by the drafter
        done = root in eos or max_new_tokens == 1

        while not done:
            t_start, c_start = _now(device), time.thread_time()
            prefix = cache.get_seq_length() if static is None else static.length  # committed tokens before the root

            # 1. Draft a tree.
            tree = DraftTree()
            if drafter is not None:
                root_logp, root_ids = drafter.begin(new_tokens, hidden_new, topk)
                tree = grow_tree(root_logp, root_ids, drafter.expand, depth, draft_stop)
            t_drafted = _now(device)

            # 2. Expert sets of the candidates (learned predictor, or the target router for the oracle).
            experts, root_experts = None, None
            if len(tree) and selector in COST_AWARE:
                if predictor == "oracle":
                    root_experts, experts = _oracle_experts(
                        target, layout, cache, cap, info, root, tree, prefix, static
                    )
                else:
                    root_experts, experts = predictor.predict(new_tokens, tree)
            t_predicted = _now(device)

            # 3. Select gamma-1 nodes (prefix-closed, ascending so parents precede children).
            chosen = select(selector, tree.parents, tree.probs, experts, gamma - 1, root_experts) if len(tree) else []
            t_selected = _now(device)

            # 4. Verify root + chosen nodes in one target forward, accept, compact the cache. The root alone (AR) is
            # causal right after the cache: the model builds its own mask, as in HF's generate.
            slot = {node: j + 1 for j, node in enumerate(chosen)}
            block_tokens = [root] + [tree.tokens[i] for i in chosen]
            block_parents = [-1] + [slot.get(tree.parents[i], 0) for i in chosen]
            block_depths = [0] + [tree.depths[i] for i in chosen]
            q = len(block_tokens)
            if static is None:
                res = _verify_eager(target, layout, cache, budget, drafter, block_tokens, block_parents, block_depths,
                                    prefix, bool(feats))  # fmt: skip
                logits, block_hidden = res.logits[0].float(), res.hidden_states
            else:  # the compiled step of the block's shape (the prepared object keeps its routes)
                logits, block_hidden = static.verify(block_tokens, block_parents, block_depths)
                logits = logits.float()
            sizes.append(q)
            if temperature == 0:
                path, bonus = accept_greedy(block_tokens, block_parents, logits)
            else:
                ranks = [1.0] + [tree.probs[i] for i in chosen]
                path, bonus = accept_sampling(block_tokens, block_parents, ranks, logits, temperature, top_p, gen)
            if static is None:
                compact_cache(cache, prefix, path)
                if feats:
                    hidden_new = torch.cat([block_hidden[i][:, path] for i in feats], dim=-1)
            else:
                static.compact(path)
                if feats:
                    hidden_new = block_hidden[:, path]
            t_end = _now(device)

            produced = [block_tokens[j] for j in path[1:]] + [bonus]
            out.steps.append(
                StepStats(
                    accepted=len(produced),
                    verified=q,
                    experts=[],  # filled in from the pass's routes after the loop
                    t_pred=t_predicted - t_drafted,
                    t_draft=t_drafted - t_start,
                    t_select=t_selected - t_predicted,
                    t_verify=t_end - t_selected,
                    t_total=t_end - t_start,
                    t_cpu=time.thread_time() - c_start,
                    trace=StepTrace(block_tokens, block_parents, block_depths, list(path), []) if trace else None,
                )
            )
            for tok in produced:
                out.tokens.append(tok)
                if tok in eos or len(out.tokens) >= max_new_tokens:
                    done = True
                    break
            root = bonus
            if drafter is not None:
                new_tokens = torch.tensor([produced], device=device)
        _summarise_passes(out, cap.take(device=None) if static is None else static.take_routes(), sizes,
                          info.num_experts)  # fmt: skip
    return out


def _compiled(engine, target, drafter, expert_budget, gamma: int, longest: int) -> CompiledTarget | None:
    """The prepared compiled target of a decode, None for the eager engine; refusals name what is missing."""
    if isinstance(engine, CompiledTarget):
        if engine.target is not target:
            raise ValueError("engine: the CompiledTarget was prepared for another target")
        if engine.gamma < gamma or engine.max_len < longest:
            raise ValueError(f"engine: the CompiledTarget was prepared for gamma {engine.gamma} and {engine.max_len} "
                             f"slots; this decode needs gamma {gamma} and {longest}")  # fmt: skip
        static = engine
    elif engine == "eager":
        return None
    elif engine == "compiled":
        static = None
    else:
        raise ValueError(f"unknown engine {engine!r}; choose one of {', '.join(ENGINES)} or a CompiledTarget")
    reason = refusal(target, drafter, expert_budget)
    if reason:
        raise ValueError(reason)
    hidden = tuple(drafter.hidden_layers) if drafter is not None else ()
    if static is None:
        static = prepare(target, gamma=gamma, max_len=-(-longest // 128) * 128, hidden_layers=hidden)
    elif static.hidden_layers != hidden:
        raise ValueError(
            f"engine: the CompiledTarget gives hidden layers {static.hidden_layers}, the drafter needs {hidden}"
        )
    return static


def _verify_eager(target, layout, cache, budget, drafter, tokens, parents, depths, prefix: int, hidden: bool):
    """The verify pass through transformers' forward: the root alone (AR) is causal right after the cache, so the
    model builds its own mask, as in HF's generate; a tree gets its ancestor mask."""
    device = target.device
    q = len(tokens)
    qpos = torch.tensor([[prefix + d for d in depths]], device=device)
    kpos = vis = None
    if q > 1:
        kpos = torch.cat([torch.arange(prefix, device=device), qpos[0]]) if layout.windowed else None
        tree_vis = ancestor_mask([p - 1 for p in parents[1:]], device)  # node-list parents: root = -1
        vis = torch.cat([torch.ones(q, prefix, dtype=torch.bool, device=device), tree_vis], 1)
    budgeted = isinstance(budget, ExpertBudget)
    if budgeted:
        budget.active = drafter is not None  # SD verify passes only: AR steps are never budgeted
    res = forward_block(target, layout, cache, torch.tensor([tokens], device=device), qpos, kpos, vis, hidden=hidden)
    if budgeted:
        budget.active = False
    return res


def _first_token(logits: torch.Tensor, temperature: float, top_p: float, gen: torch.Generator) -> int:
    """The token the prefill's last logits [1, V] give: the acceptance rule's bonus for a block of one token."""
    if temperature == 0:
        return accept_greedy([0], [-1], logits)[1]
    return accept_sampling([0], [-1], [1.0], logits, temperature, top_p, gen)[1]


def _summarise_passes(out: GenerateResult, routes: torch.Tensor, sizes: list[int], num_experts: int) -> None:
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


def _oracle_experts(target, layout, cache, cap, info, root, tree: DraftTree, prefix: int, static=None):
    """True expert sets of the root and every candidate: one extra target forward over the whole
    tree (analysis only), whose cache entries are dropped again."""
    if static is not None:
        masks = expert_bitmasks(static.lookup(root, tree), info.num_experts)
        return masks[0], masks[1:]
    tokens = torch.tensor([[root] + tree.tokens], device=target.device)
    qpos = torch.tensor([0] + tree.depths, device=target.device) + prefix
    kpos = torch.cat([torch.arange(prefix, device=target.device), qpos])
    vis = torch.cat(
        [
            torch.ones(len(tree) + 1, prefix, dtype=torch.bool, device=target.device),
            ancestor_mask(tree.parents, target.device),
        ],
        1,
    )
    forward_block(target, layout, cache, tokens, qpos, kpos, vis, logits_to_keep=1)
    cache.crop(-(len(tree) + 1))
    masks = expert_bitmasks(cap.pop(), info.num_experts)  # this pass alone: the verify passes are counted at the end
    return masks[0], masks[1:]
