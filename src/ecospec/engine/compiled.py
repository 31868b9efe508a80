"""The compiled engine's target: `StaticQwen3` prepared once per cell, its step one native call on the CPU or
inductor's graphs elsewhere.

    prepared = prepare(target, gamma=6, max_len=512, hidden_layers=drafter.hidden_layers)
    ecospec.generate(target, ids, drafter=..., engine=prepared)       # or engine="compiled": prepared per call
    batch = prepare(target, gamma=4, max_len=512, rows=8)             # every step runs 8 sequences
    ecospec.generate_batch(target, prompts, drafter=draft_model, engine=batch)

A `CompiledTarget` holds the KV cache (allocated once for the cell's longest sequence), the step buffers (tokens,
positions, tree mask for each block size: allocated once, filled on the host) and the steps. On the CPU (float32,
float64) every block size runs the native step (`StaticQwen3.native_step`): nothing to compile, no graph around the
arithmetic. Elsewhere, or with `native=False`, inductor
compiles two graphs: the AR step (q = 1, its shape fixed) and one verify graph whose block size is a symbol over 2 ..
γ, so that a method verifying fewer than γ tokens (EVICT, Cascade, EcoSpec-Adaptive, a tree cut short) pays for its
tokens, not for a γ block of padding. The prefill and the oracle's look-up pass run the tensor-code forward
uncompiled. Accepted paths are compacted onto the prefix in place (one native call, or one small compiled call, for
all layers). A batch runs every row at each step's longest block, shorter blocks padded and finished sequences
masked at the fixed shape (`CompiledTarget`). Inductor's artefacts go to `$ECOSPEC_CACHE/inductor`, so a second
process compiles from disk. The graphs are written with no host read inside a step, so a GPU can capture their
shapes as CUDA graphs later (not done: no GPU has run them).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch

from ecospec.engine.graphs import compile_method, prepared_on, weights_key
from ecospec.engine.scope import compiled_problem
from ecospec.engine.static_qwen3 import StaticQwen3
from ecospec.engine.step import Block
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
    """A target prepared for compiled decoding (see the module docstring) of up to `rows` sequences at a time.
    `compile_s`: the warm-up, never part of a cell's timings.

    Each step runs every prepared row at one block size, the batch's longest block: a shorter block is padded with
    copies of its root (the root's position, seeing only itself: the root's own hidden states, so no expert that the
    root does not route to), and a sequence that has finished stays in its row as a one-token dummy (masked at the
    fixed shape; its slot is overwritten and never read; why not leaving the batch: docs/engine.md, "A batch").
    `live`: the row of each sequence the loop decodes, in its order."""

    target: object
    static: StaticQwen3
    steps: dict  # block size -> its compiled step: 1 the AR graph, 2 .. γ the one verify graph
    gamma: int
    max_len: int
    hidden_layers: tuple[int, ...]
    compact_step: object = None  # `StaticQwen3.compact` compiled (blocks of γ > 1 tokens)
    compile_s: float = 0.0
    rows: int = 1
    lengths: list[int] = field(default_factory=list)  # each row's committed tokens in the cache
    live: list[int] = field(default_factory=list)
    routes: list[torch.Tensor] = field(default_factory=list)  # each counted pass's routes [L_moe, tokens, k]
    sizes: tuple[int, ...] = field(init=False)  # every block size a step may verify: 1 .. γ

    def __post_init__(self):
        dev = self.static.slot_ids.device
        r = self.rows
        self.sizes = tuple(range(1, self.gamma + 1))
        self._tokens = {q: torch.zeros(r, q, dtype=torch.long, device=dev) for q in self.sizes}
        self._pos = {q: torch.zeros(r, q, dtype=torch.long, device=dev) for q in self.sizes}
        self._tree = {q: torch.ones(q, q, dtype=torch.bool, device=dev).tril().repeat(r, 1, 1) for q in self.sizes}
        self._start = torch.zeros(r, dtype=torch.long, device=dev)
        self._src = torch.arange(self.gamma, device=dev).repeat(r, 1)  # compaction's sources: the path, then identity
        self.lengths, self.live = [0] * r, list(range(r))

    @property
    def length(self) -> int:
        """One sequence's committed tokens (the studies' single-sequence calls)."""
        return self.lengths[0]

    def __enter__(self) -> CompiledTarget:
        return self

    def __exit__(self, *exc) -> None:
        self.routes = []

    def prepare_parts(
        self, drafter, predictor, *, gamma: int, depth: int, topk: int, predicted: bool, depths: tuple[int, ...] = ()
    ):
        """The EAGLE-3 head's draft steps (for each tree depth in `depths` too) and the expert predictor's pass
        compiled too (a draft model, the oracle and a method without a predictor keep theirs). A batch runs a native
        copy of each per sequence (`engine.per_row`), or keeps them eager where the native passes do not run."""
        from ecospec.drafters.registry import kind
        from ecospec.engine.static_predictor import prepare_predictor

        shape = {"gamma": gamma, "depth": depth, "topk": topk, "max_len": self.max_len, "rows": self.rows}
        record = kind(drafter.kind) if drafter is not None and hasattr(drafter, "kind") else None
        if record is not None and record.prepare is not None:
            drafter = record.prepare(drafter, **shape, depths=depths)
        if predicted:
            predictor = prepare_predictor(predictor, **shape)
        return drafter, predictor

    def _check_room(self, n: int) -> None:
        if n > self.max_len:
            raise ValueError(f"the sequence needs {n} cache slots; the compiled target was prepared for {self.max_len}")

    # -- the decode loop's calls (`engine.targets`) ---------------------------------------------------------------

    def prefill(self, prompts: list[torch.Tensor]):
        """Each prompt at slots 0 .. n_b - 1 of its row, in one uncompiled pass (right-padded with its last token,
        whose slots the first step overwrites)."""
        if len(prompts) > self.rows:
            raise ValueError(f"{len(prompts)} sequences; the compiled target was prepared for {self.rows}")
        n = max(p.shape[0] for p in prompts)
        self._check_room(n + self.gamma)
        dev = prompts[0].device
        padded = [torch.cat([p, p[-1:].expand(n - p.shape[0])]) for p in prompts]
        padded += [padded[0]] * (self.rows - len(prompts))  # rows no sequence uses: dummies
        tokens, pos = torch.stack(padded), torch.arange(n, device=dev).expand(self.rows, n)
        causal = torch.ones(n, n, dtype=torch.bool, device=dev).tril().expand(self.rows, n, n)
        logits, feats = self.static(tokens, pos, torch.zeros(self.rows, dtype=torch.long, device=dev), causal)
        self.lengths = [p.shape[0] for p in prompts] + [n] * (self.rows - len(prompts))
        self.live, self.routes = list(range(len(prompts))), []
        last = torch.stack([logits[b, len(p) - 1] for b, p in enumerate(prompts)])
        return last, None if feats is None else [feats[b, : len(p)] for b, p in enumerate(prompts)]

    def verify(self, blocks):
        """Every row's block in one pass at the batch's longest block size (the AR graph for 1, the verify graph
        for 2 .. γ): logits [m_b, V] and features [m_b, F] or None for each live row."""
        if len(blocks) != len(self.live):
            raise ValueError(f"{len(blocks)} blocks for {len(self.live)} sequences")
        q = max(len(b.tokens) for b in blocks)
        if q > self.gamma:
            raise ValueError(f"a block of {q} tokens exceeds the prepared gamma {self.gamma}")
        rows = [(b.tokens, b.depths, [p - 1 for p in b.parents[1:]]) for b in blocks]
        logits, feats = self._step(q, *self._inputs(q, rows))
        routes = self.static.routes[:, : self.rows * q].view(self.static.routes.shape[0], self.rows, q, -1)
        sizes = [len(b.tokens) for b in blocks]
        self.routes.append(torch.cat([routes[:, r, :m] for r, m in zip(self.live, sizes, strict=True)], dim=1))
        live = list(zip(self.live, sizes, strict=True))
        return [logits[r, :m] for r, m in live], None if feats is None else [feats[r, :m] for r, m in live]

    def _inputs(self, q: int, rows: list[tuple[list[int], list[int], list[int]]]):
        """A pass's host inputs (tokens, positions [R, q], tree [R, q, q]) from each live row's (tokens, draft depths,
        node-list parents: root -1), padded to q with copies of its root that see only themselves; a row no sequence
        uses is a dummy (token 0 at its last committed slot, seeing only itself)."""
        tokens = torch.zeros(self.rows, q, dtype=torch.long)
        pos = torch.tensor(self.lengths)[:, None].expand(self.rows, q).clone()
        tree = torch.eye(q, dtype=torch.bool).repeat(self.rows, 1, 1)
        for r, (toks, depths, parents) in zip(self.live, rows, strict=True):
            m, n = len(toks), self.lengths[r]
            self._check_room(n + q)
            tokens[r] = torch.tensor(toks + [toks[0]] * (q - m))
            pos[r, :m] = torch.tensor(depths) + n
            if m > 1:
                tree[r, :m, :m] = ancestor_mask(parents)
        return tokens, pos, tree

    def _step(self, q: int, tokens, pos, tree):
        self._tokens[q].copy_(tokens)
        self._pos[q].copy_(pos)
        if q > 1:
            self._tree[q].copy_(tree)
        self._start.copy_(torch.tensor(self.lengths))
        return self.steps[q](self._tokens[q], self._pos[q], self._start, self._tree[q])

    def compact(self, paths: list[list[int]]) -> None:
        """Each live row's accepted path (block indices) moves right after its committed tokens."""
        if any(path != list(range(len(path))) for path in paths):
            src = torch.arange(self.gamma).repeat(self.rows, 1)
            for r, path in zip(self.live, paths, strict=True):
                src[r, : len(path)] = torch.tensor(path)
            self._src.copy_(src)
            self._start.copy_(torch.tensor(self.lengths))
            self.compact_step(self._src, self._start)
        for r, path in zip(self.live, paths, strict=True):
            self.lengths[r] += len(path)

    def drop(self, keep: list[int]) -> None:
        """Only live rows `keep` go on; the others stay in the batch as dummies (masked at the fixed shape)."""
        if self.rows == 1:
            raise ValueError("drop: a decode of one sequence has no rows to drop")
        self.live = [self.live[r] for r in keep]

    def lookup(self, roots: list[int], trees) -> list[torch.Tensor]:
        """The oracle's pass over each live row's root + whole tree (uncompiled, analysis only): its routes
        [L_moe, 1 + n_b, k]. It writes scratch slots after the committed tokens, which the next step overwrites."""
        n = max(len(t) for t in trees) + 1
        rows = [([root, *t.tokens], [0, *t.depths], t.parents) for root, t in zip(roots, trees, strict=True)]
        tokens, pos, tree = self._inputs(n, rows)
        dev = self._start.device
        self.static(tokens.to(dev), pos.to(dev), torch.tensor(self.lengths, device=dev), tree.to(dev))
        routes = self.static.routes[:, : self.rows * n].view(self.static.routes.shape[0], self.rows, n, -1)
        return [routes[:, r, : len(t) + 1].clone() for r, t in zip(self.live, trees, strict=True)]

    def take_routes(self) -> torch.Tensor:
        """Every counted pass's routes back to back, [L_moe, sum of block sizes, k], row by row within a pass."""
        routes, self.routes = self.routes, []
        if not routes:
            return self.static.routes[:, :0].clone()
        return torch.cat(routes, dim=1)

    # -- one sequence's passes (what the studies time) ---------------------------------------------------------

    def prefill_one(self, ids: torch.Tensor):
        """The prompt [n] at slots 0..n-1 (uncompiled): (last position's logits [1, V], features [1, n, F] or None)."""
        logits, feats = self.prefill([ids])
        return logits, None if feats is None else feats[0][None]

    def verify_one(self, tokens: list[int], parents: list[int], depths: list[int]):
        """One step's block (root + chosen nodes, block-index parents) after the committed tokens, at its own size:
        (logits [q, V], features [1, q, F] or None). Its routes are kept for the counts at the end."""
        logits, feats = self.verify([Block(tokens, parents, depths, [1.0] * len(tokens))])
        return logits[0], None if feats is None else feats[0][None]

    def compact_one(self, path: list[int]) -> None:
        """Move the accepted path's cache rows (block indices) right after the committed tokens."""
        self.compact([path])


