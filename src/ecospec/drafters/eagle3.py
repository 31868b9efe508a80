"""EAGLE-3 draft head: the model and its tree drafter (checkpoint files: `eagle3_checkpoint`).

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
`eagle3_checkpoint.aux_layers_from_config` for how each checkpoint convention is converted.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from ecospec.engine.masks import to_4d, visibility
from ecospec.engine.norm import rms_norm
from ecospec.engine.rows import RowSlots, aligned_levels, moved, pad_rows
from ecospec.engine.tree import DraftTree, missing_levels

__all__ = [
    "Eagle3Config",
    "Eagle3Head",
    "Eagle3Drafter",
    "KVCache",
    "default_aux_hidden_layers",
    "init_random_weights",
]

SUPPORTED_ROPE_TYPES = ("default", "linear", "llama3", "yarn", "dynamic")


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
        return rms_norm(x, self.weight, self.eps)


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
    """The head's KV cache: key/value tensors [B, kv_heads, T, head_dim]; grows by append, shrinks by crop."""

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

    def keep_rows(self, index: torch.Tensor) -> None:
        if self.k is not None:
            self.k, self.v = self.k.index_select(0, index), self.v.index_select(0, index)

    def crop(self, length: int) -> None:
        if self.k is not None and length < len(self):
            if length <= 0:
                self.k = self.v = None
            else:
                self.k = self.k[:, :, :length]
                self.v = self.v[:, :, :length]


