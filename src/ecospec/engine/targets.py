"""The target interface the decode loop runs over, and its eager implementation (`compiled.CompiledTarget` is the
other). Both are context managers for one decode and answer the same calls:

* `prefill(ids [n])` -> (the last position's logits [1, V], the drafter's features [1, n, F] or None);
* `verify(tokens, parents, depths)` -> (logits [q, V], features [1, q, F] or None): one block (root + chosen nodes,
  block-index parents, draft depths) after the committed tokens, its routes kept for the counts at the end;
* `compact(path)`: keep the accepted block indices' cache rows right after the committed tokens;
* `lookup(root, tree)` -> routes [L_moe, 1 + n, k]: the oracle's pass over the whole tree (analysis only, dropped
  from the cache again);
* `take_routes()` -> every counted pass's routes back to back [L_moe, sum of block sizes, k];
* `prepare_parts(drafter, predictor, ...)`: the drafter and predictor this engine decodes with (compiled forms).
"""

from __future__ import annotations

from contextlib import ExitStack

import torch

from ecospec.engine.budget import ExpertBudget
from ecospec.engine.forward import attention_layout, compact_cache, forward_block, new_cache
from ecospec.engine.routing import RoutingCapture
from ecospec.engine.scope import ENGINES, slots
from ecospec.engine.tree import ancestor_mask


class EagerTarget:
    """transformers' forward over a dynamic KV cache (the paper's prototype regime). `hidden_layers`: the target
    hidden states the drafter reads; `budgeted`: MoE-Spec's cap applies to the verify passes (SD only)."""

    def __init__(self, target, hidden_layers=(), expert_budget=None, budget_policy="truncate", budgeted=True):
        self.target, self.hidden_layers = target, tuple(hidden_layers)
        self.layout = attention_layout(target.config, target)
        self.device = target.device
        self.cache = new_cache()
        self.budget = ExpertBudget(target, expert_budget, budget_policy) if expert_budget is not None else None
        self.budgeted = budgeted
        self.capture = RoutingCapture(target)
        self._prefix = 0
        self._stack = ExitStack()

    def __enter__(self) -> EagerTarget:
        if self.budget is not None:  # the budget's router hook first: the capture sees what ran
            self._stack.enter_context(self.budget)
        self._stack.enter_context(self.capture)
        return self

    def __exit__(self, *exc) -> None:
        self._stack.close()

    @property
    def length(self) -> int:
        return self.cache.get_seq_length()

    def prepare_parts(self, drafter, predictor, **shapes):
        """The eager engine decodes with the drafter and predictor as they are."""
        return drafter, predictor

    def _features(self, res) -> torch.Tensor | None:
        if not self.hidden_layers:
            return None
        return torch.cat([res.hidden_states[i] for i in self.hidden_layers], dim=-1)

    def prefill(self, ids: torch.Tensor):
        n = ids.shape[0]
        res = forward_block(
            self.target,
            self.layout,
            self.cache,
            ids[None],
            torch.arange(n, device=self.device)[None],
            None,
            None,
            hidden=bool(self.hidden_layers),
            logits_to_keep=1,
        )
        self.capture.clear()
        return res.logits[0, -1:], self._features(res)

    def verify(self, tokens: list[int], parents: list[int], depths: list[int]):
        """The root alone (AR) is causal right after the cache: the model builds its own mask, as in HF's generate;
        a tree gets its ancestor mask."""
        device, q = self.device, len(tokens)
        self._prefix = prefix = self.length
        qpos = torch.tensor([[prefix + d for d in depths]], device=device)
        kpos = vis = None
        if q > 1:
            kpos = torch.cat([torch.arange(prefix, device=device), qpos[0]]) if self.layout.windowed else None
            tree_vis = ancestor_mask([p - 1 for p in parents[1:]], device)  # node-list parents: root = -1
            vis = torch.cat([torch.ones(q, prefix, dtype=torch.bool, device=device), tree_vis], 1)
        if self.budget is not None:
            self.budget.active = self.budgeted  # SD verify passes only: AR steps are never budgeted
        res = forward_block(
            self.target,
            self.layout,
            self.cache,
            torch.tensor([tokens], device=device),
            qpos,
            kpos,
            vis,
            hidden=bool(self.hidden_layers),
        )
        if self.budget is not None:
            self.budget.active = False
        return res.logits[0], self._features(res)

    def compact(self, path: list[int]) -> None:
        compact_cache(self.cache, self._prefix, path)

    def lookup(self, root: int, tree) -> torch.Tensor:
        device, prefix = self.device, self.length
        tokens = torch.tensor([[root] + tree.tokens], device=device)
        qpos = torch.tensor([0] + tree.depths, device=device) + prefix
        kpos = torch.cat([torch.arange(prefix, device=device), qpos])
        vis = torch.cat(
            [torch.ones(len(tree) + 1, prefix, dtype=torch.bool, device=device), ancestor_mask(tree.parents, device)], 1
        )
        forward_block(self.target, self.layout, self.cache, tokens, qpos, kpos, vis, logits_to_keep=1)
        self.cache.crop(-(len(tree) + 1))
        return self.capture.pop()  # this pass alone: the verify passes are counted at the end

    def take_routes(self) -> torch.Tensor:
        return self.capture.take(device=None)


def open_target(engine, target, drafter, expert_budget, budget_policy, block: int, longest: int):
    """The target interface of one decode: `engine` "eager", "compiled" (prepared here) or a prepared
    `CompiledTarget` (one prepared for a drafter serves an AR decode too: its features go unread); refusals name
    what is missing."""
    from ecospec.engine.compiled import CompiledTarget, prepare, refusal

    hidden = tuple(drafter.hidden_layers) if drafter is not None else ()
    if engine == "eager":
        return EagerTarget(target, hidden, expert_budget, budget_policy, budgeted=drafter is not None)
    if not isinstance(engine, CompiledTarget) and engine != "compiled":
        raise ValueError(f"unknown engine {engine!r}; choose one of {', '.join(ENGINES)} or a CompiledTarget")
    reason = refusal(target, drafter, expert_budget)
    if reason:
        raise ValueError(reason)
    if engine == "compiled":
        return prepare(target, gamma=block, max_len=slots(longest), hidden_layers=hidden)
    if engine.target is not target:
        raise ValueError("engine: the CompiledTarget was prepared for another target")
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
