"""Qwen3-MoE's forward over a static KV cache, in two forms: one native call on the CPU, tensor code a compiler takes
elsewhere.

`StaticQwen3(target, max_len, hidden_layers)` shares the HF model's weights (no copy) and runs a block of q tokens
written at cache slots start .. start + q - 1, at positions `pos`, query i seeing every slot before `start` and the
block's slots its row of `tree` [q, q] marks.

- `native_step` (float32 and float64 on the CPU): the whole step in one C++ call (kernels/qwen3_step.cpp), the
  weights, caches and rotary tables handed over once when prepared. The compiled engine's target on the CPU: a
  graph of the same forward spent more time around its ops than in them, more so for a block of several tokens.
- `forward`: the same arithmetic in tensor ops, everything a step needs coming in as tensors, so that
  `torch.compile(dynamic=False)` makes a graph of one block size, or of every size whose inputs' q is marked
  dynamic: the engine's target on other devices (q = 1, the AR step, and one graph for q = 2 .. γ); the prefill
  runs it uncompiled everywhere.

The MoE layer keeps the paper's cost in both: the block's token-slots grouped by expert and each expert that has
slots multiplied by its weights once, never once per token (`ecospec::moe_experts` in a graph); every block size,
one token included, runs through it. Each MoE layer writes its top-k ids into `routes` [L_moe, max_len, k], a
buffer allocated once (routing capture without hooks). Layer for layer the arithmetic of transformers' Qwen3-MoE
modules.
"""

from __future__ import annotations

from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from ecospec.cache import cache_root, cpu_key
from ecospec.engine.graphs import visible_slots
from ecospec.models.adapters import moe_info

KERNELS = [
    Path(__file__).parent / "kernels" / name
    for name in ("moe_experts.cpp", "block_attention.cpp", "qwen3_step.cpp", "eagle3_step.cpp", "predictor_step.cpp")
]
# A layer's weights in the order the native step takes them (kernels/qwen3_step.cpp, `Slot`); absent ones empty.
NATIVE_SLOTS = ("ln1", "q", "k", "v", "o", "q_bias", "k_bias", "v_bias", "o_bias", "q_norm", "k_norm", "ln2")


def _rms(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    dtype = x.dtype
    x = x.float()
    x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)
    return weight * x.to(dtype)


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


_KERNEL: list = []  # the C++ kernels (`KERNELS`) once built, or the reason they could not be


def cpu_kernels():
    """The CPU kernels of the ops below, built once into `$ECOSPEC_CACHE/torch_extensions` (the first call compiles
    them) and loaded from there after; raises with the reason where they cannot be built (no C++ compiler, no
    ninja)."""
    if not _KERNEL:
        from torch.utils.cpp_extension import load

        where = cache_root() / "torch_extensions" / f"kernels-{cpu_key()}"  # -march=native: one build per CPU
        where.mkdir(parents=True, exist_ok=True)
        try:
            _KERNEL.append(
                load(
                    "ecospec_kernels",
                    [str(path) for path in KERNELS],
                    build_directory=str(where),
                    extra_cflags=["-O3", "-march=native", "-fopenmp-simd"],
                    is_python_module=False,  # the ops register through the dispatcher: ATen's headers, not torch's
                    verbose=False,
                )
            )
        except Exception as err:  # noqa: BLE001 - any build failure is reported as the reason
            _KERNEL.append(err)
    if isinstance(_KERNEL[0], Exception):
        raise RuntimeError(f"the compiled engine's CPU kernels could not be built: {_KERNEL[0]}")
    return _KERNEL[0]


torch.library.define(
    "ecospec::moe_experts", "(Tensor x, Tensor ids, Tensor weights, Tensor gate_up, Tensor down) -> Tensor"
)
# One MoE layer's routed SwiGLU experts: x [T, H], ids / weights [T, k], gate_up [N, 2I, H], down [N, H, I] -> [T, H].
# An opaque op for the compiler whose CPU kernel is C++ (`cpu_kernels()` registers it): it groups the token-slots
# by expert, runs each expert that has slots once (its weights read once, never once per token) and sums each
# token's weighted outputs in ascending expert order, as transformers' expert loop does. One op a layer, whatever the
# block size: a sorted-slot path written in ATen ops (argsort, scatter, cumsum, index_add) cost more than the
# experts' arithmetic, and the C++ wrapper calls the op through the dispatcher, with no trip through Python.


