"""The EAGLE-3 head's draft steps with a KV cache allocated once and two fixed step shapes: one native call each on
the CPU (`StaticEagle3.native_draft_step`, kernels/eagle3_step.cpp), tensor code compiled by inductor elsewhere.

    drafter = prepare_drafter(Eagle3Drafter(head, ...), gamma=6, depth=3, topk=2, max_len=512)
    ecospec.generate(target, ids, drafter=drafter, engine=prepared_target)    # engine="compiled" does this itself

`CompiledEagle3` is a `Drafter` (batch 1) with the eager drafter's results, whose head passes run in two steps:
`begin` over the m <= γ tokens a step accepted (a block of γ entries, the rest masked dummies) and one tree level
(top-k nodes: every level of `grow_tree`'s beam has that many). Each graph ends in the draft distribution's top-k,
so the host reads k log-probabilities and ids per pass. The committed entries sit at cache slots = positions, a
step's tree levels in a window of slots right after them (overwritten by the next step), the head's outputs at the
root and at every tree node in a buffer `node_out`, read by the next level inside the graph. The first `begin` (the
prompt) and any other shape run the same code uncompiled. Weights are taken when prepared (q, k and v stacked):
a head trained further is prepared again (the key holds the weights' versions).
"""

from __future__ import annotations

import time

import torch
import torch.nn.functional as F
from torch import nn

from ecospec.drafters.eagle3 import Eagle3Drafter
from ecospec.engine.graphs import compile_method, prepared_on, visible_slots, weights_key
from ecospec.engine.norm import rms_norm
from ecospec.engine.per_row import PerRow
from ecospec.engine.rows import moved
from ecospec.engine.tree import DraftTree, missing_levels

# A begin of up to this many γ blocks (the tokens of steps that drafted nothing) runs γ at a time through the native
# step rather than once through the uncompiled tensor code, which costs more below it (docs/engine.md).
CATCH_UP = 8


def head_is_native(drafter) -> bool:
    """Whether the native head (kernels/eagle3_step.cpp) can run `drafter`'s EAGLE-3 head: float32 or float64 on the
    CPU, a SiLU MLP, every weight (and the embedding) in the head's dtype."""
    head = drafter.head
    dtype = head.dtype
    return (
        head.device.type == "cpu"
        and dtype in (torch.float32, torch.float64)
        and head.config.hidden_act == "silu"
        and all(t.dtype == dtype for name, t in head.named_parameters() if not name.endswith("d2t"))
        and drafter.embed.weight.dtype == dtype
    )


def _weights(drafter) -> dict:
    """The head's weights as the static step reads them (q/k/v and gate/up stacked: copies, made once per head and
    version and shared by every prepared copy, `engine.per_row`)."""
    head, embed = drafter.head, drafter.embed.weight
    key = ("eagle3_weights", weights_key(head))
    cache = prepared_on(drafter)
    if key not in cache:
        layer = head.midlayer
        attn, mlp = layer.self_attn, layer.mlp
        with torch.no_grad():
            cache[key] = {
                "fc": head.fc.weight,
                "qkv": torch.cat([attn.q_proj.weight, attn.k_proj.weight, attn.v_proj.weight]),
                "o": attn.o_proj.weight,
                "gate_up": torch.cat([mlp.gate_proj.weight, mlp.up_proj.weight]),
                "down": mlp.down_proj.weight,
                "hidden_norm": layer.hidden_norm.weight,
                "input_ln": layer.input_layernorm.weight,
                "post_ln": layer.post_attention_layernorm.weight,
                "norm": head.norm.weight,
                "lm_head": head.lm_head.weight,
                "d2t": head.d2t,
                "embed": embed.to(device=head.device) if embed.device != head.device else embed,
            }
    return cache[key]


