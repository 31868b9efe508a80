"""The target interface the decode loop runs over, and its eager implementation (`compiled.CompiledTarget` is the
other). Both are context managers for one decode of B sequences (rows, in the order the loop keeps them) and answer
the same calls:

* `prefill(prompts)` (each [n_b]) -> (each row's last prompt position's logits [B, V], each row's drafter
  features [n_b, F] or None);
* `verify(blocks)` -> (logits [m_b, V] per row, features [m_b, F] per row or None): each row's block
  (`step.Block`: root + chosen nodes, block-index parents, draft depths) after its committed tokens, in one pass;
  its routes kept for the counts at the end;
* `compact(paths)`: each row keeps its accepted block indices' cache entries right after its committed tokens;
* `drop(keep)`: only rows `keep` (in that order) stay: finished sequences leave the batch;
* `lookup(roots, trees)` -> each row's routes [L_moe, 1 + n_b, k]: the oracle's pass over the whole trees
  (analysis only, dropped from the cache again);
* `take_routes()` -> every counted row-pass's routes back to back [L_moe, sum of block sizes, k], row by row
  within a pass;
* `prepare_parts(drafter, predictor, ...)`: the drafter and predictor this engine decodes with (compiled forms).
"""

from __future__ import annotations

from contextlib import ExitStack

import torch

from ecospec.engine.batch import RowBlock, compact_rows, drop_rows, forward_rows
from ecospec.engine.budget import ExpertBudget
from ecospec.engine.forward import attention_layout, cache_len, compact_cache, crop_cache, forward_block, new_cache
from ecospec.engine.routing import RoutingCapture
from ecospec.engine.scope import ENGINES, slots
from ecospec.engine.tree import ancestor_mask


class EagerTarget:
    """transformers' forward over a dynamic KV cache (the paper's prototype regime). `hidden_layers`: the target
    hidden states the drafter reads; `budgeted`: MoE-Spec's cap applies to the verify passes (SD only).

    One sequence runs the plain forward (the model builds its own causal mask for an AR step, as in HF's
    generate); several run `engine.batch.forward_rows` over one right-padded cache, each row with its own committed
    length, positions and tree mask."""

    def __init__(self, target, hidden_layers=(), expert_budget=None, budget_policy="truncate", budgeted=True):
        self.target, self.hidden_layers = target, tuple(hidden_layers)
        self.layout = attention_layout(target.config, target)
        self.device = target.device
        self.cache = new_cache()
        self.budget = ExpertBudget(target, expert_budget, budget_policy) if expert_budget is not None else None
        self.budgeted = budgeted
        self.capture = RoutingCapture(target)
        self.batched = False  # set by `prefill`: more than one sequence
        self.lengths: list[int] = []  # each row's committed entries (batched)
        self._start = 0  # the cache slot where the last verified block began
        self._routes: list[torch.Tensor] = []  # batched: each pass's real tokens' routes
        self._stack = ExitStack()

    def __enter__(self) -> EagerTarget:
        if self.budget is not None:  # the budget's router hook first: the capture sees what ran
            self._stack.enter_context(self.budget)
        self._stack.enter_context(self.capture)
        return self

    def __exit__(self, *exc) -> None:
        self._stack.close()

    def prepare_parts(self, drafter, predictor, **shapes):
        """The eager engine decodes with the drafter and predictor as they are."""
        return drafter, predictor

    def _features(self, res) -> torch.Tensor | None:
        """The drafter's features [B, q, F] of a forward, or None."""
        if not self.hidden_layers:
            return None
        return torch.cat([res.hidden_states[i] for i in self.hidden_layers], dim=-1)

    def prefill(self, prompts: list[torch.Tensor]):
        self.batched = len(prompts) > 1
        hidden = bool(self.hidden_layers)
        if not self.batched:
            n = prompts[0].shape[0]
            pos = torch.arange(n, device=self.device)[None]
            res = forward_block(
                self.target, self.layout, self.cache, prompts[0][None], pos, None, None, hidden=hidden, logits_to_keep=1
            )
            last, feats = res.logits[0, -1:], self._features(res)
            self.lengths = [n]
        else:
            blocks = [RowBlock(p.tolist(), list(range(len(p))), _causal(len(p))) for p in prompts]
            res, _ = forward_rows(self.target, self.layout, self.cache, [0] * len(prompts), blocks, hidden=hidden)
            last = torch.cat([res.logits[b, len(p) - 1 : len(p)] for b, p in enumerate(prompts)])
            feats = self._features(res)
            self.lengths = [len(p) for p in prompts]
        self.capture.clear()
        return last, None if feats is None else [feats[b, :n] for b, n in enumerate(self.lengths)]

    def verify(self, blocks):
        if self.budget is not None:
            self.budget.active = self.budgeted  # SD verify passes only: AR steps are never budgeted
        res = self._verify_rows(blocks) if self.batched else self._verify_one(blocks[0])
        if self.budget is not None:
            self.budget.active = False
        feats = self._features(res)
        sizes = [len(b.tokens) for b in blocks]
        return [res.logits[r, :m] for r, m in enumerate(sizes)], (
            None if feats is None else [feats[r, :m] for r, m in enumerate(sizes)]
        )

    def _verify_one(self, blk):
        """The root alone (AR) is causal right after the cache: the model builds its own mask, as in HF's generate;
        a tree gets its ancestor mask."""
        device, q = self.device, len(blk.tokens)
        self._start = prefix = self.cache.get_seq_length()
        qpos = torch.tensor([[prefix + d for d in blk.depths]], device=device)
        kpos = vis = None
        if q > 1:
            kpos = torch.cat([torch.arange(prefix, device=device), qpos[0]]) if self.layout.windowed else None
            tree_vis = ancestor_mask([p - 1 for p in blk.parents[1:]], device)  # node-list parents: root = -1
            vis = torch.cat([torch.ones(q, prefix, dtype=torch.bool, device=device), tree_vis], 1)
        tokens = torch.tensor([blk.tokens], device=device)
        return forward_block(
            self.target, self.layout, self.cache, tokens, qpos, kpos, vis, hidden=bool(self.hidden_layers)
        )

    def _verify_rows(self, blocks):
        rows = [RowBlock(b.tokens, b.depths, ancestor_mask([p - 1 for p in b.parents[1:]])) for b in blocks]
        self._start = cache_len(self.cache)
        if self.budget is not None:  # one budget for the whole pass (it loads the union of every row's experts)
            self.budget.real = _real_tokens(rows)
        res, real = forward_rows(
            self.target, self.layout, self.cache, self.lengths, rows, hidden=bool(self.hidden_layers)
        )
        routes = self.capture.take(device=None).view(len(self.capture.routers), len(rows), real.shape[1], -1)
        self._routes.append(torch.cat([routes[:, r, : len(b.tokens)] for r, b in enumerate(rows)], dim=1))
        return res

    def compact(self, paths: list[list[int]]) -> None:
        if self.batched:
            self.lengths = compact_rows(self.cache, self.lengths, self._start, paths)
        else:
            compact_cache(self.cache, self._start, paths[0])
            self.lengths = [self._start + len(paths[0])]

    def drop(self, keep: list[int]) -> None:
        if not self.batched:
            raise ValueError("drop: a decode of one sequence has no rows to drop")
        drop_rows(self.cache, keep)
        self.lengths = [self.lengths[r] for r in keep]

    def lookup(self, roots: list[int], trees) -> list[torch.Tensor]:
        device = self.device
        if not self.batched:
            root, tree, prefix = roots[0], trees[0], self.cache.get_seq_length()
            tokens = torch.tensor([[root] + tree.tokens], device=device)
            qpos = torch.tensor([0] + tree.depths, device=device) + prefix
            kpos = torch.cat([torch.arange(prefix, device=device), qpos])
            vis = torch.cat(
                [
                    torch.ones(len(tree) + 1, prefix, dtype=torch.bool, device=device),
                    ancestor_mask(tree.parents, device),
                ],
                1,
            )
            forward_block(self.target, self.layout, self.cache, tokens, qpos, kpos, vis, logits_to_keep=1)
            self.cache.crop(-(len(tree) + 1))
            return [self.capture.pop()]  # this pass alone: the verify passes are counted at the end
        width = cache_len(self.cache)
        blocks = [
            RowBlock([root, *t.tokens], [0, *t.depths], ancestor_mask(t.parents))
            for root, t in zip(roots, trees, strict=True)
        ]
        _, real = forward_rows(self.target, self.layout, self.cache, self.lengths, blocks)
        crop_cache(self.cache, width)  # the tree's slots sit behind every row's entries
        routes = self.capture.take().view(len(self.capture.routers), len(blocks), real.shape[1], -1)
        return [routes[:, r, : len(b.tokens)] for r, b in enumerate(blocks)]

    def take_routes(self) -> torch.Tensor:
        if not self.batched:
            return self.capture.take(device=None)
        routes, self._routes = self._routes, []
        if not routes:
            return self.capture.take(device=None)  # no pass: [L, 0, k]
        return torch.cat(routes, dim=1)


