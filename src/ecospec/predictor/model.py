"""Π_θ (paper §4.1): a small decoder LM mapping each token in context to L×N routing logits.

Token -> frozen copy of the target's embedding -> linear projection -> backbone (any HF base
decoder, e.g. ``Qwen3Model``) -> linear head -> logits ``[B, T, L, N]``. The predicted expert set of a
token is the per-layer top-k. The backbone's own token embedding is dropped (never used).

In the decode loop the predictor also scores a draft tree (``reset`` / ``predict``); the KV cache of
the committed context lives in a ``PredictorSession`` held by the module, so the ``ExpertPredictor``
passed to ``ecospec.generate(..., predictor=p)`` serves one generation at a time, like a drafter.

Why a decode path of its own (``_decode``): the paper's predictor costs ~0.5 % of a verify pass. Through the HF
backbone's forward, a one-layer predictor on a CPU spent more per step in wrappers, mask conversion and cache
bookkeeping than in its own weights, as much as several of the tiny target's layers. ``_decode`` runs the same
weights layer by layer (Llama-style decoders: Qwen3, Qwen2, Llama), with one RoPE call per step and a plain KV
cache; the tests check it against the HF forward. Training and held-out evaluation use the HF forward (``forward``).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file
from torch import nn
from transformers import AutoConfig, AutoModel, PretrainedConfig

from ecospec.engine.forward import attention_layout
from ecospec.engine.norm import rms_norm
from ecospec.engine.routing import expert_bitmasks
from ecospec.engine.rows import RowSlots, pad_rows
from ecospec.engine.tree import DraftTree
from ecospec.models.adapters import MoeInfo, moe_info

FORMAT = "ecospec-expert-predictor"
CONFIG_FILE = "config.json"
WEIGHTS_FILE = "model.safetensors"


class CheckpointMismatchError(ValueError):
    """A predictor checkpoint whose tensors do not match the architecture its config.json describes."""


@dataclass(frozen=True)
class PredictorConfig:
    """What the predictor must agree on with its target (the backbone has its own HF config)."""

    num_moe_layers: int  # L
    num_experts: int  # N
    top_k: int  # k
    target_hidden_size: int
    vocab_size: int
    target_family: str = ""


@dataclass
class PredictorSession:
    """Decode-time state of a batch of rows: per backbone layer the keys and values [B, kv heads, T, head dim] of
    the committed tokens, then (until the next call) of the last trees' nodes; `slots` says which is which."""

    slots: RowSlots = field(default_factory=lambda: RowSlots(1))
    keys: list[torch.Tensor] = field(default_factory=list)
    values: list[torch.Tensor] = field(default_factory=list)


def _linear(module: nn.Linear, x: torch.Tensor) -> torch.Tensor:
    return F.linear(x, module.weight, module.bias)