class StaticEagle3(nn.Module):
    """An `Eagle3Head` over a static KV cache [kv heads, slots, head dim]: `begin_step` and `level_step` (below)."""

    def __init__(self, drafter, max_len: int, window: int, topk: int, native: bool | None = None):
        super().__init__()
        head = drafter.head
        c, layer = head.config, head.midlayer
        attn, mlp = layer.self_attn, layer.mlp
        dev, dtype = head.device, head.dtype
        self.nq, self.nk, self.d = c.num_attention_heads, c.num_key_value_heads, c.head_dim
        self.eps, self.topk, self.norm_before_residual = c.rms_norm_eps, topk, c.norm_before_residual
        self.act = F.silu if c.hidden_act == "silu" else mlp.act
        self.mapped = c.draft_vocab_size != c.vocab_size or bool(head.d2t.any())
        self.register_buffer(
            "k_cache", torch.zeros(self.nk, max_len, self.d, dtype=dtype, device=dev), persistent=False
        )
        self.register_buffer("v_cache", torch.zeros_like(self.k_cache), persistent=False)
        self.register_buffer(
            "node_out", torch.zeros(1 + window, c.hidden_size, dtype=dtype, device=dev), persistent=False
        )
        self.register_buffer("slot_ids", torch.arange(max_len, device=dev), persistent=False)
        cos, sin = attn._cos_sin(torch.arange(max_len, device=dev), dtype)  # the eager head's own RoPE table
        self.register_buffer("cos", cos, persistent=False)
        self.register_buffer("sin", sin, persistent=False)
        self.w = _weights(drafter)
        self.input_norm = None if head.input_norm is None else head.input_norm.weight
        self.qk_norm = None if attn.q_norm is None else (attn.q_norm.weight, attn.k_norm.weight)
        here = head_is_native(drafter)
        if native and not here:
            raise ValueError("the native EAGLE-3 head runs a SiLU head in float32 or float64 on the CPU")
        self.native = here if native is None else native
        self.handle = self._native_setup() if self.native else None

    def _native_setup(self) -> int:
        """Hand the weights, cache, node buffer and rotary tables to the native head once (kernels/eagle3_step.cpp,
        `W`); freed with this object."""
        import weakref

        from ecospec.engine.static_qwen3 import cpu_kernels

        cpu_kernels()
        w, empty = self.w, self.k_cache.new_empty(0)
        q_norm, k_norm = self.qk_norm or (empty, empty)
        names = ("fc", "qkv", "o", "gate_up", "down", "hidden_norm", "input_ln", "post_ln", "norm", "lm_head", "d2t")
        tensors = [w[name].contiguous() for name in names] + [w["embed"].contiguous()]
        tensors += [empty if self.input_norm is None else self.input_norm, q_norm, k_norm, self.cos, self.sin]
        dims = [self.nq, self.nk, self.d, self.topk, int(bool(self.norm_before_residual)), int(self.mapped)]
        handle = torch.ops.ecospec.eagle3_native_setup(
            [t.contiguous() for t in tensors], self.k_cache, self.v_cache, self.node_out, dims, float(self.eps)
        )
        weakref.finalize(self, torch.ops.ecospec.eagle3_native_free, handle)
        return handle

    def native_draft_step(self, feats, tokens, pos, start, block, pick, temperatures, depth: int):
        """`draft_step` in one native call (kernels/eagle3_step.cpp): the same arithmetic, without a graph around it."""
        return torch.ops.ecospec.eagle3_native_draft(
            self.handle, feats, tokens, pos, start, block, pick, temperatures, depth
        )

    def native_level_step(self, parents, tokens, pos, slots, start, block, rows, temperature):
        """`level_step` in one native call."""
        return torch.ops.ecospec.eagle3_native_level(
            self.handle, parents, tokens, pos, slots, start, block, rows, temperature
        )

    def _layer(self, hidden, tokens, pos, slots, visible):
        """The decoder layer over a block (hidden, tokens [q]), its keys written at `slots`, `visible` [q, slots]."""
        w, q, d, nq, nk = self.w, tokens.shape[0], self.d, self.nq, self.nk
        embeds = F.embedding(tokens, w["embed"]).to(hidden.dtype)
        normed = rms_norm(hidden, w["hidden_norm"], self.eps)
        residual = normed if self.norm_before_residual else hidden
        x = torch.cat([rms_norm(embeds, w["input_ln"], self.eps), normed], dim=-1)
        heads = F.linear(x, w["qkv"]).view(q, nq + 2 * nk, d).transpose(0, 1)  # [heads, q, d]
        qk, vs = heads[: nq + nk], heads[nq + nk :]
        if self.qk_norm is not None:
            qk = torch.cat([rms_norm(qk[:nq], self.qk_norm[0], self.eps), rms_norm(qk[nq:], self.qk_norm[1], self.eps)])
        qk = qk * self.cos[pos] + qk.roll(d // 2, dims=-1) * self.sin[pos]
        self.k_cache.index_copy_(1, slots, qk[nq:])
        self.v_cache.index_copy_(1, slots, vs)
        mask = torch.zeros(visible.shape, dtype=x.dtype, device=x.device)
        mask = mask.masked_fill(~visible, torch.finfo(x.dtype).min)
        out = F.scaled_dot_product_attention(
            qk[None, :nq],
            self.k_cache[None],
            self.v_cache[None],
            attn_mask=mask[None, None],
            scale=d**-0.5,
            enable_gqa=True,
        )
        h = residual + F.linear(out[0].transpose(0, 1).reshape(q, nq * d), w["o"])
        gate, up = F.linear(rms_norm(h, w["post_ln"], self.eps), w["gate_up"]).chunk(2, dim=-1)
        return h + F.linear(self.act(gate) * up, w["down"])

    def _children(self, out, temperature):
        """Top-k of the draft distribution at head outputs `out` [r, H]: (log-probs, target ids [r, k], logits)."""
        logits = F.linear(rms_norm(out, self.w["norm"], self.eps), self.w["lm_head"])
        if logits.dtype not in (torch.float32, torch.float64):
            logits = logits.float()
        logits = logits / temperature
        vals, ids = torch.topk(torch.log_softmax(logits, dim=-1), self.topk, dim=-1)
        return vals, (ids + self.w["d2t"][ids] if self.mapped else ids), logits

    def begin_step(self, feats, tokens, pos, start, block, pick, temperature):
        """Entries for target features `feats` [q, F] paired with `tokens` [q] at slots = positions `pos`, after
        `start` committed ones (`block` [q, W] their causal window); the root is row `pick` [1]."""
        hidden = feats if self.input_norm is None else rms_norm(feats, self.input_norm, self.eps)
        out = self._layer(F.linear(hidden, self.w["fc"]), tokens, pos, pos, visible_slots(self.slot_ids, start, block))
        root = out.index_select(0, pick)
        self.node_out[:1] = root
        return self._children(root, temperature)

    def level_step(self, parents, tokens, pos, slots, start, block, rows, temperature):
        """One tree level: nodes whose parents' outputs are node_out[parents], written to node_out[rows]."""
        out = self._layer(
            self.node_out.index_select(0, parents), tokens, pos, slots, visible_slots(self.slot_ids, start, block)
        )
        self.node_out.index_copy_(0, rows, out)
        return self._children(out, temperature)

    def draft_step(self, feats, tokens, pos, start, block, pick, temperatures, depth: int):
        """`begin_step`, then the tree's further levels the way `grow_tree` grows them, in one graph: level L's beam
        (k nodes) runs the layer; the next beam is the k most probable of its k^2 children by cumulative draft
        probability (float64, ties to the smaller index, as `tree._add_level`). Returns every level's log-probs
        and ids flat ([k] for the root's children, then [k, k] a level), the beams chosen ([depth - 2, k], as
        child indices b * k + c of their level) and every level's logits."""
        k = self.topk
        vals, ids, logits = self.begin_step(feats, tokens, pos, start, block, pick, temperatures[0])
        n = start + pick[0] + 1  # committed entries after this begin
        here = torch.arange(k, device=feats.device)
        all_vals, all_ids, all_logits, beams = [vals[0]], [ids[0]], [logits], []
        beam_tokens, beam_rows, beam_prob = ids[0], torch.zeros_like(here), vals[0].double().exp()
        beam_block = torch.zeros(k, block.shape[1], dtype=torch.bool, device=feats.device)
        for level in range(1, depth):
            slots = (level - 1) * k + here  # the level's slots in the window
            beam_block = beam_block.scatter(1, slots[:, None], True)
            v, i, lg = self.level_step(
                beam_rows,
                beam_tokens,
                (n - 1 + level).expand(k),
                n + slots,
                n,
                beam_block,
                1 + slots,
                temperatures[level],
            )
            all_vals.append(v.flatten())
            all_ids.append(i.flatten())
            all_logits.append(lg)
            if level == depth - 1:
                break
            probs = (beam_prob[:, None] * v.double().exp()).flatten()
            order = torch.sort(probs, descending=True, stable=True).indices[:k]
            beams.append(order)
            parent = order // k
            beam_tokens, beam_rows, beam_prob = i.flatten()[order], 1 + slots[parent], probs[order]
            beam_block = beam_block[parent]
        beams = torch.stack(beams) if beams else torch.zeros(0, k, dtype=torch.long, device=feats.device)
        return torch.cat(all_vals), torch.cat(all_ids), beams, torch.cat(all_logits)


class CompiledEagle3:
    """An `Eagle3Drafter` whose head passes run compiled (the module docstring); batch size 1."""

    kind = "eagle3"  # the drafter kind it drafts as (method.drafter; engine.scope)

    def __init__(
        self,
        drafter,
        *,
        gamma: int,
        depth: int,
        topk: int,
        max_len: int,
        depths: tuple[int, ...] = (),
        native: bool | None = None,
    ):
        head = drafter.head
        if getattr(drafter.embed, "weight", None) is None:
            raise ValueError("engine=compiled needs the EAGLE-3 drafter's embedding as a module with a weight")
        self.drafter, self.gamma, self.topk = drafter, gamma, topk
        self.vocab_size, self.hidden_layers = drafter.vocab_size, drafter.hidden_layers
        self.window = max(gamma, (depth - 1) * topk)  # a begin block, or the head's tree levels
        self.max_len = max_len
        self.static = StaticEagle3(drafter, max_len + self.window, self.window, topk, native)
        dev = head.device
        g, w, k = gamma, self.window, topk
        self._feats = torch.zeros(g, head.config.feature_size, dtype=head.dtype, device=dev)
        self._tokens = torch.zeros(g, dtype=torch.long, device=dev)
        self._pos = torch.zeros(g, dtype=torch.long, device=dev)
        self._arange = torch.arange(g, device=dev)
        self._start = torch.zeros((), dtype=torch.long, device=dev)
        causal = torch.ones(g, g, dtype=torch.bool, device=dev).tril()
        self._begin_block, self._pick = {}, {}
        for m in range(1, g + 1):  # m real entries causal, then dummies that see themselves
            blk = torch.zeros(g, w, dtype=torch.bool, device=dev)
            eye = torch.eye(g, dtype=torch.bool, device=dev)
            blk[:, :g] = torch.where(torch.arange(g, device=dev)[:, None] < m, causal, eye)
            self._begin_block[m], self._pick[m] = blk, torch.tensor([m - 1], device=dev)
        names = ("parents", "tokens", "pos", "slots", "rows")
        self._lv = {name: torch.zeros(k, dtype=torch.long, device=dev) for name in names}
        self._lv_block = torch.zeros(k, w, dtype=torch.bool, device=dev)
        self._temps: dict[int, torch.Tensor] = {}
        self.depth = depth
        self.depths = tuple(sorted({depth, *(d for d in depths if 1 <= d <= depth)}))  # one draft graph each
        self.levels = {"drafted": 0, "one_by_one": 0}  # tree levels served by draft_step / run one by one
        self._temperatures = torch.stack([self._temperature(d) for d in range(1, depth + 1)])
        if self.static.native:  # one native call a step: nothing to compile
            self.draft_c, self.level_c = self.static.native_draft_step, self.static.native_level_step
        else:
            self.draft_c = compile_method(self.static, StaticEagle3.draft_step)
            self.level_c = compile_method(self.static, StaticEagle3.level_step)
        t0 = time.perf_counter()
        with torch.inference_mode():  # one call per shape compiles it (from disk when inductor's cache has it)
            for d in self.depths:
                self.draft_c(
                    self._feats,
                    self._tokens,
                    self._pos,
                    self._start,
                    self._begin_block[1],
                    self._pick[1],
                    self._temperatures,
                    d,
                )
            self.level_c(
                self._lv["parents"],
                self._lv["tokens"],
                self._lv["pos"],
                self._lv["slots"],
                self._start,
                self._lv_block,
                self._lv["rows"],
                self._temperature(1),
            )
        self.compile_s = time.perf_counter() - t0
        self.reset()

    @property
    def logits_log(self):
        return self.drafter.logits_log

    def _temperature(self, depth: int) -> torch.Tensor:
        """The eager drafter's draft temperature at `depth`, as a 0-d tensor made once (a graph input, not a
        constant: one graph serves every depth)."""
        if depth not in self._temps:
            t = self.drafter.temperature
            t = t if isinstance(t, float | int) else t[min(depth, len(t)) - 1]
            self._temps[depth] = torch.tensor(
                float(t),
                dtype=torch.float64 if self._feats.dtype == torch.float64 else torch.float32,
                device=self._feats.device,
            )
        return self._temps[depth]

    def reset(self, rows: int = 1) -> None:
        if rows != 1:
            raise ValueError("engine=compiled drafts one sequence at a time (batch size 1)")
        self.length = 0  # committed entries (slots 0 .. length-1, at their positions)
        self._tree: DraftTree | None = None
        self._node_row: dict[int, int] = {}  # tree node -> its row of node_out (1 + its slot in the window)
        self._drafted: tuple | None = None  # this step's levels from `draft_step`, until the tree departs from them

    def _log(self, logits: torch.Tensor) -> None:
        if self.drafter.logits_log is not None:
            self.drafter.logits_log.append(logits)

    @torch.no_grad()
    def begin(self, new_tokens: torch.Tensor, new_hidden: torch.Tensor | None, topk: int, depth: int | None = None):
        """The root's children; the tree's levels up to `depth` (this step's; the prepared depth when None) are
        drafted ahead in the same graph (the smallest prepared depth that covers it)."""
        if new_hidden is None or new_hidden.dim() != 3 or new_hidden.shape[0] != 1:
            raise ValueError("begin expects new_hidden [1, m', F] (the target's features; batch size 1)")
        if topk != self.topk:
            raise ValueError(f"the compiled drafter was prepared for topk {self.topk}, got {topk}")
        m, n = new_hidden.shape[1], self.length
        if n + max(m, self.gamma) + self.window > self.static.k_cache.shape[1]:
            raise ValueError(f"the sequence needs more than the {self.max_len} slots the drafter was prepared for")
        dev, dt = self._feats.device, self._feats.dtype
        tokens = moved(new_tokens[0, new_tokens.shape[1] - m :], dev)
        if self.static.native and self.gamma < m <= CATCH_UP * self.gamma:  # a few steps' tokens it has not seen
            g = self.gamma
            for lo in range(0, (m - 1) // g * g, g):  # γ at a time through the native step, the last block below
                self._catch_up(tokens[lo : lo + g], new_hidden[0, lo : lo + g])
            rest = (m - 1) // g * g
            tokens, new_hidden, m, n = tokens[rest:], new_hidden[:, rest:], m - rest, self.length
        if m <= self.gamma:
            ahead = self._ahead(depth)
            vals, ids, beams, logits = self._draft_block(tokens, new_hidden[0], ahead)
            k = self.topk
            self._drafted = (vals, ids, beams.tolist(), logits, ahead)
            vals, ids, logits = vals[None, :k], ids[None, :k], logits[:1]
        else:  # the prompt: the same step uncompiled
            causal = torch.ones(m, m, dtype=torch.bool, device=dev).tril()
            vals, ids, logits = self.static.begin_step(
                moved(new_hidden[0], dev, dt),
                tokens,
                torch.arange(n, n + m, device=dev),
                torch.tensor(n, device=dev),
                causal,
                torch.tensor([m - 1], device=dev),
                self._temperature(1),
            )
            self._drafted = None
        self._log(logits)
        self.length = n + m
        self._tree, self._node_row = None, {}
        return vals[0], ids[0]

    def _draft_block(self, tokens: torch.Tensor, hidden: torch.Tensor, depth: int):
        """One draft step over a block of m <= γ committed entries after the `length` cached ones, drafting `depth`
        levels ahead: (vals, ids, beams, logits) of `draft_step`."""
        m, n = len(tokens), self.length
        self._feats[:m] = hidden
        self._tokens[:m] = tokens
        torch.add(self._arange, n, out=self._pos)
        self._start.fill_(n)
        block, pick = self._begin_block[m], self._pick[m]
        return self.draft_c(self._feats, self._tokens, self._pos, self._start, block, pick, self._temperatures, depth)

    def _catch_up(self, tokens: torch.Tensor, hidden: torch.Tensor) -> None:
        """γ committed entries into the cache through one native draft step (its draft is not used)."""
        self._draft_block(tokens, hidden, 1)
        self.length += self.gamma

    def begin_rows(self, new_tokens: list[torch.Tensor], new_hidden: list[torch.Tensor] | None, topk: int, depth=None):
        """`begin` in the decode loop's row form (one row: the compiled drafter drafts one sequence)."""
        if len(new_tokens) != 1:
            raise ValueError(f"engine=compiled drafts one sequence at a time, got {len(new_tokens)}")
        vals, ids = self.begin(new_tokens[0][None], None if new_hidden is None else new_hidden[0][None], topk, depth)
        return vals[None], ids[None]

    def expand_rows(self, trees: list[DraftTree], beams: list[list[int]], topk: int | None = None):
        vals, ids = self.expand(trees[0], beams[0], topk)
        return vals[None], ids[None]

    def keep_rows(self, keep: list[int]) -> None:
        if list(keep) != [0]:
            raise ValueError("engine=compiled drafts one sequence at a time (batch size 1)")

    def _ahead(self, depth: int | None) -> int:
        return next((d for d in self.depths if depth is not None and d >= depth), self.depth)

    @torch.no_grad()
    def expand(self, tree: DraftTree, beam: list[int], topk: int | None = None):
        k = self.topk if topk is None else topk
        if k != self.topk:
            raise ValueError(f"the compiled drafter was prepared for topk {self.topk}, got {k}")
        if tree is not self._tree:
            if self._tree is not None:
                self._drafted = None  # another tree than the one this step's levels were drafted for
            self._tree, self._node_row = tree, {}
        drafted = self._drafted_level(tree, beam)
        if drafted is not None:
            return drafted
        result = None
        for level in missing_levels(tree, beam, self._node_row):
            result = self._run_level(tree, level, compiled=len(level) == self.topk)
        if result is None or level != beam:  # children of nodes run before (not the usual growth): uncompiled
            rows = torch.tensor([self._node_row[b] for b in beam], device=self._start.device)
            result = self.static._children(self.static.node_out[rows], self._temperature(tree.depths[beam[0]] + 1))
        vals, ids, logits = result
        self._log(logits)
        return vals, ids

    def _drafted_level(self, tree: DraftTree, beam: list[int]):
        """The children of `beam` from this step's `draft_step`, when the tree grew as it did (else None, and the
        levels from here on run one by one: `draft_stop`, a near-tie the host's probabilities order otherwise)."""
        if self._drafted is None:
            return None
        vals, ids, beams, logits, ahead = self._drafted
        k, level = self.topk, tree.depths[beam[0]]
        expected = list(range(k)) if level == 1 else [k + (level - 2) * k * k + c for c in beams[level - 2]]
        if level >= ahead or beam != expected or any(tree.depths[b] != level for b in beam):
            self._drafted = None
            self._node_row = {i: r for i, r in self._node_row.items() if tree.depths[i] < level}
            return None
        for j, node in enumerate(beam):  # where draft_step left their outputs (the per-level path may read them)
            self._node_row[node] = 1 + (level - 1) * k + j
        self.levels["drafted"] += 1
        lo = k + (level - 1) * k * k
        self._log(logits[1 + (level - 1) * k : 1 + level * k])
        return vals[lo : lo + k * k].view(k, k), ids[lo : lo + k * k].view(k, k)

    def _run_level(self, tree: DraftTree, level: list[int], compiled: bool):
        """One head pass over the nodes `level` (all at one depth): their outputs go to node_out."""
        self.levels["one_by_one"] += 1
        first = len(self._node_row)
        if first + len(level) > self.window:
            raise ValueError(f"the compiled drafter's tree window holds {self.window} head entries a step")
        dev, n = self._start.device, self.length
        parents = [0 if tree.parents[i] < 0 else self._node_row[tree.parents[i]] for i in level]
        depth = tree.depths[level[0]]
        for j, i in enumerate(level):
            self._node_row[i] = 1 + first + j
        sees = [(j, self._node_row[a] - 1) for j, i in enumerate(level) for a in tree.path(i)]
        here = range(first, first + len(level))  # the level's slots in the window
        values = {
            "parents": parents,
            "tokens": [tree.tokens[i] for i in level],
            "pos": [n - 1 + depth] * len(level),
            "slots": [n + j for j in here],
            "rows": [1 + j for j in here],
        }
        if compiled:  # the level graph's buffers
            bufs, block, step = self._lv, self._lv_block.zero_(), self.level_c
            for name, vals in values.items():
                bufs[name].copy_(torch.tensor(vals))
        else:
            bufs = {name: torch.tensor(vals, device=dev) for name, vals in values.items()}
            block, step = torch.zeros(len(level), self.window, dtype=torch.bool, device=dev), self.static.level_step
        block[[a for a, _ in sees], [b for _, b in sees]] = True
        self._start.fill_(n)
        return step(
            bufs["parents"],
            bufs["tokens"],
            bufs["pos"],
            bufs["slots"],
            self._start,
            block,
            bufs["rows"],
            self._temperature(depth + 1),
        )


def prepare_drafter(
    drafter,
    *,
    gamma: int,
    depth: int,
    topk: int,
    max_len: int,
    depths: tuple[int, ...] = (),
    native: bool | None = None,
    rows: int = 1,
):
    """The compiled form of an `Eagle3Drafter` (prepared once per head, weights and shapes); any other drafter
    (a draft model: its own eager forward) and an already compiled one are returned as they are. `native`: None
    takes the native head where it runs (`head_is_native`), False compiles inductor's graphs. `rows` > 1: a
    `PerRow` of native copies, one a sequence; where the native head does not run, the eager drafter itself (its
    own batched passes)."""
    if not isinstance(drafter, Eagle3Drafter) or isinstance(drafter, CompiledEagle3 | PerRow):
        return drafter
    if rows > 1 and (native is False or not head_is_native(drafter)):
        return drafter
    head = drafter.head
    depths = tuple(sorted({depth, *(d for d in depths if 1 <= d <= depth)}))
    key = ("eagle3", gamma, depth, topk, max_len, head.dtype, weights_key(head), depths, native, rows)
    cache = prepared_on(drafter)
    if key not in cache:
        shape = {"gamma": gamma, "depth": depth, "topk": topk, "max_len": max_len, "depths": depths, "native": native}
        parts = [CompiledEagle3(drafter, **shape) for _ in range(rows)]
        cache[key] = parts[0] if rows == 1 else PerRow(parts)
    return cache[key]
