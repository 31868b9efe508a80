"""EAGLE-3 draft head: model, tree drafter, and checkpoint loading/saving (two public layouts).

The head is one decoder layer fed with a fusion of target hidden states. At head position i the input
is (target feature at position i, embedding of token i+1) and the output predicts token i+2:

    x_i   = fc(concat of the target's hidden_states[l] for l in aux_hidden_layers, at position i)
    out_i = layer(hidden=x_i, embed=E[t_{i+1}])
    p(t_{i+2}) = softmax(lm_head(norm(out_i)))           (over the reduced draft vocabulary)

Inside the layer the attention input is concat(input_layernorm(embed), hidden_norm(hidden)) (2H wide);
the residual around attention is the raw hidden (or hidden_norm(hidden) when norm_before_residual).
During tree expansion a node's hidden input is the head's own output at its parent (fc is not applied
to it); only target features go through fc.

Position ids (documented choice). The EAGLE reference (SafeAILab/EAGLE, eagle/model/cnets.py,
`Model.topK_genrate`/`forward`) drops the first token, pairs hidden i with token i+1 and gives that entry
position id i (arange over the head's cache), and places the depth-d tree level at
`len_posi + d - 1`, i.e. (position of the root's entry) + d. ModelOpt's HF plugin does the same. The
`speculators` trainer (src/speculators/models/eagle3/core.py) instead uses `1 + arange`, i.e. the
position of token i+1. RoPE (default, linear, llama3, yarn: all static frequencies) makes attention
depend only on position differences, so the two conventions give the same outputs up to rounding; we
use EAGLE's: head entry i sits at position i (= the target position of h_i), and a tree node at depth d
sits at (root entry position + d). `test_eagle3.py::test_position_shift_invariance` checks the
equivalence.

Aux-layer ids. `Eagle3Config.aux_hidden_layers` always holds HF `output_hidden_states` indices
(0 = embedding output, l = output of decoder layer l-1 = input of decoder layer l); see
`aux_layers_from_config` for how each checkpoint convention is converted.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Literal

import torch
import torch.nn.functional as F
from torch import nn

from ecospec.engine.masks import visibility
from ecospec.engine.tree import DraftTree

__all__ = [
    "CheckpointError",
    "Eagle3Config",
    "Eagle3Head",
    "Eagle3Drafter",
    "KVCache",
    "aux_layers_from_config",
    "default_aux_hidden_layers",
    "init_random_weights",
    "load_eagle3",
    "save_eagle3",
]

SUPPORTED_ROPE_TYPES = ("default", "linear", "llama3", "yarn", "dynamic")


class CheckpointError(ValueError):
    """An EAGLE-3 checkpoint that cannot be loaded faithfully. Lists every offending key at once."""

    def __init__(
        self,
        message: str,
        missing: Sequence[str] = (),
        unexpected: Sequence[str] = (),
        misshaped: Sequence[str] = (),
    ):
        super().__init__(message)
        self.missing = list(missing)
        self.unexpected = list(unexpected)
        self.misshaped = list(misshaped)


def default_aux_hidden_layers(num_target_layers: int) -> tuple[int, int, int]:
    """EAGLE-3's default feature layers for an L-layer target, as HF hidden_states indices: (2, L//2, L-3)
    (SafeAILab/EAGLE modeling_llama_kv.py captures the inputs of decoder layers 2, L//2, L-3)."""
    n = int(num_target_layers)
    return (2, n // 2, n - 3)


@dataclass
class Eagle3Config:
    hidden_size: int
    intermediate_size: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int  # explicit; never derived from hidden_size / num_attention_heads here
    vocab_size: int  # target vocabulary
    draft_vocab_size: int
    target_hidden_size: int
    # HF `output_hidden_states` indices (0 = embedding output) of the target features, low -> high.
    # default_aux_hidden_layers(L) gives EAGLE-3's (2, L//2, L-3).
    aux_hidden_layers: tuple[int, ...]
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    # HF rope parameters without rope_theta, e.g. {"rope_type": "llama3", "factor": 8.0, ...}; None = default.
    rope_scaling: dict[str, Any] | None = None
    max_position_embeddings: int = 2048
    hidden_act: str = "silu"
    norm_before_residual: bool = False
    # RMSNorm over the concatenated target features before fc (`input_norm.weight`; gpt-oss heads).
    norm_before_fc: bool = False
    # Per-head RMSNorm of q and k before RoPE (`self_attn.{q,k}_norm.weight`; Qwen3-type layers).
    qk_norm: bool = False

    def __post_init__(self) -> None:
        self.aux_hidden_layers = tuple(int(i) for i in self.aux_hidden_layers)
        if not self.aux_hidden_layers:
            raise ValueError("aux_hidden_layers must name at least one target hidden-state index")
        if any(i < 0 for i in self.aux_hidden_layers):
            raise ValueError(f"aux_hidden_layers must be HF hidden_states indices >= 0, got {self.aux_hidden_layers}")
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError(
                f"num_attention_heads ({self.num_attention_heads}) must be a multiple of "
                f"num_key_value_heads ({self.num_key_value_heads})"
            )
        if self.head_dim % 2:
            raise ValueError(f"head_dim must be even for RoPE, got {self.head_dim}")
        if self.draft_vocab_size > self.vocab_size:
            raise ValueError(f"draft_vocab_size {self.draft_vocab_size} > vocab_size {self.vocab_size}")
        if self.rope_scaling is not None:
            rs = dict(self.rope_scaling)
            rs.pop("rope_theta", None)
            rtype = rs.get("rope_type", rs.get("type", "default"))
            rs["rope_type"] = rtype
            rs.pop("type", None)
            if rtype not in SUPPORTED_ROPE_TYPES:
                raise ValueError(f"unsupported rope type {rtype!r}; supported: {SUPPORTED_ROPE_TYPES}")
            self.rope_scaling = None if rtype == "default" else rs

    @property
    def feature_size(self) -> int:
        """Width of the concatenated target features the head takes (fc input)."""
        return len(self.aux_hidden_layers) * self.target_hidden_size

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["aux_hidden_layers"] = list(self.aux_hidden_layers)
        return d


# ----------------------------------------------------------------------------------------------------
# Model
# ----------------------------------------------------------------------------------------------------


class RMSNorm(nn.Module):
    def __init__(self, size: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        work = x if dtype == torch.float64 else x.float()
        work = work * torch.rsqrt(work.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * work.to(dtype)


def _rope_frequencies(config: Eagle3Config) -> tuple[torch.Tensor, float]:
    """(inv_freq [head_dim/2] float64, attention scaling) for the config's RoPE."""
    d = config.head_dim
    if config.rope_scaling is None:
        inv = 1.0 / (config.rope_theta ** (torch.arange(0, d, 2, dtype=torch.float64) / d))
        return inv, 1.0
    # Scaled variants: delegate to transformers' reference implementations (static frequencies).
    from transformers import AutoConfig
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    params = dict(config.rope_scaling)
    params["rope_theta"] = config.rope_theta
    hf = AutoConfig.for_model(
        "llama",
        hidden_size=config.num_attention_heads * d,
        num_attention_heads=config.num_attention_heads,
        head_dim=d,
        max_position_embeddings=config.max_position_embeddings,
        rope_parameters=params,
    )
    inv, scaling = ROPE_INIT_FUNCTIONS[params["rope_type"]](hf, None)
    return inv.to(torch.float64), float(scaling)


class KVCache:
    """The head's KV cache: key/value tensors [1, kv_heads, T, head_dim]; grows by append, shrinks by crop."""

    def __init__(self) -> None:
        self.k: torch.Tensor | None = None
        self.v: torch.Tensor | None = None

    def __len__(self) -> int:
        return 0 if self.k is None else self.k.shape[2]

    def append(self, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if self.k is None:
            self.k, self.v = k, v
        else:
            self.k = torch.cat([self.k, k], dim=2)
            self.v = torch.cat([self.v, v], dim=2)
        return self.k, self.v

    def crop(self, length: int) -> None:
        if self.k is not None and length < len(self):
            if length <= 0:
                self.k = self.v = None
            else:
                self.k = self.k[:, :, :length]
                self.v = self.v[:, :, :length]


class _Attention(nn.Module):
    def __init__(self, config: Eagle3Config):
        super().__init__()
        h, d = config.hidden_size, config.head_dim
        self.n_heads, self.n_kv, self.head_dim = config.num_attention_heads, config.num_key_value_heads, d
        self.q_proj = nn.Linear(2 * h, self.n_heads * d, bias=False)
        self.k_proj = nn.Linear(2 * h, self.n_kv * d, bias=False)
        self.v_proj = nn.Linear(2 * h, self.n_kv * d, bias=False)
        self.o_proj = nn.Linear(self.n_heads * d, h, bias=False)
        if config.qk_norm:
            self.q_norm = RMSNorm(d, config.rms_norm_eps)
            self.k_norm = RMSNorm(d, config.rms_norm_eps)
        else:
            self.q_norm = self.k_norm = None
        self.inv_freq, self.rope_scale = _rope_frequencies(config)  # plain tensors: never cast to bf16

    def _rotate(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        freqs = positions.to(torch.float64)[:, None] * self.inv_freq.to(positions.device)[None, :]
        emb = torch.cat([freqs, freqs], dim=-1)
        cos = (emb.cos() * self.rope_scale).to(x.dtype)
        sin = (emb.sin() * self.rope_scale).to(x.dtype)
        half = x.shape[-1] // 2
        rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
        return x * cos + rotated * sin

    def forward(
        self, x: torch.Tensor, positions: torch.Tensor, cache: KVCache | None, visible: torch.Tensor
    ) -> torch.Tensor:
        b, q, _ = x.shape
        qs = self.q_proj(x).view(b, q, self.n_heads, self.head_dim)
        ks = self.k_proj(x).view(b, q, self.n_kv, self.head_dim)
        vs = self.v_proj(x).view(b, q, self.n_kv, self.head_dim).transpose(1, 2)
        if self.q_norm is not None:
            qs, ks = self.q_norm(qs), self.k_norm(ks)
        qs = self._rotate(qs.transpose(1, 2), positions)
        ks = self._rotate(ks.transpose(1, 2), positions)
        if cache is not None:
            ks, vs = cache.append(ks, vs)
        out = F.scaled_dot_product_attention(
            qs, ks, vs, attn_mask=visible[None, None], scale=self.head_dim**-0.5, enable_gqa=True
        )
        return self.o_proj(out.transpose(1, 2).reshape(b, q, self.n_heads * self.head_dim))


class _MLP(nn.Module):
    def __init__(self, config: Eagle3Config):
        super().__init__()
        from transformers.activations import ACT2FN

        self.gate_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.up_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.down_proj = nn.Linear(config.intermediate_size, config.hidden_size, bias=False)
        self.act = ACT2FN[config.hidden_act]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(self.act(self.gate_proj(x)) * self.up_proj(x))


class _DecoderLayer(nn.Module):
    def __init__(self, config: Eagle3Config):
        super().__init__()
        self.norm_before_residual = config.norm_before_residual
        self.self_attn = _Attention(config)
        self.mlp = _MLP(config)
        self.hidden_norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)

    def forward(
        self,
        hidden: torch.Tensor,
        embeds: torch.Tensor,
        positions: torch.Tensor,
        cache: KVCache | None,
        visible: torch.Tensor,
    ) -> torch.Tensor:
        normed = self.hidden_norm(hidden)
        residual = normed if self.norm_before_residual else hidden
        x = torch.cat([self.input_layernorm(embeds), normed], dim=-1)
        h = residual + self.self_attn(x, positions, cache, visible)
        return h + self.mlp(self.post_attention_layernorm(h))


class Eagle3Head(nn.Module):
    """EAGLE-3 head. Parameter names follow the EAGLE layout (`midlayer.*`)."""

    def __init__(self, config: Eagle3Config, has_embed_tokens: bool = False):
        super().__init__()
        self.config = config
        c = config
        self.input_norm = RMSNorm(c.feature_size, c.rms_norm_eps) if c.norm_before_fc else None
        self.fc = nn.Linear(c.feature_size, c.hidden_size, bias=False)
        self.midlayer = _DecoderLayer(c)
        self.norm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.lm_head = nn.Linear(c.hidden_size, c.draft_vocab_size, bias=False)
        self.embed_tokens = nn.Embedding(c.vocab_size, c.hidden_size) if has_embed_tokens else None
        self.register_buffer("d2t", torch.zeros(c.draft_vocab_size, dtype=torch.int64))
        self.register_buffer("t2d", torch.zeros(c.vocab_size, dtype=torch.bool))
        with torch.no_grad():
            self.t2d[: c.draft_vocab_size] = True  # identity mapping until real tables are loaded

    @property
    def dtype(self) -> torch.dtype:
        return self.fc.weight.dtype

    @property
    def device(self) -> torch.device:
        return self.fc.weight.device

    def project(self, features: torch.Tensor) -> torch.Tensor:
        """Target features [.., len(aux)*target_hidden] -> head hidden [.., H] (input_norm?, then fc)."""
        if self.input_norm is not None:
            features = self.input_norm(features)
        return self.fc(features)

    def forward(
        self,
        hidden: torch.Tensor,
        embeds: torch.Tensor,
        positions: torch.Tensor,
        cache: KVCache | None = None,
        visible: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """One pass of the decoder layer. hidden, embeds [1, q, H] (hidden already projected or recurrent);
        positions [q]; the new keys are appended to `cache`; visible: bool [q, len(cache) + q] (None =
        causal over the cache and the new block). Returns the output hidden state [1, q, H] (pre-norm)."""
        q = hidden.shape[1]
        past = 0 if cache is None else len(cache)
        if visible is None:
            visible = visibility(past, torch.ones(q, q, dtype=torch.bool, device=hidden.device).tril())
        return self.midlayer(hidden, embeds, positions, cache, visible.to(hidden.device))

    def logits(self, out: torch.Tensor) -> torch.Tensor:
        """Draft-vocabulary logits from output hidden states."""
        return self.lm_head(self.norm(out))

    def to_target_ids(self, draft_ids: torch.Tensor) -> torch.Tensor:
        return draft_ids + self.d2t[draft_ids]


# ----------------------------------------------------------------------------------------------------
# Drafter
# ----------------------------------------------------------------------------------------------------


class Eagle3Drafter:
    """`Drafter` over an `Eagle3Head`. Keeps the head's KV cache of committed entries; tree entries appended
    by `expand` are dropped at the next `begin` (or when a different tree object is expanded)."""

    def __init__(
        self,
        head: Eagle3Head,
        target_embedding: nn.Module | Callable[[torch.Tensor], torch.Tensor] | None = None,
    ):
        if head.embed_tokens is None and target_embedding is None:
            raise ValueError("the head has no embed_tokens of its own: pass the target's input embedding")
        self.head = head
        self.embed = head.embed_tokens if head.embed_tokens is not None else target_embedding
        self.vocab_size = head.config.vocab_size
        self.hidden_layers = head.config.aux_hidden_layers
        self.reset()

    # -- state --------------------------------------------------------------------------------------

    def reset(self) -> None:
        self.cache = KVCache()
        self.committed = 0  # committed head entries (= target hidden states consumed)
        self._topk = 1
        self._root_out: torch.Tensor | None = None  # head output at the root's entry [H]
        self._drop_tree()

    def _drop_tree(self) -> None:
        self.cache.crop(self.committed)
        self._tree: DraftTree | None = None
        self._slot_node: list[int] = []  # cache slot committed + i holds tree node _slot_node[i]
        self._node_out: dict[int, torch.Tensor] = {}  # node -> head output hidden [H]

    # -- helpers ------------------------------------------------------------------------------------

    def _embed(self, ids: torch.Tensor) -> torch.Tensor:
        weight = getattr(self.embed, "weight", None)
        if isinstance(weight, torch.Tensor):
            ids = ids.to(weight.device)
        return self.embed(ids).to(device=self.head.device, dtype=self.head.dtype)

    def _topk_children(self, out: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
        logits = self.head.logits(out)
        if logits.dtype != torch.float64:
            logits = logits.float()
        logp = torch.log_softmax(logits, dim=-1)  # temperature 1
        vals, draft_ids = torch.topk(logp, k, dim=-1)
        return vals, self.head.to_target_ids(draft_ids)

    # -- protocol -----------------------------------------------------------------------------------

    @torch.no_grad()
    def begin(
        self, new_tokens: torch.Tensor, new_hidden: torch.Tensor | None, topk: int
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if new_hidden is None:
            raise ValueError("Eagle3Drafter needs the target's hidden states (hidden_layers is non-empty)")
        if new_tokens.dim() != 2 or new_tokens.shape[0] != 1 or new_hidden.dim() != 3 or new_hidden.shape[0] != 1:
            raise ValueError("begin expects new_tokens [1, m] and new_hidden [1, m', F] (batch size 1)")
        m, m_h = new_tokens.shape[1], new_hidden.shape[1]
        if not 1 <= m_h <= m:
            raise ValueError(f"need 1 <= m' <= m, got m={m}, m'={m_h}")
        if new_hidden.shape[-1] != self.head.config.feature_size:
            raise ValueError(
                f"new_hidden has width {new_hidden.shape[-1]}, expected {self.head.config.feature_size} "
                f"(hidden_states{list(self.hidden_layers)} concatenated)"
            )
        self._drop_tree()
        # new_hidden[:, j] (target position committed + j) is paired with the token that follows it.
        tokens = new_tokens[:, m - m_h :]
        dev, dt = self.head.device, self.head.dtype
        hidden = self.head.project(new_hidden.to(device=dev, dtype=dt))
        positions = torch.arange(self.committed, self.committed + m_h, device=dev)
        out = self.head(hidden, self._embed(tokens), positions, self.cache)
        self.committed += m_h
        self._topk = topk
        self._root_out = out[0, -1]
        logp, ids = self._topk_children(self._root_out[None], topk)
        return logp[0], ids[0]

    @torch.no_grad()
    def expand(self, tree: DraftTree, beam: list[int], topk: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        if self._root_out is None:
            raise RuntimeError("expand called before begin")
        k = self._topk if topk is None else topk
        if tree is not self._tree:
            self._drop_tree()
            self._tree = tree
        # Every ancestor of a beam node must be in the cache; run the missing ones level by level
        # (a node's hidden input is its parent's output, so one level per forward).
        needed = sorted({n for b in beam for n in tree.path(b)} - self._node_out.keys())
        by_depth: dict[int, list[int]] = {}
        for n in needed:
            by_depth.setdefault(tree.depths[n], []).append(n)
        for depth in sorted(by_depth):
            self._run_level(tree, by_depth[depth], depth)
        outs = torch.stack([self._node_out[b] for b in beam])
        return self._topk_children(outs, k)

    def _run_level(self, tree: DraftTree, nodes: list[int], depth: int) -> None:
        dev = self.head.device
        parents = [tree.parents[n] for n in nodes]
        hidden = torch.stack([self._root_out if p < 0 else self._node_out[p] for p in parents])[None]
        tokens = torch.tensor([[tree.tokens[n] for n in nodes]], device=dev)
        root_pos = self.committed - 1
        positions = torch.full((len(nodes),), root_pos + depth, device=dev)

        def ancestors(n: int) -> set[int]:
            return set(tree.path(n))  # includes n itself

        anc = [ancestors(n) for n in nodes]
        cached = torch.tensor([[s in a for s in self._slot_node] for a in anc], dtype=torch.bool).reshape(
            len(nodes), len(self._slot_node)
        )
        block = torch.tensor([[o in a for o in nodes] for a in anc], dtype=torch.bool)
        visible = visibility(self.committed, block, cached)
        out = self.head(hidden, self._embed(tokens), positions, self.cache, visible.to(dev))
        for i, n in enumerate(nodes):
            self._slot_node.append(n)
            self._node_out[n] = out[0, i]


# ----------------------------------------------------------------------------------------------------
# Checkpoints
# ----------------------------------------------------------------------------------------------------

# Keys some exporters add that carry nothing the head needs.
_IGNORABLE_SUFFIXES = ("rotary_emb.inv_freq", "verifier_norm.weight", "verifier_lm_head.weight")
_LAYER_PREFIX = {"eagle": "midlayer.", "speculators": "layers.0."}


def _expected_shapes(config: Eagle3Config) -> dict[str, tuple[int, ...]]:
    """Expected tensor names (EAGLE layout, `midlayer.*`) -> shapes, without the optional embed_tokens."""
    c = config
    h, d = c.hidden_size, c.head_dim
    shapes: dict[str, tuple[int, ...]] = {
        "fc.weight": (h, c.feature_size),
        "midlayer.self_attn.q_proj.weight": (c.num_attention_heads * d, 2 * h),
        "midlayer.self_attn.k_proj.weight": (c.num_key_value_heads * d, 2 * h),
        "midlayer.self_attn.v_proj.weight": (c.num_key_value_heads * d, 2 * h),
        "midlayer.self_attn.o_proj.weight": (h, c.num_attention_heads * d),
        "midlayer.mlp.gate_proj.weight": (c.intermediate_size, h),
        "midlayer.mlp.up_proj.weight": (c.intermediate_size, h),
        "midlayer.mlp.down_proj.weight": (h, c.intermediate_size),
        "midlayer.hidden_norm.weight": (h,),
        "midlayer.input_layernorm.weight": (h,),
        "midlayer.post_attention_layernorm.weight": (h,),
        "norm.weight": (h,),
        "lm_head.weight": (c.draft_vocab_size, h),
        "d2t": (c.draft_vocab_size,),
        "t2d": (c.vocab_size,),
    }
    if c.norm_before_fc:
        shapes["input_norm.weight"] = (c.feature_size,)
    if c.qk_norm:
        shapes["midlayer.self_attn.q_norm.weight"] = (d,)
        shapes["midlayer.self_attn.k_norm.weight"] = (d,)
    return shapes


def _to_layout(name: str, layout: str) -> str:
    return _LAYER_PREFIX[layout] + name[len("midlayer.") :] if name.startswith("midlayer.") else name


def _from_layout(name: str, layout: str) -> str:
    prefix = _LAYER_PREFIX[layout]
    return "midlayer." + name[len(prefix) :] if name.startswith(prefix) else name


def _read_tensors(path: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    single = path / "model.safetensors"
    if single.exists():
        return load_file(single)
    index = path / "model.safetensors.index.json"
    if index.exists():
        shards = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        out: dict[str, torch.Tensor] = {}
        for shard in shards:
            out.update(load_file(path / shard))
        return out
    binary = path / "pytorch_model.bin"
    if binary.exists():
        return torch.load(binary, map_location="cpu", weights_only=True)
    raise FileNotFoundError(f"{path}: no model.safetensors, model.safetensors.index.json or pytorch_model.bin")


def _detect_layout(cfg: Mapping[str, Any]) -> Literal["eagle", "speculators"]:
    kind = cfg.get("speculators_model_type")
    if kind is None:
        return "eagle"
    if kind != "eagle3":
        raise CheckpointError(f"speculators checkpoint of type {kind!r}, expected 'eagle3'")
    return "speculators"


def _num_layers(target_config: Any) -> int | None:
    if target_config is None:
        return None
    tc = target_config
    if isinstance(tc, Mapping):
        tc = tc.get("text_config") or tc
        n = tc.get("num_hidden_layers")
    else:
        tc = getattr(tc, "text_config", None) or tc
        n = getattr(tc, "num_hidden_layers", None)
    return None if n is None else int(n)


def _target_attr(target_config: Any, name: str) -> Any:
    if target_config is None:
        return None
    tc = target_config
    if isinstance(tc, Mapping):
        tc = tc.get("text_config") or tc
        return tc.get(name)
    tc = getattr(tc, "text_config", None) or tc
    return getattr(tc, name, None)


def aux_layers_from_config(cfg: Mapping[str, Any], num_target_layers: int | None = None) -> tuple[int, ...] | None:
    """HF hidden_states indices of the head's features, from a checkpoint config.json (None = not stated
    and no target layer count to derive the default from). Conventions, by where the ids live:

    * `ecospec_aux_hidden_layers` (written by `save_eagle3`): HF indices, taken as is.
    * top-level `eagle_aux_hidden_state_layer_ids` (speculators; also what vLLM reads): ids are hidden-state
      boundary indices = HF indices. vLLM captures the residual stream *entering* layer id (llama.py
      `if idx in self.aux_hidden_state_layers` before the layer call; newer models `_maybe_add_hidden_state`
      with idx + 1 after layer idx); speculators' `resolve_target_layer_ids` defaults to
      [2, L//2, L-3] and accepts id L (the final state). `null` = default.
    * nested `eagle_config.eagle_aux_hidden_state_layer_ids` (SpecForge, ModelOpt; read by SGLang): ids mean
      "output of decoder layer id" = HF index id + 1. SpecForge's HF backend hooks the *output* of
      layers [1, L//2-1, L-4] by default (= HF 2, L//2, L-3) and its sglang path calls
      `set_eagle3_layers_to_capture` which adds 1; ModelOpt's `_set_default_aux_hidden_state_layers`
      writes [1, L//2-1, L-4] and hooks layer outputs. SGLang (PR #25454) only adds 1 when the first id is
      1 and treats other lists as boundary indices (e.g. nvidia/gpt-oss-120b-Eagle3-v3's [24, 30, 36]);
      we follow that rule.
    * none of these (EAGLE repo heads, yuhuili/EAGLE3-*): the EAGLE default (2, L//2, L-3), which needs
      the target's layer count.
    """
    if cfg.get("ecospec_aux_hidden_layers") is not None:
        return tuple(int(i) for i in cfg["ecospec_aux_hidden_layers"])
    top = cfg.get("eagle_aux_hidden_state_layer_ids")
    if top:
        return tuple(int(i) for i in top)
    nested = (cfg.get("eagle_config") or {}).get("eagle_aux_hidden_state_layer_ids")
    if nested:
        ids = [int(i) for i in nested]
        if ids[0] == 1:
            return tuple(i + 1 for i in ids)
        return tuple(ids)
    return None if num_target_layers is None else default_aux_hidden_layers(num_target_layers)


def _layer_dict(cfg: Mapping[str, Any], layout: str) -> dict[str, Any]:
    """Llama-style layer config as a full dict (class defaults filled in by transformers)."""
    from transformers import AutoConfig
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    raw = dict(cfg["transformer_layer_config"]) if layout == "speculators" else dict(cfg)
    model_type = raw.pop("model_type", None) or "llama"
    if model_type not in CONFIG_MAPPING:
        model_type = "llama"
    keep = {
        k: v
        for k, v in raw.items()
        if k
        in {
            "hidden_size",
            "intermediate_size",
            "num_attention_heads",
            "num_key_value_heads",
            "head_dim",
            "rms_norm_eps",
            "rope_theta",
            "rope_scaling",
            "rope_parameters",
            "max_position_embeddings",
            "hidden_act",
            "vocab_size",
            "attention_bias",
            "mlp_bias",
        }
    }
    hf = AutoConfig.for_model(model_type, **keep)
    out = {
        k: getattr(hf, k, None)
        for k in (
            "hidden_size",
            "intermediate_size",
            "num_attention_heads",
            "num_key_value_heads",
            "head_dim",
            "rms_norm_eps",
            "max_position_embeddings",
            "hidden_act",
            "vocab_size",
        )
    }
    out["rope_parameters"] = dict(getattr(hf, "rope_parameters", None) or {})
    out["model_type"] = model_type
    out["attention_bias"] = bool(getattr(hf, "attention_bias", False))
    out["mlp_bias"] = bool(getattr(hf, "mlp_bias", False))
    return out


def _config_from_json(
    cfg: Mapping[str, Any], layout: str, target_config: Any, aux_hidden_layers: Sequence[int] | None
) -> Eagle3Config:
    layer = _layer_dict(cfg, layout)
    problems = []
    for flag in ("norm_output", "fc_norm"):
        if cfg.get(flag):
            problems.append(f"{flag}=true (EAGLE-3.1 variant) is not supported")
    if layer["attention_bias"] or layer["mlp_bias"]:
        problems.append("attention_bias/mlp_bias heads are not supported")
    if problems:
        raise CheckpointError("unsupported EAGLE-3 checkpoint: " + "; ".join(problems))

    heads = int(layer["num_attention_heads"])
    hidden = int(layer["hidden_size"])
    head_dim = layer.get("head_dim") or hidden // heads
    vocab = int(layer["vocab_size"])
    target_vocab = _target_attr(target_config, "vocab_size")
    if target_vocab is not None and int(target_vocab) != vocab:
        raise CheckpointError(f"head vocab_size {vocab} != target vocab_size {target_vocab}")
    target_hidden = cfg.get("target_hidden_size") or hidden
    t_hidden = _target_attr(target_config, "hidden_size")
    if t_hidden is not None and int(t_hidden) != int(target_hidden):
        raise CheckpointError(f"head target_hidden_size {target_hidden} != target hidden_size {t_hidden}")
    if aux_hidden_layers is not None:
        aux = tuple(aux_hidden_layers)
    else:
        aux = aux_layers_from_config(cfg, _num_layers(target_config))
        if aux is None:
            raise CheckpointError(
                "the checkpoint does not name its target feature layers "
                "(no eagle_aux_hidden_state_layer_ids): pass target_config (for the EAGLE default "
                "(2, L//2, L-3)) or aux_hidden_layers"
            )
    n_target = _num_layers(target_config)
    if n_target is not None and max(aux) > n_target:
        raise CheckpointError(f"aux_hidden_layers {aux} exceed the target's hidden_states range [0, {n_target}]")

    rope = dict(layer["rope_parameters"])
    theta = float(rope.pop("rope_theta", 10000.0))
    qk_norm = cfg.get("qk_norm")
    if qk_norm is None:
        qk_norm = layout == "speculators" and layer["model_type"] == "qwen3"
    try:
        return Eagle3Config(
            hidden_size=hidden,
            intermediate_size=int(layer["intermediate_size"]),
            num_attention_heads=heads,
            num_key_value_heads=int(layer.get("num_key_value_heads") or heads),
            head_dim=int(head_dim),
            vocab_size=vocab,
            draft_vocab_size=int(cfg.get("draft_vocab_size") or vocab),
            target_hidden_size=int(target_hidden),
            aux_hidden_layers=aux,
            rms_norm_eps=float(layer.get("rms_norm_eps") or 1e-6),
            rope_theta=theta,
            rope_scaling=rope or None,
            max_position_embeddings=int(layer.get("max_position_embeddings") or 2048),
            hidden_act=str(layer.get("hidden_act") or "silu"),
            norm_before_residual=bool(cfg.get("norm_before_residual", False)),
            norm_before_fc=bool(cfg.get("norm_before_fc", False)),
            qk_norm=bool(qk_norm),
        )
    except ValueError as e:
        raise CheckpointError(f"invalid EAGLE-3 config: {e}") from e


def _check_tensors(tensors: Mapping[str, torch.Tensor], config: Eagle3Config, layout: str) -> dict[str, torch.Tensor]:
    """Rename to the EAGLE layout and validate; raise one CheckpointError naming every problem."""
    expected = _expected_shapes(config)
    optional = {"embed_tokens.weight": (config.vocab_size, config.hidden_size)}
    if config.draft_vocab_size == config.vocab_size:  # identity vocab: mapping tables may be absent
        optional["d2t"] = expected.pop("d2t")
        optional["t2d"] = expected.pop("t2d")
    renamed = {_from_layout(k, layout): v for k, v in tensors.items()}
    missing, unexpected, misshaped = [], [], []
    for name, shape in expected.items():
        if name not in renamed:
            missing.append(f"{_to_layout(name, layout)} (expected shape {list(shape)})")
    for name, t in renamed.items():
        shape = expected.get(name, optional.get(name))
        if shape is None:
            if not name.endswith(_IGNORABLE_SUFFIXES):
                unexpected.append(f"{_to_layout(name, layout)} (shape {list(t.shape)})")
            continue
        if tuple(t.shape) != tuple(shape):
            misshaped.append(f"{_to_layout(name, layout)}: got {list(t.shape)}, expected {list(shape)}")
        elif name == "d2t" and (t.dtype.is_floating_point or t.dtype == torch.bool):
            misshaped.append(f"d2t: dtype {t.dtype}, expected an integer type")
    if not (missing or unexpected or misshaped) and "d2t" in renamed:
        target = torch.arange(config.draft_vocab_size) + renamed["d2t"].long()
        if target.numel() and (int(target.min()) < 0 or int(target.max()) >= config.vocab_size):
            misshaped.append(f"d2t: maps draft ids outside the target vocabulary [0, {config.vocab_size})")
    if missing or unexpected or misshaped:
        lines = [f"EAGLE-3 checkpoint ({layout} layout) does not match its config:"]
        lines += [f"  missing: {m}" for m in missing]
        lines += [f"  unexpected: {u}" for u in unexpected]
        lines += [f"  misshaped: {s}" for s in misshaped]
        raise CheckpointError("\n".join(lines), missing, unexpected, misshaped)
    return {k: v for k, v in renamed.items() if not k.endswith(_IGNORABLE_SUFFIXES)}


def load_eagle3(
    path: str | Path,
    target_config: Any = None,
    *,
    aux_hidden_layers: Sequence[int] | None = None,
    dtype: torch.dtype | None = None,
) -> Eagle3Head:
    """Load an EAGLE-3 head from a directory with config.json + model.safetensors (or pytorch_model.bin).

    Layout (EAGLE `midlayer.*` or speculators `layers.0.*`) is detected from config.json. `target_config`
    (an HF config or dict) supplies the layer count for heads that do not name their feature layers and
    is used to cross-check vocab/hidden sizes. `aux_hidden_layers` (HF hidden_states indices) overrides
    whatever the checkpoint says. Tensors keep their stored dtype unless `dtype` is given.
    """
    path = Path(path)
    cfg_path = path / "config.json"
    if not cfg_path.exists():
        raise FileNotFoundError(f"{cfg_path} not found")
    cfg = json.loads(cfg_path.read_text())
    layout = _detect_layout(cfg)
    config = _config_from_json(cfg, layout, target_config, aux_hidden_layers)
    tensors = _check_tensors(_read_tensors(path), config, layout)
    head = Eagle3Head(config, has_embed_tokens="embed_tokens.weight" in tensors)
    if dtype is None:
        dtype = tensors["fc.weight"].dtype
    head.to(dtype)
    state = head.state_dict()
    for name, t in tensors.items():
        state[name] = t.to(state[name].dtype)
    if "t2d" not in tensors:  # identity vocab without tables
        state["t2d"] = torch.ones_like(state["t2d"])
    head.load_state_dict(state, strict=True)
    return head


def save_eagle3(head: Eagle3Head, path: str | Path, layout: Literal["eagle", "speculators"] = "eagle") -> Path:
    """Write `head` as config.json + model.safetensors in the EAGLE (`midlayer.*`, flat Llama config) or
    speculators (`layers.0.*`, nested transformer_layer_config) layout. The aux layers are written in each
    format's own convention and, unambiguously, as `ecospec_aux_hidden_layers` (HF indices)."""
    from safetensors.torch import save_file

    if layout not in _LAYER_PREFIX:
        raise ValueError(f"layout must be 'eagle' or 'speculators', got {layout!r}")
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    c = head.config
    layer_cfg: dict[str, Any] = {
        "model_type": "qwen3" if (c.qk_norm and layout == "speculators") else "llama",
        "hidden_size": c.hidden_size,
        "intermediate_size": c.intermediate_size,
        "num_attention_heads": c.num_attention_heads,
        "num_key_value_heads": c.num_key_value_heads,
        "head_dim": c.head_dim,
        "num_hidden_layers": 1,
        "rms_norm_eps": c.rms_norm_eps,
        "rope_theta": c.rope_theta,
        "rope_scaling": dict(c.rope_scaling) if c.rope_scaling else None,
        "max_position_embeddings": c.max_position_embeddings,
        "hidden_act": c.hidden_act,
        "vocab_size": c.vocab_size,
        "attention_bias": False,
        "mlp_bias": False,
    }
    common = {
        "draft_vocab_size": c.draft_vocab_size,
        "target_hidden_size": c.target_hidden_size,
        "norm_before_residual": c.norm_before_residual,
        "norm_before_fc": c.norm_before_fc,
        "qk_norm": c.qk_norm,
        "ecospec_aux_hidden_layers": list(c.aux_hidden_layers),
    }
    if layout == "eagle":
        cfg: dict[str, Any] = {"architectures": ["LlamaForCausalLMEagle3"], **layer_cfg, **common}
        if min(c.aux_hidden_layers) >= 1:  # SpecForge/ModelOpt convention: output of layer id = HF index - 1
            cfg["eagle_config"] = {"eagle_aux_hidden_state_layer_ids": [i - 1 for i in c.aux_hidden_layers]}
    else:
        cfg = {
            "architectures": ["Eagle3Speculator"],
            "speculators_model_type": "eagle3",
            "transformer_layer_config": layer_cfg,
            "eagle_aux_hidden_state_layer_ids": list(c.aux_hidden_layers),  # HF indices (vLLM convention)
            "speculators_config": {
                "algorithm": "eagle3",
                "default_proposal_method": "greedy",
                "proposal_methods": [{"proposal_type": "greedy", "speculative_tokens": 3}],
                "verifier": {"name_or_path": None, "architectures": []},
            },
            **common,
        }
    (path / "config.json").write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")
    tensors = {_to_layout(k, layout): v.detach().contiguous().cpu().clone() for k, v in head.state_dict().items()}
    save_file(tensors, str(path / "model.safetensors"), metadata={"format": "pt"})
    return path


def init_random_weights(head: Eagle3Head, std: float = 0.02, seed: int = 0) -> Eagle3Head:
    """Random weights, and norm weights near (not at) 1, so every parameter matters (tests, smoke runs)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in head.named_parameters():
            noise = torch.randn(p.shape, generator=g, dtype=torch.float64)
            p.copy_((1.0 + 0.1 * noise) if name.endswith("norm.weight") else std * noise)
    return head