@torch.library.register_fake("ecospec::moe_experts")
def _(x, ids, weights, gate_up, down):
    return torch.empty_like(x)


def experts_in_tensor_ops(x, ids, weights, gate_up, down) -> torch.Tensor:
    """Any device without a kernel of its own (a GPU): the same experts in tensor ops, each token-slot reading
    its expert's weights (no host read of the routing, so a graph can be captured)."""
    gate, up = torch.einsum("th,tkoh->tko", x, gate_up[ids]).chunk(2, dim=-1)
    h = torch.einsum("tki,tkhi->tkh", F.silu(gate) * up, down[ids]) * weights[..., None]
    order = torch.argsort(ids, dim=-1)  # ascending experts, as the CPU kernel and transformers sum them
    return h.gather(1, order[..., None].expand_as(h)).sum(1).to(x.dtype)


torch.library.impl("ecospec::moe_experts", "CompositeExplicitAutograd")(experts_in_tensor_ops)


torch.library.define(
    "ecospec::block_attention",
    "(Tensor q, Tensor k_cache, Tensor v_cache, Tensor start, Tensor tree, float scale) -> Tensor",
)
# A batch of blocks' attention over a static cache: sequence b's q [Hq, Q, D] at slots start[b] .. start[b] + Q - 1
# of its caches [Hkv, S, D] (keys and values already written), query i seeing every slot before start[b] and the
# block's slots its row of tree[b] [Q, Q] marks; all batched: q [B, Hq, Q, D], caches [B, Hkv, S, D], start [B],
# tree [B, Q, Q] -> [B, Hq, Q, D]. The CPU kernel (C++) reads only the start + Q slots that hold keys; attention
# through a mask over the whole static cache scored every slot, empty ones included, for every query.


@torch.library.register_fake("ecospec::block_attention")
def _(q, k_cache, v_cache, start, tree, scale):
    return torch.empty_like(q, memory_format=torch.contiguous_format)


def attention_over_mask(q, k_cache, v_cache, start, tree, scale) -> torch.Tensor:
    """Any device without a kernel of its own (a GPU): attention over every cache slot through a mask of the
    visible ones, with no host read of `start`."""
    slot_ids = torch.arange(k_cache.shape[2], device=q.device)
    visible = visible_slots(slot_ids, start, tree)  # [B, Q, S]
    return F.scaled_dot_product_attention(
        q, k_cache, v_cache, attn_mask=visible[:, None], scale=scale, enable_gqa=q.shape[1] != k_cache.shape[1]
    )


torch.library.impl("ecospec::block_attention", "CompositeExplicitAutograd")(attention_over_mask)


