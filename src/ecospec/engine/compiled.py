"""The compiled engine's target: `StaticQwen3` compiled by inductor, two graphs, prepared once per cell.

    prepared = prepare(target, gamma=6, max_len=512, hidden_layers=drafter.hidden_layers)
    ecospec.generate(target, ids, drafter=..., engine=prepared)       # or engine="compiled": prepared per call

A `CompiledTarget` holds the KV cache (allocated once for the cell's longest sequence), the step buffers (tokens,
positions, tree mask for each block size: allocated once, filled on the host) and the compiled steps: the AR step
(q = 1, its shape fixed) and one verify graph whose block size is a symbol over 2 .. γ, so that a method verifying
fewer than γ tokens (EVICT, Cascade, EcoSpec-Adaptive, a tree cut short) pays for its tokens, not for a γ block of
padding, with one graph to compile instead of one per size. The prefill and the oracle's look-up pass run the same
forward uncompiled. Accepted paths are compacted onto the prefix in place (one small compiled call for all
layers). Inductor's artefacts go to `$ECOSPEC_CACHE/inductor`, so a second process compiles from disk. Written with
no host read inside a step, so a GPU can capture its shapes as CUDA graphs later (not done: no GPU has run it).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch

from ecospec.engine.graphs import compile_method, prepared_on
from ecospec.engine.scope import compiled_problem
from ecospec.engine.static_qwen3 import StaticQwen3
from ecospec.engine.tree import ancestor_mask
from ecospec.models.adapters import moe_info


def refusal(target, drafter=None, expert_budget=None, batch_size: int = 1) -> str | None:
    """Why `engine="compiled"` cannot run this decode (one line), or None (`engine.scope.compiled_problem`, which
    validation asks too, then the toolchain). Never a silent fall back to eager."""
    kind = None if drafter is None else getattr(drafter, "kind", type(drafter).__name__)
    problem = compiled_problem(
        moe_info(target).family,
        hidden_act=target.config.hidden_act,
        drafter=kind,
        expert_budget=expert_budget,
        batch_size=batch_size,
    )
    return problem or toolchain_missing()


def toolchain_missing() -> str | None:
    """What inductor's CPU backend and the engine's CPU kernels lack here (a C++ compiler, ninja), or None."""
    try:
        from torch._inductor.cpp_builder import get_cpp_compiler

        get_cpp_compiler()
    except Exception as err:  # noqa: BLE001 - any failure to find one is the answer
        return (
            f"engine=compiled needs a C++ compiler for torch inductor, none works here ({err}); set CXX or install g++"
        )
    from torch.utils import cpp_extension

    if not cpp_extension.is_ninja_available():
        return "engine=compiled needs ninja to build its CPU kernels, none found here; pip install ninja"
    return None


@dataclass
class CompiledTarget:
    """A target prepared for compiled decoding (see the module docstring). `compile_s`: the warm-up, never part of
    a cell's timings."""

    target: object
    static: StaticQwen3
    steps: dict  # block size -> its compiled step: 1 the AR graph, 2 .. γ the one verify graph
    gamma: int
    max_len: int
    hidden_layers: tuple[int, ...]
    compact_step: object = None  # `StaticQwen3.compact` compiled (blocks of γ > 1 tokens)
    compile_s: float = 0.0
    length: int = 0  # committed tokens in the cache
    routes: list[torch.Tensor] = field(default_factory=list)  # each counted pass's routes [L_moe, q, k]
    sizes: tuple[int, ...] = field(init=False)  # every block size a step may verify: 1 .. γ

    def __post_init__(self):
        dev = self.static.slot_ids.device
        self.sizes = tuple(range(1, self.gamma + 1))
        self._tokens = {q: torch.zeros(q, dtype=torch.long, device=dev) for q in self.sizes}
        self._pos = {q: torch.zeros(q, dtype=torch.long, device=dev) for q in self.sizes}
        self._tree = {q: torch.ones(q, q, dtype=torch.bool, device=dev).tril() for q in self.sizes}
        self._start = torch.zeros((), dtype=torch.long, device=dev)
        self._src = torch.arange(self.gamma, device=dev)  # the compaction's source rows: the path, then identity

    def __enter__(self) -> CompiledTarget:
        return self

    def __exit__(self, *exc) -> None:
        self.routes = []

    def prepare_parts(
        self, drafter, predictor, *, gamma: int, depth: int, topk: int, predicted: bool, depths: tuple[int, ...] = ()
    ):
        """The EAGLE-3 head's draft steps (for each tree depth in `depths` too) and the expert predictor's pass
        compiled too (a draft model, the oracle and a method without a predictor keep theirs)."""
        from ecospec.engine.static_eagle3 import prepare_drafter
        from ecospec.engine.static_predictor import prepare_predictor

        drafter = prepare_drafter(drafter, gamma=gamma, depth=depth, topk=topk, max_len=self.max_len, depths=depths)
        if predicted:
            predictor = prepare_predictor(predictor, gamma=gamma, depth=depth, topk=topk, max_len=self.max_len)
        return drafter, predictor

    def _check_room(self, n: int) -> None:
        if n > self.max_len:
            raise ValueError(f"the sequence needs {n} cache slots; the compiled target was prepared for {self.max_len}")

    # -- the decode loop's calls (`engine.targets`), one sequence ------------------------------------------------

    def prefill(self, prompts: list[torch.Tensor]):
        logits, feats = self.prefill_one(self._one(prompts))
        return logits, None if feats is None else [feats[0]]

    def verify(self, blocks):
        blk = self._one(blocks)
        logits, feats = self.verify_one(blk.tokens, blk.parents, blk.depths)
        return [logits], None if feats is None else [feats[0]]

    def compact(self, paths: list[list[int]]) -> None:
        self.compact_one(self._one(paths))

    def drop(self, keep: list[int]) -> None:
        raise ValueError("drop: a decode of one sequence has no rows to drop")

    def lookup(self, roots: list[int], trees) -> list[torch.Tensor]:
        return [self.lookup_one(self._one(roots), self._one(trees))]

    @staticmethod
    def _one(rows: list):
        if len(rows) != 1:
            raise ValueError(f"the compiled target decodes one sequence at a time, got {len(rows)}")
        return rows[0]

    # -- one sequence's passes (what the studies time) ---------------------------------------------------------

    def prefill_one(self, ids: torch.Tensor):
        """The prompt [n] at slots 0..n-1 (uncompiled): (last position's logits [1, V], features [1, n, F] or None)."""
        n = ids.shape[0]
        self._check_room(n + self.gamma)
        dev = ids.device
        causal = torch.ones(n, n, dtype=torch.bool, device=dev).tril()
        logits, feats = self.static(ids, torch.arange(n, device=dev), torch.tensor(0, device=dev), causal)
        self.length, self.routes = n, []
        return logits[-1:], None if feats is None else feats[None]

    def verify_one(self, tokens: list[int], parents: list[int], depths: list[int]):
        """One step's block (root + chosen nodes, block-index parents) after the committed tokens, at its own size
        (the AR graph for q = 1, the verify graph for 2 .. γ): (logits [q, V], features [1, q, F] or None). Its
        routes are kept for the counts at the end."""
        q = len(tokens)
        if q > self.gamma:
            raise ValueError(f"a block of {q} tokens exceeds the prepared gamma {self.gamma}")
        self._check_room(self.length + q)
        self._tokens[q].copy_(torch.tensor(tokens))
        self._pos[q].copy_(torch.tensor(depths)).add_(self.length)
        if q > 1:
            self._tree[q].copy_(ancestor_mask([p - 1 for p in parents[1:]]))
        self._start.fill_(self.length)
        logits, feats = self.steps[q](self._tokens[q], self._pos[q], self._start, self._tree[q])
        self.routes.append(self.static.routes[:, :q].clone())
        return logits, None if feats is None else feats[None]

    def lookup_one(self, root: int, tree) -> torch.Tensor:
        """The oracle's pass over root + the whole tree (uncompiled, analysis only): its routes [L_moe, 1 + n, k].
        It writes scratch slots after the committed tokens, which the next step overwrites."""
        n = len(tree) + 1
        self._check_room(self.length + n)
        dev = self._start.device
        tokens = torch.tensor([root] + tree.tokens, device=dev)
        pos = torch.tensor([0] + tree.depths, device=dev) + self.length
        self.static(tokens, pos, torch.tensor(self.length, device=dev), ancestor_mask(tree.parents, dev))
        return self.static.routes[:, :n].clone()

    def compact_one(self, path: list[int]) -> None:
        """Move the accepted path's cache rows (block indices) right after the committed tokens."""
        start = self.length
        if path != list(range(len(path))):
            self._src.copy_(torch.tensor(path + list(range(len(path), self.gamma))))
            self._start.fill_(start)
            self.compact_step(self._src, self._start)
        self.length = start + len(path)

    def take_routes(self) -> torch.Tensor:
        """Every counted pass's routes back to back, [L_moe, sum of block sizes, k]."""
        routes, self.routes = self.routes, []
        if not routes:
            return self.static.routes[:, :0].clone()
        return torch.cat(routes, dim=1)