def _causal(n: int) -> torch.Tensor:
    return torch.ones(n, n, dtype=torch.bool).tril()


def _real_tokens(blocks) -> torch.Tensor:
    """bool [B * q] (batch-major, as the routers see the pass): which queries of the next forward_rows are real."""
    q = max(len(b.tokens) for b in blocks)
    return (torch.arange(q)[None, :] < torch.tensor([len(b.tokens) for b in blocks])[:, None]).reshape(-1)


def open_target(engine, target, drafter, expert_budget, budget_policy, block: int, longest: int, rows: int = 1):
    """The target interface of one decode: `engine` "eager", "compiled" (prepared here) or a prepared
    `CompiledTarget` (one prepared for a drafter serves an AR decode too: its features go unread); refusals name
    what is missing."""
    from ecospec.engine.compiled import CompiledTarget, prepare, refusal

    hidden = tuple(drafter.hidden_layers) if drafter is not None else ()
    if engine == "eager":
        return EagerTarget(target, hidden, expert_budget, budget_policy, budgeted=drafter is not None)
    if not isinstance(engine, CompiledTarget) and engine != "compiled":
        raise ValueError(f"unknown engine {engine!r}; choose one of {', '.join(ENGINES)} or a CompiledTarget")
    reason = refusal(target, drafter, expert_budget, batch_size=rows)
    if reason:
        raise ValueError(reason)
    if engine == "compiled":
        return prepare(target, gamma=block, max_len=slots(longest), hidden_layers=hidden, rows=rows)
    if engine.target is not target:
        raise ValueError("engine: the CompiledTarget was prepared for another target")
    if engine.rows < rows:
        raise ValueError(f"engine: the CompiledTarget was prepared for {engine.rows} sequences; this decode has {rows}")
    if engine.gamma < block or engine.max_len < longest:
        raise ValueError(
            f"engine: the CompiledTarget was prepared for gamma {engine.gamma} and {engine.max_len} "
            f"slots; this decode needs gamma {block} and {longest}"
        )
    if drafter is not None and engine.hidden_layers != hidden:
        raise ValueError(
            f"engine: the CompiledTarget gives hidden layers {engine.hidden_layers}, the drafter needs {hidden}"
        )
    return engine
