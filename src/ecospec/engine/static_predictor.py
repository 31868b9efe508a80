"""The expert predictor's step with a KV cache allocated once and one fixed block shape: one native call on the CPU
(`StaticPredictor.native_step`, kernels/predictor_step.cpp), tensor code compiled by inductor elsewhere.

    predictor = prepare_predictor(ExpertPredictor.load(...), gamma=6, depth=3, topk=2, max_len=512)

`CompiledPredictor.predict` gives `ExpertPredictor.predict`'s expert bitmasks. Its one pass a step takes a block of
γ + (tree size) entries: the m <= γ tokens the step committed (causal behind the cached context; the rest of the γ
rows are dummies that see only themselves) and the draft tree's nodes (each sees the context, the new tokens, its
ancestors and itself; a smaller tree is padded with dummies). The graph ends in the bitmasks of each layer's top-k
experts of the root and the nodes, packed 32 bits to a word, so the host reads them once. The host writes the
step's inputs into two buffers through numpy (one torch op a step less per field: on this CPU the predictor's host
side cost as much as half its graph). The first call (the prompt) and any larger block run the same code
uncompiled. The weights are shared with the predictor (no copy, but the native pass's stacked gate and up rows: a
predictor trained further is prepared again, the key holding the weights' versions).
"""

from __future__ import annotations

import time

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from ecospec.engine.graphs import compile_method, prepared_on, visible_slots, weights_key
from ecospec.engine.norm import rms_norm
from ecospec.engine.per_row import PerRow
from ecospec.engine.routing import pack_bitmasks, unpack_bitmasks
from ecospec.engine.tree import DraftTree


def _layer_weights(layer) -> dict:
    a, mlp = layer.self_attn, layer.mlp
    w = {
        "ln1": layer.input_layernorm.weight,
        "ln1_eps": layer.input_layernorm.variance_epsilon,
        "ln2": layer.post_attention_layernorm.weight,
        "ln2_eps": layer.post_attention_layernorm.variance_epsilon,
        "act": mlp.act_fn,
        "scaling": a.scaling,
        "head_dim": a.head_dim,
        "q_norm": None,
    }
    for name in ("q", "k", "v", "o"):
        proj = getattr(a, f"{name}_proj")
        w[name], w[f"{name}_bias"] = proj.weight, proj.bias
    for name in ("gate_proj", "up_proj", "down_proj"):
        proj = getattr(mlp, name)
        w[name], w[f"{name}_bias"] = proj.weight, proj.bias
    if getattr(a, "q_norm", None) is not None:  # Qwen3: per-head RMSNorm before RoPE
        w.update(
            q_norm=a.q_norm.weight,
            q_eps=a.q_norm.variance_epsilon,
            k_norm=a.k_norm.weight,
            k_eps=a.k_norm.variance_epsilon,
        )
    return w


def predictor_is_native(predictor) -> bool:
    """Whether the native pass (kernels/predictor_step.cpp) can run `predictor`: a SiLU backbone in float32 or float64
    on the CPU."""
    here = predictor.device.type == "cpu" and predictor.dtype in (torch.float32, torch.float64)
    acts = (layer.mlp.act_fn for layer in predictor.backbone.layers)
    return here and all(isinstance(a, nn.SiLU) or type(a).__name__.startswith("SiLU") for a in acts)