class StaticQwen3(nn.Module):
    """A Qwen3-MoE target over a static KV cache for `rows` sequences. Buffers: `k_cache` / `v_cache`, one
    [rows, Hkv, max_len, D] tensor per layer, `routes` [L_moe, rows * max_len, k]. Call `forward(tokens [B, q],
    pos [B, q], start [B] long, tree [B, q, q] bool)` with B = rows: each sequence's block at its own slots, under its
    own tree; returns logits [B, q, V] and, when `hidden_layers` is set, the HF `hidden_states` at those indices
    concatenated [B, q, F]; its routes are `routes[:, : B * q]`, sequence-major. One sequence (rows 1) may also call
    it without the batch axis (tokens [q], pos [q], start [], tree [q, q]) and gets none back.

    Why a tensor per layer and one routes write at the end: a step that writes its rows into a slice of one
    stacked buffer and then reads it is functionalized by the compiler into a copy of the whole buffer per layer
    and a copy back at the end (O(cache) per step); a write into a
    whole graph input that nothing reads after it is done in place."""

    def __init__(
        self,
        target,
        max_len: int,
        hidden_layers: tuple[int, ...] = (),
        forced_routing: bool = False,
        rows: int = 1,
        native: bool | None = None,
    ):
        super().__init__()
        cfg = target.config
        info = moe_info(target)
        if info.family != "qwen3_moe":
            raise ValueError(f"the compiled engine supports Qwen3-MoE targets only, got {info.family}")
        if cfg.hidden_act != "silu":
            raise ValueError(f"the compiled engine's experts are SwiGLU, not hidden_act {cfg.hidden_act!r}")
        cpu_kernels()  # the ops' CPU kernels, registered before any step is traced
        model = target.model
        self.eps = cfg.rms_norm_eps
        self.n_heads, self.n_kv = cfg.num_attention_heads, cfg.num_key_value_heads
        self.head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
        self.top_k, self.norm_topk = cfg.num_experts_per_tok, cfg.norm_topk_prob
        self.hidden_layers = tuple(hidden_layers)
        self.num_layers = cfg.num_hidden_layers
        self.moe_index = {layer: j for j, layer in enumerate(info.moe_layers)}  # decoder layer -> routes row
        self.attention_scaling = float(model.rotary_emb.attention_scaling)
        self.register_buffer("inv_freq", model.rotary_emb.inv_freq.detach().clone(), persistent=False)
        dev, dtype = target.device, target.dtype
        self.rows = rows
        shape = (rows, self.n_kv, max_len, self.head_dim)
        self.k_cache = [torch.zeros(shape, dtype=dtype, device=dev) for _ in range(self.num_layers)]
        self.v_cache = [torch.zeros(shape, dtype=dtype, device=dev) for _ in range(self.num_layers)]
        routes = torch.zeros(len(info.moe_layers), rows * max_len, self.top_k, dtype=torch.long, device=dev)
        self.register_buffer("routes", routes, persistent=False)
        self.register_buffer("slot_ids", torch.arange(max_len, device=dev), persistent=False)
        # each sequence's row and each key-value head, as indices of a cache write [B, Hkv, q] (rows > 1)
        self.register_buffer("row_ids", torch.arange(rows, device=dev)[:, None, None], persistent=False)
        self.register_buffer("head_ids", torch.arange(self.n_kv, device=dev)[None, :, None], persistent=False)
        # benchmarks only (ecospec.bench.verify_compiled): the routers' top-k ids replaced by `forced_ids`
        self.forced_routing = forced_routing
        if forced_routing:
            self.register_buffer("forced_ids", torch.zeros_like(routes), persistent=False)
        self.max_len = max_len
        # every weight a step reads, in plain containers: the compiled step fetches its ~200 inputs from here, where
        # walking module attributes (target.model.layers[i].self_attn.q_proj.weight) made dynamo's per-call prologue
        # many times longer (docs/benchmarks.md)
        self.weights = [_layer_weights(layer) for layer in model.layers]
        self.head_weights = {
            "embed": model.embed_tokens.weight,
            "norm": model.norm.weight,
            "lm_head": target.lm_head.weight,
        }
        self.norm_eps = model.norm.variance_epsilon
        self.attn_scaling = model.layers[0].self_attn.scaling
        # the native step (`native_step`) where its kernel runs: float32 or float64 on the CPU
        native_here = dev.type == "cpu" and dtype in (torch.float32, torch.float64)
        if native and not native_here:
            raise ValueError(f"the native step runs float32 or float64 on the CPU, not {dtype} on {dev.type}")
        self.native = native_here if native is None else native
        self.handle = self._native_setup() if self.native else None

    def _native_setup(self) -> int:
        """Hand the weights, caches and rotary tables to the native step once; freed with this object."""
        import weakref

        empty = self.head_weights["embed"].new_empty(0)
        flat = []
        for w in self.weights:
            flat += [empty if w.get(name) is None else w[name].contiguous() for name in NATIVE_SLOTS]
            if "router" in w:
                flat += [w["router"].contiguous(), w["gate_up"].contiguous(), w["down"].contiguous()]
            else:  # a dense layer: its gate and up rows stacked, as one expert's
                flat += [empty, torch.cat([w["gate_proj"], w["up_proj"]]), w["down_proj"].contiguous()]
        freqs = torch.arange(self.max_len, device=self.inv_freq.device)[:, None].float() * self.inv_freq
        emb = torch.cat((freqs, freqs), dim=-1)
        dtype = self.head_weights["embed"].dtype
        cos, sin = [(f(emb) * self.attention_scaling).to(dtype) for f in (torch.cos, torch.sin)]
        head = [self.head_weights[n].contiguous() for n in ("embed", "norm", "lm_head")] + [cos, sin]
        eps = [w[name] for w in self.weights for name in ("ln1_eps", "ln2_eps", "q_eps", "k_eps")] + [self.norm_eps]
        moe_row = [self.moe_index.get(i, -1) for i in range(self.num_layers)]
        dims = [self.n_heads, self.n_kv, self.head_dim, self.top_k, int(bool(self.norm_topk))]
        forced = self.forced_ids if self.forced_routing else self.routes.new_empty(0)
        handle = torch.ops.ecospec.qwen3_native_setup(
            flat,
            self.k_cache,
            self.v_cache,
            self.routes,
            forced,
            head,
            moe_row,
            list(self.hidden_layers),
            [float(e) for e in eps],
            dims,
            float(self.attn_scaling),
        )
        weakref.finalize(self, torch.ops.ecospec.qwen3_native_free, handle)
        return handle

    def native_step(self, tokens, pos, start, tree):
        """`forward` for a batch ([B, q] tokens and positions, [B] starts, [B, q, q] trees) in one native call
        (kernels/qwen3_step.cpp): the same arithmetic, without a graph around it."""
        logits, feats = torch.ops.ecospec.qwen3_native_step(self.handle, tokens, pos, start, tree)
        return logits, feats if self.hidden_layers else None

    def native_compact(self, src, start) -> None:
        """`compact` in one native call."""
        torch.ops.ecospec.qwen3_native_compact(self.handle, src, start)

    def _attention(self, w: dict, i: int, x, cos, sin, slots, start, tree):
        b, q_len = x.shape[:2]
        heads = lambda name: F.linear(x, w[name], w[f"{name}_bias"]).view(b, q_len, -1, self.head_dim)  # noqa: E731
        q = _rms(heads("q"), w["q_norm"], w["q_eps"]).transpose(1, 2)
        k = _rms(heads("k"), w["k_norm"], w["k_eps"]).transpose(1, 2)
        v = heads("v").transpose(1, 2)
        q = q * cos + _rotate_half(q) * sin
        k = k * cos + _rotate_half(k) * sin
        k_cache, v_cache = self.k_cache[i], self.v_cache[i]
        self._write(k_cache, slots, k)
        self._write(v_cache, slots, v)
        out = torch.ops.ecospec.block_attention(q, k_cache, v_cache, start, tree, self.attn_scaling)
        return F.linear(out.transpose(1, 2).reshape(b, q_len, -1), w["o"], w["o_bias"])

    def _write(self, cache, slots, values) -> None:
        """values [B, Hkv, q, D] into `cache` at each sequence's slots [B, q]: one sequence's slots are one index
        along the slot axis (index_copy_); a batch's differ by row (index_put_ over rows, heads and slots)."""
        if self.rows == 1:
            cache.index_copy_(2, slots[0], values)
        else:
            cache.index_put_((self.row_ids, self.head_ids, slots[:, None, :]), values)

    def _read(self, cache, slots) -> torch.Tensor:
        """`cache` at each sequence's slots [B, q] -> [B, Hkv, q, D], the way `_write` writes them."""
        if self.rows == 1:
            return cache.index_select(2, slots[0])
        return cache[self.row_ids, self.head_ids, slots[:, None, :]]

    def _mlp(self, w: dict, moe_index: int | None, x, routes: list):
        if moe_index is None:
            return F.linear(F.silu(F.linear(x, w["gate_proj"])) * F.linear(x, w["up_proj"]), w["down_proj"])
        shape = x.shape
        x = x.reshape(-1, shape[-1])  # the batch's token-slots together: each expert's weights read once a pass
        probs = torch.softmax(F.linear(x, w["router"]), dim=-1, dtype=torch.float)
        if self.forced_routing:  # the router still runs; its choice is replaced, its weights read at the forced ids
            ids = self.forced_ids[moe_index, : x.shape[0]]
            top = probs.gather(1, ids)
        else:
            top, ids = torch.topk(probs, self.top_k, dim=-1)
        if self.norm_topk:
            top = top / top.sum(dim=-1, keepdim=True)
        routes.append(ids)
        return torch.ops.ecospec.moe_experts(x, ids, top.to(x.dtype), w["gate_up"], w["down"]).view(shape)

    def compact(self, src, start):
        """Each sequence's slots start[b] + src[b, j] of every layer's cache to start[b] + j ([B, γ] `src`: the
        accepted path, then identity; [B] `start`), gathered before written. One compiled call for all layers: a
        Python loop over 2L small copies cost several times more a step (docs/benchmarks.md, "The KV cache written
        in place")."""
        dst = start[:, None] + self.slot_ids[: src.shape[1]]
        for cache in (*self.k_cache, *self.v_cache):
            self._write(cache, dst, self._read(cache, start[:, None] + src))

    def forward(self, tokens, pos, start, tree):
        if tokens.dim() == 1:  # one sequence without the batch axis
            logits, feats = self.forward(tokens[None], pos[None], start[None], tree[None])
            return logits[0], None if feats is None else feats[0]
        head = self.head_weights
        b, q = tokens.shape
        slots = start[:, None] + self.slot_ids[:q]  # [B, q]
        x = F.embedding(tokens, head["embed"])
        freqs = pos[..., None].float() * self.inv_freq
        emb = torch.cat((freqs, freqs), dim=-1)
        cos = (emb.cos() * self.attention_scaling).to(x.dtype)[:, None]  # [B, 1, q, D]: every head alike
        sin = (emb.sin() * self.attention_scaling).to(x.dtype)[:, None]
        hidden = {0: x} if 0 in self.hidden_layers else {}
        routes = []  # each MoE layer's top-k ids [B * q, k], written to the routes buffer at once
        for i, w in enumerate(self.weights):
            h = _rms(x, w["ln1"], w["ln1_eps"])
            x = x + self._attention(w, i, h, cos, sin, slots, start, tree)
            h = _rms(x, w["ln2"], w["ln2_eps"])
            x = x + self._mlp(w, self.moe_index.get(i), h, routes)
            if i + 1 in self.hidden_layers and i + 1 < self.num_layers:
                hidden[i + 1] = x
        if routes:
            self.routes[:, : b * q] = torch.stack(routes)
        x = _rms(x, head["norm"], self.norm_eps)
        if self.num_layers in self.hidden_layers:
            hidden[self.num_layers] = x
        logits = F.linear(x, head["lm_head"])
        if not self.hidden_layers:
            return logits, None
        return logits, torch.cat([hidden[i] for i in self.hidden_layers], dim=-1)


def _layer_weights(layer) -> dict:
    """One decoder layer's weights (and norm epsilons) by name: shared with the HF module, never copied."""
    attn, mlp = layer.self_attn, layer.mlp
    w = {
        "ln1": layer.input_layernorm.weight,
        "ln1_eps": layer.input_layernorm.variance_epsilon,
        "ln2": layer.post_attention_layernorm.weight,
        "ln2_eps": layer.post_attention_layernorm.variance_epsilon,
        "q_norm": attn.q_norm.weight,
        "q_eps": attn.q_norm.variance_epsilon,
        "k_norm": attn.k_norm.weight,
        "k_eps": attn.k_norm.variance_epsilon,
    }
    for name in ("q", "k", "v", "o"):
        proj = getattr(attn, f"{name}_proj")
        w[name], w[f"{name}_bias"] = proj.weight, proj.bias
    if hasattr(mlp, "experts"):
        w.update(router=mlp.gate.weight, gate_up=mlp.experts.gate_up_proj, down=mlp.experts.down_proj)
    else:
        w.update(gate_proj=mlp.gate_proj.weight, up_proj=mlp.up_proj.weight, down_proj=mlp.down_proj.weight)
    return w