def _rms(norm: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """An HF RMSNorm module's function (`engine.norm.rms_norm`) in fewer ops than its forward."""
    return rms_norm(x, norm.weight, norm.variance_epsilon, hf=True)


def _check_backbone(backbone: nn.Module) -> None:
    """The decode path's assumptions: Llama-style layers (pre-norm attention + MLP), full attention only."""
    layers = getattr(backbone, "layers", None)
    parts = ("input_layernorm", "self_attn", "post_attention_layernorm", "mlp")
    attn = ("q_proj", "k_proj", "v_proj", "o_proj")
    ok = layers is not None and hasattr(backbone, "norm") and hasattr(backbone, "rotary_emb")
    ok = ok and all(hasattr(lay, x) for lay in layers for x in parts)
    ok = ok and all(hasattr(lay.self_attn, x) for lay in layers for x in attn)
    ok = ok and all(hasattr(lay.mlp, x) for lay in layers for x in ("gate_proj", "up_proj", "down_proj", "act_fn"))
    if not ok or any(w is not None for w in attention_layout(backbone.config).windows.values()):
        raise ValueError(
            f"predictor backbone {type(backbone).__name__}: needs a Llama-style decoder with full attention "
            "(e.g. Qwen3Model, Qwen2Model, LlamaModel)"
        )


class ExpertPredictor(nn.Module):
    def __init__(self, config: PredictorConfig, backbone: nn.Module):
        super().__init__()
        self.config = config
        hidden = backbone.config.hidden_size
        self.embed = nn.Embedding(config.vocab_size, config.target_hidden_size)
        self.embed.weight.requires_grad_(False)  # frozen copy of the target's embedding
        self.proj = nn.Linear(config.target_hidden_size, hidden)
        backbone.set_input_embeddings(None)  # fed inputs_embeds only
        self.backbone = backbone
        self.head = nn.Linear(hidden, config.num_moe_layers * config.num_experts)
        _check_backbone(backbone)
        self.info: dict = {}  # free-form metadata saved with the checkpoint (e.g. held-out accuracy)
        self.session = PredictorSession()
        self._rope_table: tuple[torch.Tensor, torch.Tensor] | None = None  # cos, sin [positions, head dim]

    @classmethod
    def from_target(
        cls, target, backbone: PretrainedConfig | Mapping | str, dtype: torch.dtype | None = None
    ) -> ExpertPredictor:
        """A fresh predictor for `target`: copies its embedding; `backbone` is an HF config or a mapping of one
        (random init) or an HF id / local path (pretrained weights, e.g. "Qwen/Qwen3-0.6B")."""
        from ecospec.parallel import full_tensor  # a tensor-parallel target's embedding may be sharded

        return cls.create(moe_info(target), full_tensor(target.get_input_embeddings().weight), backbone, dtype)

    @classmethod
    def create(
        cls,
        info: MoeInfo,
        embedding: torch.Tensor,
        backbone: PretrainedConfig | Mapping | str,
        dtype: torch.dtype | None = None,
    ) -> ExpertPredictor:
        """A fresh predictor for a target described by its MoE facts and input embedding [V, H] alone, so a
        235B target need not be loaded to train its predictor (see `read_embedding`)."""
        config = PredictorConfig(
            num_moe_layers=info.num_moe_layers,
            num_experts=info.num_experts,
            top_k=info.top_k,
            target_hidden_size=embedding.shape[1],
            vocab_size=embedding.shape[0],
            target_family=info.family,
        )
        if isinstance(backbone, str):
            model = AutoModel.from_pretrained(backbone, dtype=torch.float32)
        else:
            if isinstance(backbone, Mapping):
                spec = dict(backbone)
                backbone = AutoConfig.for_model(spec.pop("model_type"), **spec)
            model = AutoModel.from_config(backbone)
        predictor = cls(config, model).to(device=embedding.device, dtype=dtype or embedding.dtype)
        with torch.no_grad():
            predictor.embed.weight.copy_(embedding.detach())
        return predictor.eval()

    @property
    def device(self) -> torch.device:
        return self.head.weight.device

    @property
    def dtype(self) -> torch.dtype:
        return self.head.weight.dtype

    def forward(
        self,
        input_ids: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
        attention_mask=None,
        cache=None,
        embeds: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Routing logits [B, T, L, N] for `input_ids` [B, T] (or `embeds` [B, T, target hidden], i.e.
        target-embedding vectors). `attention_mask`/`position_ids` go to the backbone as in HF
        (None = causal over the block and `cache`)."""
        if (input_ids is None) == (embeds is None):
            raise ValueError("pass exactly one of input_ids and embeds")
        h = self.proj(self.embed(input_ids) if embeds is None else embeds)
        out = self.backbone(
            inputs_embeds=h,
            position_ids=position_ids,
            attention_mask=attention_mask,
            cache=cache,
            use_cache=cache is not None,
        )
        return self._logits(out.last_hidden_state)

    def _logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.head(hidden).unflatten(-1, (self.config.num_moe_layers, self.config.num_experts))

    # -- decode loop -------------------------------------------------------------------------------

    def reset(self, rows: int = 1) -> None:
        """Start a new generation of `rows` sequences (drops the cached context)."""
        self.session = PredictorSession(RowSlots(rows))

    def keep_rows(self, keep: list[int]) -> None:
        """Only rows `keep` (in that order) stay: finished sequences leave the batch."""
        s = self.session
        index = torch.tensor(keep, dtype=torch.long, device=self.device)
        s.keys = [k.index_select(0, index) for k in s.keys]
        s.values = [v.index_select(0, index) for v in s.values]
        s.slots.keep_rows(keep)

    @torch.no_grad()
    def score_rows(self, new_tokens: list[torch.Tensor], trees: list[DraftTree]) -> list[torch.Tensor]:
        """Per row b of the batch, the logits [1 + len(trees[b]), L, N] of its root (the last of new_tokens[b] [m_b])
        and every node of trees[b], all rows in one forward.

        The tokens committed since the last call are causal behind the cached context; node i sits at root
        position + depth and sees the context and its ancestors (the verification mask). The nodes' cache entries
        are dropped next call."""
        s = self.session
        if len(new_tokens) != s.slots.rows or len(trees) != s.slots.rows:
            raise ValueError(f"score_rows: {len(new_tokens)} rows for a predictor session of {s.slots.rows} rows")
        dev = self.device
        keep = s.slots.crop()  # the previous trees' nodes go
        counts = [t.shape[0] for t in new_tokens]
        qpos_new, vis_new = s.slots.commit(counts)
        start = s.slots.width  # the nodes' slots follow the new tokens' block
        positions = [[n - 1 + d for d in t.depths] for n, t in zip(s.slots.n, trees, strict=True)]
        sees = [[[start + a for a in t.path(i)[:-1]] for i in range(len(t))] for t in trees]
        if any(len(t) for t in trees):
            qpos_tree, vis_tree = s.slots.tree(positions, sees)
            vis_new = torch.cat([vis_new, vis_new.new_zeros(*vis_new.shape[:2], vis_tree.shape[1])], dim=2)
            qpos, vis = torch.cat([qpos_new, qpos_tree], 1), torch.cat([vis_new, vis_tree], 1)
            node_ids = pad_rows([torch.tensor(t.tokens, dtype=torch.long) for t in trees])
            tokens = torch.cat([pad_rows([t.to("cpu") for t in new_tokens]), node_ids], 1)
        else:
            qpos, vis, tokens = qpos_new, vis_new, pad_rows([t.to("cpu") for t in new_tokens])
        hidden = self._decode(self.proj(self.embed(tokens.to(dev))), qpos.to(dev), vis.to(dev), keep)
        q_new = qpos_new.shape[1]
        return [
            self._logits(torch.cat([hidden[b, m - 1 : m], hidden[b, q_new : q_new + len(t)]]))
            for b, (m, t) in enumerate(zip(counts, trees, strict=True))
        ]

    def _rope(self, qpos: torch.Tensor, like: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """cos, sin [B, q, head dim] at `qpos` [B, q]: rows of a table the backbone's own rotary embedding made once
        (doubled when a position is past its end), instead of its ~10-op forward every step."""
        top = int(qpos.max()) + 1
        table = self._rope_table
        if table is None or table[0].shape[0] < top or table[0].dtype != like.dtype or table[0].device != like.device:
            n = max(top, 2 * (table[0].shape[0] if table is not None else 0), 256)
            cos, sin = self.backbone.rotary_emb(like, torch.arange(n, device=like.device)[None])
            self._rope_table = table = (cos[0], sin[0])
        return table[0][qpos], table[1][qpos]

    def _decode(self, h: torch.Tensor, qpos: torch.Tensor, visible: torch.Tensor, keep: int) -> torch.Tensor:
        """The backbone over the block `h` [B, q, H] at positions `qpos` [B, q], attending to the session's first
        `keep` cached entries and the block itself as `visible` [B, q, keep + q] says; the block's keys and values
        are appended to the cache. Returns the final-norm hidden states [B, q, H]. The layers' weights are used
        through F.linear, not the modules' calls: the predictor must cost a small share of a verify pass."""
        s, bb = self.session, self.backbone
        rows, q = h.shape[:2]
        cos, sin = self._rope(qpos, h)
        cos, sin = cos[:, None], sin[:, None]
        mask = visible[:, None]
        for i, layer in enumerate(bb.layers):
            a, mlp = layer.self_attn, layer.mlp
            x = _rms(layer.input_layernorm, h)
            heads = (rows, q, -1, a.head_dim)
            qs, ks, vs = (
                _linear(a.q_proj, x).view(heads),
                _linear(a.k_proj, x).view(heads),
                _linear(a.v_proj, x).view(heads),
            )
            if getattr(a, "q_norm", None) is not None:  # Qwen3: per-head RMSNorm before RoPE
                qs, ks = _rms(a.q_norm, qs), _rms(a.k_norm, ks)
            qs, ks, vs = qs.transpose(1, 2), ks.transpose(1, 2), vs.transpose(1, 2)
            qs = qs * cos + torch.cat([-qs[..., a.head_dim // 2 :], qs[..., : a.head_dim // 2]], -1) * sin
            ks = ks * cos + torch.cat([-ks[..., a.head_dim // 2 :], ks[..., : a.head_dim // 2]], -1) * sin
            if i < len(s.keys):
                ks = torch.cat([s.keys[i][:, :, :keep], ks], 2)
                vs = torch.cat([s.values[i][:, :, :keep], vs], 2)
                s.keys[i], s.values[i] = ks, vs
            else:
                s.keys.append(ks)
                s.values.append(vs)
            out = F.scaled_dot_product_attention(qs, ks, vs, attn_mask=mask, scale=a.scaling, enable_gqa=True)
            h = h + _linear(a.o_proj, out.transpose(1, 2).reshape(rows, q, -1))
            x = _rms(layer.post_attention_layernorm, h)
            h = h + _linear(mlp.down_proj, mlp.act_fn(_linear(mlp.gate_proj, x)) * _linear(mlp.up_proj, x))
        return _rms(bb.norm, h)

    def predict(self, new_tokens: torch.Tensor, tree: DraftTree) -> tuple[int, list[int]]:
        """Expert bitmasks (bit layer * N + expert, per-layer top-k) of the root and of each tree node."""
        roots, nodes = self.predict_rows([new_tokens[0]], [tree])
        return roots[0], nodes[0]

    def predict_rows(self, new_tokens: list[torch.Tensor], trees: list[DraftTree]) -> tuple[list[int], list[list[int]]]:
        """`predict` for every row in one forward: (root bitmask per row, node bitmasks per row)."""
        logits = self.score_rows(new_tokens, trees)
        sizes = [x.shape[0] for x in logits]
        routes = torch.cat(logits).topk(self.config.top_k, dim=-1).indices.transpose(0, 1)  # [L, rows' tokens, k]
        masks = expert_bitmasks(routes, self.config.num_experts)
        roots, nodes, i = [], [], 0
        for n in sizes:
            roots.append(masks[i])
            nodes.append(masks[i + 1 : i + n])
            i += n
        return roots, nodes

    # -- checkpoints -------------------------------------------------------------------------------

    def save(self, directory: str | Path, info: dict | None = None) -> Path:
        """Write config.json (predictor + backbone config, dtype, `info`) and model.safetensors."""
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        if info is not None:
            self.info = dict(info)
        meta = {
            "format": FORMAT,
            **asdict(self.config),
            "dtype": str(self.dtype).removeprefix("torch."),
            "attn_implementation": self.backbone.config._attn_implementation,
            "backbone": self.backbone.config.to_dict(),
            "info": self.info,
        }
        (directory / CONFIG_FILE).write_text(json.dumps(meta, indent=2))
        state = {k: v.detach().contiguous().cpu() for k, v in self.state_dict().items()}
        save_file(state, str(directory / WEIGHTS_FILE))
        return directory

    @classmethod
    def load(cls, directory: str | Path, device: str | torch.device = "cpu") -> ExpertPredictor:
        """Rebuild a saved predictor; CheckpointMismatchError if the weights do not fit the config."""
        directory = Path(directory)
        meta = json.loads((directory / CONFIG_FILE).read_text())
        if meta.get("format") != FORMAT:
            raise CheckpointMismatchError(f"{directory / CONFIG_FILE} is not an ecospec expert-predictor config")
        fields = PredictorConfig.__dataclass_fields__
        try:
            config = PredictorConfig(**{k: meta[k] for k in fields if k in meta})
        except TypeError as err:
            raise CheckpointMismatchError(f"{directory / CONFIG_FILE}: {err}") from None
        bb = dict(meta["backbone"])
        bb_config = AutoConfig.for_model(bb.pop("model_type"), **bb)
        backbone = AutoModel.from_config(bb_config, attn_implementation=meta.get("attn_implementation"))
        predictor = cls(config, backbone).to(getattr(torch, meta.get("dtype", "float32")))
        state = load_file(str(directory / WEIGHTS_FILE))
        expected = predictor.state_dict()
        problems = [f"missing {k}" for k in expected if k not in state]
        problems += [f"unexpected {k}" for k in state if k not in expected]
        problems += [
            f"{k}: shape {tuple(state[k].shape)} in the file, {tuple(v.shape)} expected"
            for k, v in expected.items()
            if k in state and state[k].shape != v.shape
        ]
        if problems:
            shown = "; ".join(problems[:8]) + (f"; ... ({len(problems)} in all)" if len(problems) > 8 else "")
            raise CheckpointMismatchError(f"checkpoint {directory} does not match its config: {shown}")
        predictor.load_state_dict(state)
        predictor.info = meta.get("info", {})
        return predictor.to(device).eval()