class StaticPredictor(nn.Module):
    """The predictor's backbone over a static KV cache ([kv heads, slots, head dim] a layer; `forward` below)."""

    def __init__(self, predictor, max_len: int, native: bool | None = None):
        super().__init__()
        bb, c = predictor.backbone, predictor.config
        dev, dtype = predictor.device, predictor.dtype
        self.layers, self.experts, self.top_k = c.num_moe_layers, c.num_experts, c.top_k
        a = bb.layers[0].self_attn
        n_kv = bb.config.num_key_value_heads
        shape = (n_kv, max_len, a.head_dim)  # a tensor per layer: written in place (`StaticQwen3`'s docstring)
        self.k_cache = [torch.zeros(shape, dtype=dtype, device=dev) for _ in bb.layers]
        self.v_cache = [torch.zeros(shape, dtype=dtype, device=dev) for _ in bb.layers]
        self.register_buffer("slot_ids", torch.arange(max_len, device=dev), persistent=False)
        like = torch.zeros((), dtype=dtype, device=dev)
        with torch.no_grad():
            cos, sin = bb.rotary_emb(like, torch.arange(max_len, device=dev)[None])  # the eager path's RoPE table
        self.register_buffer("cos", cos[0], persistent=False)
        self.register_buffer("sin", sin[0], persistent=False)
        self.weights = [_layer_weights(layer) for layer in bb.layers]
        self.top = {
            "embed": predictor.embed.weight,
            "proj": predictor.proj.weight,
            "proj_bias": predictor.proj.bias,
            "norm": bb.norm.weight,
            "norm_eps": bb.norm.variance_epsilon,
            "head": predictor.head.weight,
            "head_bias": predictor.head.bias,
        }
        here = predictor_is_native(predictor)
        if native and not here:
            raise ValueError("the native predictor runs a SiLU backbone in float32 or float64 on the CPU")
        self.native = here if native is None else native
        self.handle = self._native_setup() if self.native else None

    def _native_setup(self) -> int:
        """Hand the weights, caches and rotary tables to the native predictor once (kernels/predictor_step.cpp,
        `Slot`, `Top`); freed with this object."""
        import weakref

        from ecospec.engine.static_qwen3 import cpu_kernels

        cpu_kernels()
        empty = self.cos.new_empty(0)

        def given(t):
            return empty if t is None else t.contiguous()

        def stacked(a, b):
            return empty if a is None else torch.cat([a, b])

        flat, eps = [], []
        for w in self.weights:
            flat += [given(w.get(name)) for name in ("ln1", "q", "k", "v", "o")]
            flat += [given(w.get(f"{name}_bias")) for name in ("q", "k", "v", "o")]
            flat += [given(w["q_norm"]), given(w.get("k_norm")), given(w["ln2"])]
            flat += [stacked(w["gate_proj"], w["up_proj"]), given(w["down_proj"])]
            flat += [stacked(w["gate_proj_bias"], w["up_proj_bias"]), given(w["down_proj_bias"])]
            eps += [w["ln1_eps"], w["ln2_eps"], w.get("q_eps", 0.0), w.get("k_eps", 0.0)]
        top = self.top
        tops = [given(top[n]) for n in ("embed", "proj", "proj_bias", "norm", "head", "head_bias")]
        a = self.weights[0]
        n_heads = a["q"].shape[0] // a["head_dim"]
        dims = [n_heads, self.k_cache[0].shape[0], a["head_dim"], self.layers, self.experts, self.top_k]
        handle = torch.ops.ecospec.predictor_native_setup(
            flat,
            self.k_cache,
            self.v_cache,
            [*tops, self.cos.contiguous(), self.sin.contiguous()],
            dims,
            [float(e) for e in [*eps, top["norm_eps"]]],
            float(a["scaling"]),
        )
        weakref.finalize(self, torch.ops.ecospec.predictor_native_free, handle)
        return handle

    def native_step(self, ints, block, pick):
        """`forward` in one native call (kernels/predictor_step.cpp): the same arithmetic, without a graph around it."""
        return torch.ops.ecospec.predictor_native_step(self.handle, ints, block, pick)

    def forward(self, ints, block, pick):
        """A block of tokens ints[0] [q] at positions ints[1] written at slots ints[2] (consecutive), seeing the
        slots before ints[2, 0] and those `block` [q, W] marks after it: the expert bitmasks of the rows `pick`,
        packed (`pack_bitmasks`)."""
        top = self.top
        tokens, pos, slots = ints
        h = F.linear(F.embedding(tokens, top["embed"]), top["proj"], top["proj_bias"])
        q = tokens.shape[0]
        mask = visible_slots(self.slot_ids, slots[0], block)[None, None]
        cos, sin = self.cos[pos], self.sin[pos]
        for i, w in enumerate(self.weights):
            x = rms_norm(h, w["ln1"], w["ln1_eps"], hf=True)
            heads = (q, -1, w["head_dim"])
            qs = F.linear(x, w["q"], w["q_bias"]).view(heads)
            ks = F.linear(x, w["k"], w["k_bias"]).view(heads)
            vs = F.linear(x, w["v"], w["v_bias"]).view(heads)
            if w["q_norm"] is not None:
                qs, ks = rms_norm(qs, w["q_norm"], w["q_eps"], hf=True), rms_norm(ks, w["k_norm"], w["k_eps"], hf=True)
            qs, ks, vs = qs.transpose(0, 1), ks.transpose(0, 1), vs.transpose(0, 1)
            half = w["head_dim"] // 2
            qs = qs * cos + torch.cat([-qs[..., half:], qs[..., :half]], -1) * sin
            ks = ks * cos + torch.cat([-ks[..., half:], ks[..., :half]], -1) * sin
            k_cache, v_cache = self.k_cache[i], self.v_cache[i]
            k_cache.index_copy_(1, slots, ks)
            v_cache.index_copy_(1, slots, vs)
            out = F.scaled_dot_product_attention(
                qs[None], k_cache[None], v_cache[None], attn_mask=mask, scale=w["scaling"], enable_gqa=True
            )
            h = h + F.linear(out[0].transpose(0, 1).reshape(q, -1), w["o"], w["o_bias"])
            x = rms_norm(h, w["ln2"], w["ln2_eps"], hf=True)
            gate = w["act"](F.linear(x, w["gate_proj"], w["gate_proj_bias"]))
            h = h + F.linear(gate * F.linear(x, w["up_proj"], w["up_proj_bias"]), w["down_proj"], w["down_proj_bias"])
        h = rms_norm(h.index_select(0, pick), top["norm"], top["norm_eps"], hf=True)
        logits = F.linear(h, top["head"], top["head_bias"]).unflatten(-1, (self.layers, self.experts))
        return pack_bitmasks(logits.topk(self.top_k, dim=-1).indices, self.experts)