def mark_block_size(buffers, gamma: int) -> None:
    """Make a block's size a symbol over 2 .. γ in the verify graph that `buffers` (its tokens [R, q], positions
    [R, q] and tree [R, q, q]) are first passed to; the rows stay fixed. With γ = 2 the one size stays a constant (a
    size of 1 would be a constant to dynamo)."""
    if gamma > 2:
        for buf in buffers:
            for dim in range(1, buf.dim()):
                torch._dynamo.mark_dynamic(buf, dim, min=2, max=gamma)


def prepare(
    target,
    *,
    gamma: int,
    max_len: int,
    hidden_layers: tuple[int, ...] = (),
    forced_routing: bool = False,
    rows: int = 1,
    native: bool | None = None,
) -> CompiledTarget:
    """Prepare `target`'s steps for blocks of up to `gamma` tokens and sequences of up to `max_len` slots (and the
    compaction of an accepted path), and warm them up (timed: `compile_s`). `native`: None takes the native step
    where it runs (float32 or float64 on the CPU), True insists on it, False compiles inductor's graphs instead: the
    AR graph (q = 1) and, for γ > 1, one verify graph for every block size 2 .. γ, each size called once (the first
    call compiles it, from disk when inductor's cache has it; the others must find it). The same arguments give the
    same prepared object within a process. `forced_routing`: the routers' choices come from `static.forced_ids` (the
    verify-latency benchmark); `rows`: the sequences a step runs (every graph is one batch size's; a sequence that
    finishes early stays as a masked row, `CompiledTarget`)."""
    key = ("target", gamma, max_len, tuple(hidden_layers), forced_routing, rows, native, weights_key(target))
    if key in prepared_on(target):
        return prepared_on(target)[key]
    reason = refusal(target)
    if reason:
        raise ValueError(reason)
    static = StaticQwen3(target, max_len, tuple(hidden_layers), forced_routing, rows, native)
    if static.native:  # one native call a step, whatever its block size: nothing to compile
        compact_step, steps = static.native_compact, dict.fromkeys(range(1, gamma + 1), static.native_step)
    else:
        compact_step = compile_method(static, StaticQwen3.compact) if gamma > 1 else None  # AR accepts its token
        steps = {}
    prepared = CompiledTarget(target, static, steps, gamma, max_len, tuple(hidden_layers), compact_step, rows=rows)
    t0 = time.perf_counter()
    with torch.inference_mode():
        if not static.native:
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