def fused(owner: nn.Module, linears: tuple[nn.Linear, ...]) -> torch.Tensor:
    """The weights of `linears` stacked (one matmul for all: drafting runs the head three times a step, and on a CPU
    every op has a fixed cost whatever its size). Cached on `owner` while no gradient flows; rebuilt when a weight
    changes (an optimizer step or a load bumps its version) and never cached while training."""
    weights = [lin.weight for lin in linears]
    if torch.is_grad_enabled():
        return torch.cat(weights)
    key = tuple((w.data_ptr(), w._version, w.dtype, w.device) for w in weights)
    cached = owner.__dict__.get("_fused")
    if cached is None or cached[0] != key:
        cached = owner.__dict__["_fused"] = (key, torch.cat(weights))
    return cached[1]


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
        self._rope: tuple[torch.Tensor, torch.Tensor] | None = None  # cos, sin [positions, head_dim] (a cache)

    def _cos_sin(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """cos and sin [q, head_dim] at `positions`, from a table computed once in float64 (per device and
        dtype; it doubles when a position is past its end), not per call: drafting calls this every level."""
        top = int(positions.max()) + 1
        cached = self._rope
        if (
            cached is None
            or cached[0].shape[0] < top
            or cached[0].dtype != dtype
            or cached[0].device != positions.device
        ):
            n = max(top, 2 * (cached[0].shape[0] if cached is not None else 0), 256)
            freqs = torch.arange(n, dtype=torch.float64)[:, None] * self.inv_freq[None, :]
            emb = torch.cat([freqs, freqs], dim=-1)
            # sin with the first half negated: rotate_half(x) * sin == x.roll(half) * this (exactly: a sign flip)
            signed = torch.cat([-freqs.sin(), freqs.sin()], dim=-1)
            table = emb.cos() * self.rope_scale, signed * self.rope_scale
            self._rope = cached = tuple(t.to(device=positions.device, dtype=dtype) for t in table)
        return cached[0][positions], cached[1][positions]

    def _rope_at(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """cos, sin at `positions`, shaped to broadcast against [B, heads, q, head_dim] (once for q and k)."""
        cos, sin = self._cos_sin(positions, dtype)
        if positions.dim() == 2:  # per row [B, q] -> [B, 1, q, head_dim]
            cos, sin = cos[:, None], sin[:, None]
        return cos, sin

    @staticmethod
    def _rotate(x: torch.Tensor, cos: torch.Tensor, signed_sin: torch.Tensor) -> torch.Tensor:
        """RoPE, x * cos + rotate_half(x) * sin, as x * cos + x.roll(half) * signed_sin (four ops, not seven)."""
        return x * cos + x.roll(x.shape[-1] // 2, dims=-1) * signed_sin

    def forward(
        self, x: torch.Tensor, positions: torch.Tensor, cache: KVCache | None, visible: torch.Tensor
    ) -> torch.Tensor:
        b, q, _ = x.shape
        nq, nk = self.n_heads, self.n_kv
        # q, k and v from one matmul (`fused`), heads [B, nq + 2 nk, q, d]; q and k rotated together
        heads = F.linear(x, fused(self, (self.q_proj, self.k_proj, self.v_proj))).view(b, q, nq + 2 * nk, -1)
        heads = heads.transpose(1, 2)
        qk, vs = heads[:, : nq + nk], heads[:, nq + nk :]
        if self.q_norm is not None:  # Qwen3-type heads normalise each head before RoPE
            qk = torch.cat([self.q_norm(qk[:, :nq]), self.k_norm(qk[:, nq:])], dim=1)
        cos, sin = self._rope_at(positions, qk.dtype)
        qk = self._rotate(qk, cos, sin)
        qs, ks = qk[:, :nq], qk[:, nq:]
        if cache is not None:
            ks, vs = cache.append(ks, vs)
        mask = to_4d(visible, qs.dtype, additive=True)  # SDPA would turn a bool mask into this itself, in more ops
        out = F.scaled_dot_product_attention(qs, ks, vs, attn_mask=mask, scale=self.head_dim**-0.5, enable_gqa=True)
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
        gate, up = F.linear(x, fused(self, (self.gate_proj, self.up_proj))).chunk(2, dim=-1)
        return self.down_proj(self.act(gate) * up)


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
        """One pass of the decoder layer. hidden, embeds [B, q, H] (hidden already projected or recurrent);
        positions [q] (or per row [B, q]); the new keys are appended to `cache`; visible: bool [q, len(cache) + q]
        (or per row [B, q, len(cache) + q]; None = causal over the cache and the new block). Returns the output
        hidden state [B, q, H] (pre-norm)."""
        q = hidden.shape[1]
        past = 0 if cache is None else len(cache)
        if visible is None:
            visible = visibility(past, torch.ones(q, q, dtype=torch.bool, device=hidden.device).tril())
        return self.midlayer(hidden, embeds, positions, cache, moved(visible, hidden.device))

    def logits(self, out: torch.Tensor) -> torch.Tensor:
        """Draft-vocabulary logits from output hidden states."""
        return self.lm_head(self.norm(out))

    def to_target_ids(self, draft_ids: torch.Tensor) -> torch.Tensor:
        return draft_ids + self.d2t[draft_ids]


# ----------------------------------------------------------------------------------------------------
# Drafter
# ----------------------------------------------------------------------------------------------------


class Eagle3Drafter:
    """`Drafter` over an `Eagle3Head`, for a batch of rows (`reset(rows)`; the single-sequence protocol is row 0
    of a batch of one). Keeps the head's KV cache of committed entries (`engine.rows.RowSlots` says which slots
    hold what); tree entries appended by `expand` are dropped at the next `begin` (or when a different tree object
    is expanded)."""

    kind = "eagle3"  # the drafter kind it drafts as (method.drafter; engine.scope)

    def __init__(
        self,
        head: Eagle3Head,
        target_embedding: nn.Module | Callable[[torch.Tensor], torch.Tensor] | None = None,
        temperature: float | tuple[float, ...] = 1.0,
    ):
        if head.embed_tokens is None and target_embedding is None:
            raise ValueError("the head has no embed_tokens of its own: pass the target's input embedding")
        temps = tuple(temperature) if isinstance(temperature, list | tuple) else (temperature,)
        if not temps or not all(float(x) > 0 for x in temps):
            raise ValueError(f"temperature={temperature}: the draft logits' temperature must be > 0")
        self.head = head
        # the draft distribution is softmax(logits / temperature), one temperature or one per draft depth (the
        # last for deeper ones): a calibration (analysis.calibration) that makes the cumulative draft probabilities
        # the confidence selector ranks by track the target's acceptance
        self.temperature: float | tuple[float, ...] = temps[0] if len(temps) == 1 else tuple(map(float, temps))
        self.logits_log: list[torch.Tensor] | None = None  # a list: every draft distribution's logits (calibration)
        self.embed = head.embed_tokens if head.embed_tokens is not None else target_embedding
        self.vocab_size = head.config.vocab_size
        self.hidden_layers = head.config.aux_hidden_layers
        self._mapped = bool(head.d2t.any())  # a draft vocabulary of its own (draft id + d2t = target id)
        self.reset()

    # -- state --------------------------------------------------------------------------------------

    def reset(self, rows: int = 1) -> None:
        self.cache = KVCache()
        self.slots = RowSlots(rows)
        self._topk = 1
        self._root_out: torch.Tensor | None = None  # head output at each row's root entry [B, H]
        self._drop_tree()

    def _drop_tree(self) -> None:
        self.cache.crop(self.slots.crop())
        rows = self.slots.rows
        self._trees: list[DraftTree | None] = [None] * rows
        self._node_slot: list[dict[int, int]] = [{} for _ in range(rows)]  # node -> its cache slot
        self._outputs: list[torch.Tensor] = []  # head outputs [B, q, H] of this step's tree levels
        self._node_out: list[dict[int, tuple[int, int]]] = [{} for _ in range(rows)]  # node -> (level output, query)

    def keep_rows(self, keep: list[int]) -> None:
        """Only rows `keep` (in that order) stay: finished sequences leave the batch."""
        index = torch.tensor(keep, dtype=torch.long, device=self.head.device)
        self.cache.keep_rows(index)
        self.slots.keep_rows(keep)
        if self._root_out is not None:
            self._root_out = self._root_out[index]
        self._outputs = [out[index] for out in self._outputs]
        self._trees = [self._trees[b] for b in keep]
        self._node_slot = [self._node_slot[b] for b in keep]
        self._node_out = [self._node_out[b] for b in keep]

    # -- helpers ------------------------------------------------------------------------------------

    def _embed(self, ids: torch.Tensor) -> torch.Tensor:
        weight = getattr(self.embed, "weight", None)
        if isinstance(weight, torch.Tensor):
            ids = moved(ids, weight.device)
        return moved(self.embed(ids), self.head.device, self.head.dtype)

    def _topk_children(self, out: torch.Tensor, k: int, depth: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The top-k children of the nodes whose head outputs are `out`; the children sit at draft `depth`."""
        logits = self.head.logits(out)
        if logits.dtype not in (torch.float32, torch.float64):
            logits = logits.float()
        t = (
            self.temperature
            if isinstance(self.temperature, float | int)
            else self.temperature[min(depth, len(self.temperature)) - 1]
        )
        if t != 1.0:
            logits = logits / t
        if self.logits_log is not None:
            self.logits_log.append(logits)
        logp = torch.log_softmax(logits, dim=-1)
        vals, draft_ids = torch.topk(logp, k, dim=-1)
        if self.head.config.draft_vocab_size == self.vocab_size and not self._mapped:  # draft id = target id
            return vals, draft_ids
        return vals, self.head.to_target_ids(draft_ids)

    def _gather(self, refs: list[list[tuple[int, int]]]) -> torch.Tensor | list[torch.Tensor]:
        """The head outputs that `refs` name (per row, (level output, query) pairs; -1 = the row's root entry):
        [B, n, H] in one op when the rows are alike and every ref comes from one forward (the usual case), else a
        list of [n_b, H]."""
        first = refs[0][0][0] if refs and refs[0] else None
        if first is not None and len({len(r) for r in refs}) == 1 and all(o == first for r in refs for o, _ in r):
            out = self._root_out[:, None] if first < 0 else self._outputs[first]  # [B, q, H]
            flat = [b * out.shape[1] + i for b, row in enumerate(refs) for _, i in row]
            picked = out.flatten(0, 1).index_select(0, torch.tensor(flat, device=out.device))
            return picked.view(len(refs), len(refs[0]), -1)
        return [
            torch.stack([self._root_out[b] if o < 0 else self._outputs[o][b, i] for o, i in row])
            for b, row in enumerate(refs)
        ]

    # -- protocol -----------------------------------------------------------------------------------

    @torch.no_grad()
    def begin(
        self, new_tokens: torch.Tensor, new_hidden: torch.Tensor | None, topk: int, depth: int | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if new_hidden is None:
            raise ValueError("Eagle3Drafter needs the target's hidden states (hidden_layers is non-empty)")
        if new_tokens.dim() != 2 or new_tokens.shape[0] != 1 or new_hidden.dim() != 3 or new_hidden.shape[0] != 1:
            raise ValueError("begin expects new_tokens [1, m] and new_hidden [1, m', F] (batch size 1)")
        logp, ids = self.begin_rows([new_tokens[0]], [new_hidden[0]], topk)
        return logp[0], ids[0]

    @torch.no_grad()
    def begin_rows(
        self,
        new_tokens: list[torch.Tensor],
        new_hidden: list[torch.Tensor] | None,
        topk: int,
        depth: int | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """`begin` for every row at once (one head forward): new_tokens[b] [m_b], new_hidden[b] [m'_b, F].
        Returns the roots' top-k children: (log-probs [B, k], target ids [B, k])."""
        if new_hidden is None:
            raise ValueError("Eagle3Drafter needs the target's hidden states (hidden_layers is non-empty)")
        if len(new_tokens) != self.slots.rows or len(new_hidden) != self.slots.rows:
            raise ValueError(f"begin_rows: {len(new_tokens)} rows of tokens for a drafter of {self.slots.rows} rows")
        for toks, hid in zip(new_tokens, new_hidden, strict=True):
            m, m_h = toks.shape[0], hid.shape[0]
            if not 1 <= m_h <= m:
                raise ValueError(f"need 1 <= m' <= m, got m={m}, m'={m_h}")
            if hid.dim() != 2 or hid.shape[-1] != self.head.config.feature_size:
                raise ValueError(
                    f"new_hidden has width {hid.shape[-1]}, expected {self.head.config.feature_size} "
                    f"(hidden_states{list(self.hidden_layers)} concatenated)"
                )
        self._drop_tree()
        dev, dt = self.head.device, self.head.dtype
        # new_hidden[b][j] (the row's target position committed + j) is paired with the token that follows it.
        counts = [h.shape[0] for h in new_hidden]
        tokens = pad_rows([moved(t[t.shape[0] - c :], dev) for t, c in zip(new_tokens, counts, strict=True)])
        hidden = self.head.project(pad_rows([moved(h, dev, dt) for h in new_hidden]))
        positions, visible = self.slots.commit(counts)
        out = self.head(hidden, self._embed(tokens), moved(positions, dev), self.cache, moved(visible, dev))
        self._topk = topk
        if len(set(counts)) == 1:  # every row's root at the same query (always at batch size 1): one op
            self._root_out = out[:, counts[0] - 1]
        else:
            self._root_out = out[torch.arange(len(counts)), torch.tensor(counts) - 1]
        return self._topk_children(self._root_out, topk, 1)

    @torch.no_grad()
    def begin_positions(
        self, tokens: torch.Tensor, hidden: torch.Tensor, positions: list[int], topk: int
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Rows = prefixes of one sequence, in one head pass: row b is the state `begin` leaves after the prompt
        tokens[: positions[b] + 2] (its root is tokens[positions[b] + 1]). tokens [T], hidden [T - 1, F] (the
        target's features at positions 0..T-2). Causal attention makes entry i of the whole pass what a pass over
        the prefix gives, so every row sees the shared entries up to its own (GTO grows a training tree at each
        position this way). Resets the drafter to len(positions) rows; returns the roots' top-k children."""
        n = hidden.shape[0]
        if tokens.shape[0] != n + 1 or not all(0 <= i < n for i in positions):
            raise ValueError(f"begin_positions: tokens [{n + 1}] and hidden [{n}, F], positions in [0, {n})")
        dev, dt = self.head.device, self.head.dtype
        self.reset(rows=len(positions))
        shared = KVCache()
        out = self.head(
            self.head.project(hidden.to(device=dev, dtype=dt))[None],
            self._embed(tokens[None, 1:]),
            torch.arange(n, device=dev),
            shared,
        )
        rows = len(positions)
        self.cache.k = shared.k.expand(rows, *shared.k.shape[1:])
        self.cache.v = shared.v.expand(rows, *shared.v.shape[1:])
        s = self.slots
        s._grow(n)
        s._valid[:, :n] = torch.arange(n)[None, :] <= torch.tensor(positions)[:, None]
        s._pos = [list(range(n)) for _ in positions]
        s.n = [i + 1 for i in positions]
        s.committed_width = n
        s.dense = False  # each row sees its own prefix of the shared entries
        self._topk = topk
        self._root_out = out[0, torch.tensor(positions, device=dev)]
        return self._topk_children(self._root_out, topk, 1)

    @torch.no_grad()
    def expand(self, tree: DraftTree, beam: list[int], topk: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        logp, ids = self.expand_rows([tree], [beam], topk)
        return logp[0], ids[0]

    @torch.no_grad()
    def expand_rows(
        self, trees: list[DraftTree], beams: list[list[int]], topk: int | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """`expand` for every row at once (one head forward per missing tree level, all rows together; the rows'
        beams must be alike in shape, as `grow_trees` makes them). Returns ([B, beam, k], [B, beam, k])."""
        if self._root_out is None:
            raise RuntimeError("expand called before begin")
        k = self._topk if topk is None else topk
        if any(t is not mine for t, mine in zip(trees, self._trees, strict=True)):
            self._drop_tree()
            self._trees = list(trees)
        # Every ancestor of a beam node must be in the cache; run the missing ones level by level.
        levels = [missing_levels(t, b, outs) for t, b, outs in zip(trees, beams, self._node_out, strict=True)]
        for depth_nodes in aligned_levels(levels):
            self._run_level(trees, depth_nodes)
        outs = self._gather([[outs[n] for n in b] for b, outs in zip(beams, self._node_out, strict=True)])
        depth = trees[0].depths[beams[0][0]] + 1  # the beams are alike: one level of every row
        return self._topk_children(outs if isinstance(outs, torch.Tensor) else torch.stack(outs), k, depth)

    def _run_level(self, trees: list[DraftTree], nodes: list[list[int]]) -> None:
        """One head forward over one tree level of every row (nodes[b]: row b's nodes, all at one depth)."""
        dev = self.head.device
        refs, tokens, positions, sees = [], [], [], []
        for b, (tree, level) in enumerate(zip(trees, nodes, strict=True)):
            outs = self._node_out[b]
            refs.append([(-1, 0) if tree.parents[n] < 0 else outs[tree.parents[n]] for n in level])  # parent outputs
            tokens.append([tree.tokens[n] for n in level])
            root_pos = self.slots.n[b] - 1  # the root's entry is the row's last committed one
            positions.append([root_pos + tree.depths[n] for n in level])
            sees.append([[self._node_slot[b][a] for a in tree.path(n)[:-1]] for n in level])
        start = self.slots.width
        qpos, visible = self.slots.tree(positions, sees)
        hidden = self._gather(refs)
        hidden = hidden if isinstance(hidden, torch.Tensor) else pad_rows(hidden)
        same = len({len(t) for t in tokens}) == 1
        ids = torch.tensor(tokens) if same else pad_rows([torch.tensor(t) for t in tokens])
        out = self.head(hidden, self._embed(ids), moved(qpos, dev), self.cache, moved(visible, dev))
        self._outputs.append(out)
        for b, level in enumerate(nodes):
            for i, n in enumerate(level):
                self._node_slot[b][n] = start + i
                self._node_out[b][n] = (len(self._outputs) - 1, i)


def init_random_weights(head: Eagle3Head, std: float = 0.02, seed: int = 0) -> Eagle3Head:
    """Random weights, and norm weights near (not at) 1, so every parameter matters (tests, smoke runs)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in head.named_parameters():
            noise = torch.randn(p.shape, generator=g, dtype=torch.float64)
            p.copy_((1.0 + 0.1 * noise) if name.endswith("norm.weight") else std * noise)
    return head