class CompiledPredictor:
    """An `ExpertPredictor` whose decode pass runs compiled (the module docstring); batch size 1."""

    def __init__(self, predictor, *, gamma: int, depth: int, topk: int, max_len: int, native: bool | None = None):
        self.predictor, self.config, self.gamma = predictor, predictor.config, gamma
        self.nodes = topk + (depth - 1) * topk * topk  # `grow_tree`'s pool: k + (depth - 1) k^2
        self.width = gamma + self.nodes
        self.max_len = max_len
        self.static = StaticPredictor(predictor, max_len + self.width, native)
        dev = predictor.device
        g, w = gamma, self.width
        # the step's inputs, written on the host (numpy views) and copied once where the device is not the CPU
        self._host_ints, self._host_block = torch.zeros(3, w, dtype=torch.long), torch.zeros(w, w, dtype=torch.bool)
        self._ints, self._block = self._host_ints.to(dev), self._host_block.to(dev)
        self._np_ints, self._np_block = self._host_ints.numpy(), self._host_block.numpy()
        self._arange = np.arange(w)
        self._base, self._pick = {}, {}
        for m in range(1, g + 1):  # m new tokens causal, dummies seeing themselves; nodes see the new tokens
            base = np.eye(w, dtype=bool)
            base[:m, :m] = np.tri(m, dtype=bool)
            base[g:, :m] = True
            self._base[m] = base
            self._pick[m] = torch.tensor([m - 1, *range(g, w)], device=dev)
        self.step = (
            self.static.native_step if self.static.native else compile_method(self.static, StaticPredictor.forward)
        )
        t0 = time.perf_counter()
        with torch.inference_mode():
            self.step(self._ints, self._block, self._pick[1])
        self.compile_s = time.perf_counter() - t0
        self.reset()

    def reset(self, rows: int = 1) -> None:
        if rows != 1:
            raise ValueError("engine=compiled predicts for one sequence at a time (batch size 1)")
        self.length = 0  # committed tokens in the cache

    @torch.no_grad()
    def predict(self, new_tokens: torch.Tensor, tree: DraftTree) -> tuple[int, list[int]]:
        """`ExpertPredictor.predict`: expert bitmasks of the root (last of `new_tokens` [1, m]) and every node."""
        m, t, n, g = new_tokens.shape[1], len(tree), self.length, self.gamma
        if n + max(m + t, self.width) > self.static.k_cache[0].shape[1]:
            raise ValueError(f"the sequence needs more than the {self.max_len} slots the predictor was prepared for")
        dev = self._ints.device
        node_pos = [n + m - 1 + d for d in tree.depths]
        if m <= g and t <= self.nodes:  # the inputs written on the host (numpy: no torch op per field)
            ints, block = self._np_ints, self._np_block
            ints[0, :m] = new_tokens[0].tolist()
            np.add(self._arange, n, out=ints[2])
            ints[1, :g] = ints[2, :g]
            if t:
                ints[0, g : g + t] = tree.tokens
                ints[1, g : g + t] = node_pos
            np.copyto(block, self._base[m])
            sees = [(g + i, g + a) for i in range(t) for a in tree.path(i)[:-1]]
            if sees:
                block[[r for r, _ in sees], [c for _, c in sees]] = True
            if self._ints.device.type != "cpu":
                self._ints.copy_(self._host_ints, non_blocking=True)
                self._block.copy_(self._host_block, non_blocking=True)
            words = self.step(self._ints, self._block, self._pick[m])[: 1 + t]
        else:  # the prompt (or a larger block): the same pass uncompiled, new tokens then nodes
            q = m + t
            block = torch.ones(q, q, dtype=torch.bool, device=dev).tril()
            block[m:, m:] = False
            for i in range(t):
                block[m + i, [m + a for a in tree.path(i)]] = True
            tokens = torch.cat([new_tokens[0].to(dev), torch.tensor(tree.tokens, dtype=torch.long, device=dev)])
            pos = torch.tensor([n + j for j in range(m)] + node_pos, device=dev)
            pick = torch.tensor([m - 1, *range(m, q)], device=dev)
            words = self.static(torch.stack([tokens, pos, n + torch.arange(q, device=dev)]), block, pick)
        self.length = n + m
        masks = unpack_bitmasks(words)
        return masks[0], masks[1:]

    def predict_rows(self, new_tokens: list[torch.Tensor], trees: list[DraftTree]) -> tuple[list[int], list[list[int]]]:
        """`predict` in the decode loop's row form (one row: the compiled predictor runs one sequence)."""
        if len(new_tokens) != 1:
            raise ValueError(f"engine=compiled predicts for one sequence at a time, got {len(new_tokens)}")
        root, nodes = self.predict(new_tokens[0][None], trees[0])
        return [root], [nodes]

    def keep_rows(self, keep: list[int]) -> None:
        if list(keep) != [0]:
            raise ValueError("engine=compiled predicts for one sequence at a time (batch size 1)")


def prepare_predictor(
    predictor, *, gamma: int, depth: int, topk: int, max_len: int, native: bool | None = None, rows: int = 1
):
    """The compiled form of an `ExpertPredictor` (prepared once per predictor and shapes); None, "oracle" and an
    already compiled one are returned as they are. `native`: None takes the native pass where it runs (float32 or
    float64 on the CPU), False compiles inductor's graph. `rows` > 1: a `PerRow` of native copies, one a sequence;
    where the native pass does not run, the eager predictor itself (its own batched pass)."""
    if predictor is None or isinstance(predictor, str | CompiledPredictor | PerRow):
        return predictor
    if rows > 1 and (native is False or not predictor_is_native(predictor)):
        return predictor
    key = ("predictor", gamma, depth, topk, max_len, predictor.dtype, native, weights_key(predictor), rows)
    cache = prepared_on(predictor)
    if key not in cache:
        shape = {"gamma": gamma, "depth": depth, "topk": topk, "max_len": max_len, "native": native}
        parts = [CompiledPredictor(predictor, **shape) for _ in range(rows)]
        cache[key] = parts[0] if rows == 1 else PerRow(parts)
    return cache[key]
