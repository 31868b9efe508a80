"""Π_θ (paper §4.1): a small decoder LM mapping each token in context to L×N routing logits.

Token -> frozen copy of the target's embedding -> linear projection -> backbone (any HF base
decoder, e.g. ``Qwen3Model``) -> linear head -> logits ``[B, T, L, N]``. The predicted expert set of a
token is the per-layer top-k. The backbone's own token embedding is dropped (never used).

In the decode loop the predictor also scores a draft tree (``reset`` / ``predict``); the KV cache of
the committed context lives in a ``PredictorSession`` held by the module, so the ``ExpertPredictor``
passed to ``ecospec.generate(..., predictor=p)`` serves one generation at a time, like a drafter.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file
from torch import nn
from transformers import AutoConfig, AutoModel, DynamicCache, PretrainedConfig

from ecospec.engine.forward import attention_layout, forward_block, new_cache
from ecospec.engine.routing import expert_bitmasks
from ecospec.engine.tree import DraftTree, ancestor_mask
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
    """Decode-time state: KV cache of the committed tokens, then (until the next call) the last tree."""

    cache: DynamicCache = field(default_factory=new_cache)
    committed: int = 0


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
        self.layout = attention_layout(backbone.config)
        self.info: dict = {}  # free-form metadata saved with the checkpoint (e.g. held-out accuracy)
        self.session = PredictorSession()

    @classmethod
    def from_target(
        cls, target, backbone: PretrainedConfig | Mapping | str, dtype: torch.dtype | None = None
    ) -> ExpertPredictor:
        """A fresh predictor for `target`: copies its embedding; `backbone` is an HF config or a mapping of one
        (random init) or an HF id / local path (pretrained weights, e.g. "Qwen/Qwen3-0.6B")."""
        return cls.create(moe_info(target), target.get_input_embeddings().weight, backbone, dtype)

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
        cache: DynamicCache | None = None,
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

    def reset(self) -> None:
        """Start a new generation (drops the cached context)."""
        self.session = PredictorSession()

    @torch.no_grad()
    def score_tree(self, new_tokens: torch.Tensor, tree: DraftTree) -> torch.Tensor:
        """Logits [1 + len(tree), L, N] of the root (last of `new_tokens`) and every tree node.

        One forward over the tokens committed since the last call followed by all nodes: the new tokens
        are causal behind the cached context; node i sits at root position + depth and sees the context
        and its ancestors (the verification mask). The nodes' cache entries are dropped next call.
        """
        s = self.session
        extra = s.cache.get_seq_length() - s.committed
        if extra:
            s.cache.crop(-extra)
        dev = self.device
        m, n, c = new_tokens.shape[1], len(tree), s.committed
        tokens = torch.cat([new_tokens[0].to(dev), torch.tensor(tree.tokens, dtype=torch.long, device=dev)])
        root_pos = c + m - 1
        qpos = torch.cat([torch.arange(c, c + m), torch.tensor(tree.depths, dtype=torch.long) + root_pos]).to(dev)
        kpos = torch.cat([torch.arange(c, device=dev), qpos])
        vis = torch.zeros(m + n, c + m + n, dtype=torch.bool)
        vis[:m, : c + m] = torch.ones(m, c + m, dtype=torch.bool).tril(diagonal=c)
        vis[m:, : c + m] = True
        vis[m:, c + m :] = ancestor_mask(tree.parents)[1:, 1:]  # drop the root row/column: it is new token m-1
        out = forward_block(
            self.backbone,
            self.layout,
            s.cache,
            None,
            qpos,
            kpos,
            vis.to(dev),
            embeds=self.proj(self.embed(tokens[None])),
        )
        s.committed = c + m
        return self._logits(out.last_hidden_state[0, m - 1 :])

    def predict(self, new_tokens: torch.Tensor, tree: DraftTree) -> tuple[int, list[int]]:
        """Expert bitmasks (bit layer * N + expert, per-layer top-k) of the root and of each tree node."""
        logits = self.score_tree(new_tokens, tree)
        routes = logits.topk(self.config.top_k, dim=-1).indices.transpose(0, 1)  # [L, 1 + n, k]
        masks = expert_bitmasks(routes, self.config.num_experts)
        return masks[0], masks[1:]

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