def mark_block_size(buffers, gamma: int) -> None:
    """Make a block's size a symbol over 2 .. γ in the verify graph that `buffers` (its tokens, positions and tree)
    are first passed to; with γ = 2 the one size stays a constant (a size of 1 would be a constant to dynamo)."""
    if gamma > 2:
        for buf in buffers:
            for dim in range(buf.dim()):
                torch._dynamo.mark_dynamic(buf, dim, min=2, max=gamma)


def prepare(
    target,
    *,
    gamma: int,
    max_len: int,
    hidden_layers: tuple[int, ...] = (),
    forced_routing: bool = False,
) -> CompiledTarget:
    """Compile `target`'s steps for blocks of up to `gamma` tokens and sequences of up to `max_len` slots (and the
    compaction of an accepted path), and warm them up (timed: `compile_s`): the AR graph (q = 1) and, for γ > 1, one
    verify graph for every block size 2 .. γ, each size called once (the first call compiles it, from disk when
    inductor's cache has it; the others must find it). The same arguments give the same prepared object within a
    process. `forced_routing`: the routers' choices come from `static.forced_ids` (the verify-latency benchmark)."""
    key = ("target", gamma, max_len, tuple(hidden_layers), forced_routing)
    if key in prepared_on(target):
        return prepared_on(target)[key]
    reason = refusal(target)
    if reason:
        raise ValueError(reason)
    static = StaticQwen3(target, max_len, tuple(hidden_layers), forced_routing)
    compact_step = compile_method(static, StaticQwen3.compact) if gamma > 1 else None  # AR accepts its one token
    prepared = CompiledTarget(target, static, {}, gamma, max_len, tuple(hidden_layers), compact_step)
    t0 = time.perf_counter()
    with torch.inference_mode():
        prepared.steps[1] = compile_method(static, StaticQwen3.forward)
        block = compile_method(static, StaticQwen3.forward) if gamma > 1 else None
        for q in prepared.sizes[1:]:
            mark_block_size((prepared._tokens[q], prepared._pos[q], prepared._tree[q]), gamma)
            prepared.steps[q] = block
        for q in prepared.sizes:
            prepared.steps[q](prepared._tokens[q], prepared._pos[q], prepared._start, prepared._tree[q])
        if compact_step is not None:
            compact_step(prepared._src, prepared._start)  # the identity: moves nothing
    prepared.compile_s = time.perf_counter() - t0
    prepared_on(target)[key] = prepared
    return prepared
