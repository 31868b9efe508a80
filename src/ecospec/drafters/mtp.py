"""DeepSeek-V3 multi-token-prediction (MTP) head and its tree drafter (checkpoint files: `mtp_checkpoint`).

DeepSeek-V3/V3.1 checkpoints ship one MTP module as decoder layer index `num_hidden_layers`
(`model.layers.61.*`), which transformers' DeepseekV3ForCausalLM skips on load. At head entry i:

    x_i   = eh_proj(concat(enorm(E[t_{i+1}]), hnorm(h_i)))      (2H -> H, no bias; embedding FIRST)
    y_i   = DeepseekV3DecoderLayer(x_i)                          (MLA + MoE: transformers' own class)
    out_i = shared_head.norm(y_i)
    p(t_{i+2}) = softmax(shared_head.head(out_i))

`embed_tokens` and `shared_head.head` share the main model's embedding and lm_head (DeepSeek-V3
README_WEIGHTS.md); a head without its own copies uses the target's (`MtpHead.tie`).

Facts, and where they come from:

* Concat order: embedding first, then the hidden state (vLLM `deepseek_mtp.py`
  `torch.cat([inputs_embeds, previous_hidden_states])`, SGLang `deepseek_nextn.py`
  `cat((enorm(embeds), hnorm(hidden)))`, Megatron-LM `multi_token_prediction.py` `_concat_embeddings`;
  the V3 report's Eq. 21 writes the hidden state first, the code and the weights do not).
* h_i is the target's final hidden state AFTER `model.norm` (vLLM's DeepseekV2Model.forward returns
  `self.norm(hidden_states, residual)` and that is what its proposer hands over; SGLang stores the
  hidden states its logits processor received; Megatron feeds the decoder block output, final layernorm
  included). In transformers, `hidden_states[num_hidden_layers]` is exactly that: `capture_outputs`
  replaces the last layer's raw output with `last_hidden_state` (after the norm). So
  `MtpDrafter.hidden_layers == (num_hidden_layers,)` and the loop's `forward_block(..., hidden=True)`
  provides it; the pre-norm output of the last layer is not exposed by HF and is not needed.
* Depth > 1 (one module chained, as SGLang and vLLM draft several steps): a tree node's hidden input is
  the head's own `out` at its parent, i.e. after `shared_head.norm`, the same kind of state as the
  target's h_i (SGLang returns the normed state for chaining, Megatron feeds each depth's
  final-layernormed output to the next; vLLM chains the pre-norm y_i instead).
* Positions follow `Eagle3Drafter`: head entry i sits at position i (the target position of h_i), a
  depth-d tree node at (root entry position + d). Megatron rolls the position ids (entry i at i + 1);
  with RoPE only differences matter. vLLM zeroes the embedding of the entry at position 0; SGLang and
  Megatron do not, and neither do we.

The inner layer's MoE router is a separate module, so the engine's RoutingCapture of the target never
records it.
"""

from __future__ import annotations

import copy

import torch
from torch import nn
from transformers.models.deepseek_v3.modeling_deepseek_v3 import (
    DeepseekV3DecoderLayer,
    DeepseekV3RMSNorm,
    DeepseekV3RotaryEmbedding,
)

from ecospec.engine.batch import drop_rows
from ecospec.engine.forward import crop_cache
from ecospec.engine.masks import to_4d, visibility
from ecospec.engine.rows import RowSlots, aligned_levels, pad_rows
from ecospec.engine.tree import DraftTree, missing_levels

__all__ = ["MtpHead", "MtpDrafter", "init_random_weights"]


class MtpHead(nn.Module):
    """One DeepSeek MTP module. Submodule names follow the checkpoint (`decoder` = the inner decoder
    layer, whose checkpoint keys sit directly under `model.layers.{N}.`). The head keeps no KV cache
    itself: callers pass a one-layer `DynamicCache`."""

    def __init__(self, config, *, has_embed_tokens: bool = False, has_lm_head: bool = False):
        super().__init__()
        cfg = copy.deepcopy(getattr(config, "text_config", None) or config)
        cfg._attn_implementation = cfg._attn_implementation or "eager"
        cfg._experts_implementation = cfg._experts_implementation or "eager"
        self.config = cfg
        h, eps = cfg.hidden_size, cfg.rms_norm_eps
        self.embed_tokens = nn.Embedding(cfg.vocab_size, h) if has_embed_tokens else None
        self.enorm = DeepseekV3RMSNorm(h, eps=eps)
        self.hnorm = DeepseekV3RMSNorm(h, eps=eps)
        self.eh_proj = nn.Linear(2 * h, h, bias=False)
        # Layer index num_hidden_layers (>= first_k_dense_replace) makes the MLP a MoE, as in the checkpoint;
        # the attention writes to layer 0 of the head's own cache.
        self.decoder = DeepseekV3DecoderLayer(cfg, layer_idx=cfg.num_hidden_layers)
        self.decoder.self_attn.layer_idx = 0
        self.shared_head = nn.Module()
        self.shared_head.norm = DeepseekV3RMSNorm(h, eps=eps)
        self.shared_head.head = nn.Linear(h, cfg.vocab_size, bias=False) if has_lm_head else None
        # Not registered: RoPE frequencies stay float32 whatever the head is cast to (and real even when the
        # head is built on the meta device for loading); the target's embedding/lm_head stay the target's.
        with torch.device("cpu"):
            self._rope = (DeepseekV3RotaryEmbedding(cfg),)
        self._tied: dict[str, nn.Module] = {}

    @classmethod
    def for_target(cls, target) -> MtpHead:
        """A head shaped for `target` (an HF DeepseekV3ForCausalLM), sharing its embedding and lm_head,
        on its device and in its dtype (weights as constructed: see `init_random_weights`)."""
        head = cls(target.config).to(device=target.device, dtype=target.dtype)
        return head.tie(target)

    def tie(self, target) -> MtpHead:
        """Use the target's input embedding / lm_head where the head has no copy of its own."""
        self._tied = {"embed_tokens": target.get_input_embeddings(), "head": target.get_output_embeddings()}
        return self

    @property
    def dtype(self) -> torch.dtype:
        return self.eh_proj.weight.dtype

    @property
    def device(self) -> torch.device:
        return self.eh_proj.weight.device

    def _shared(self, name: str, own: nn.Module | None) -> nn.Module:
        module = own if own is not None else self._tied.get(name)
        if module is None:
            raise ValueError(
                f"the MTP head has no {name} of its own: call head.tie(target) (or MtpDrafter(head, target))"
            )
        return module

    def embed(self, input_ids: torch.Tensor) -> torch.Tensor:
        emb = self._shared("embed_tokens", self.embed_tokens)
        return emb(input_ids.to(emb.weight.device)).to(device=self.device, dtype=self.dtype)

    def logits(self, out: torch.Tensor) -> torch.Tensor:
        """Vocabulary logits from output states `out` (already after shared_head.norm)."""
        lm = self._shared("head", self.shared_head.head)
        return lm(out.to(device=lm.weight.device, dtype=lm.weight.dtype))

    def forward(
        self,
        input_ids: torch.Tensor,
        hidden: torch.Tensor,
        positions: torch.Tensor,
        cache=None,
        visible: torch.Tensor | None = None,
        logits_to_keep: int | None = 0,
    ) -> tuple[torch.Tensor | None, torch.Tensor]:
        """One pass over q entries. input_ids [B, q]: token t_{i+1} of each entry; hidden [B, q, H]: h_i
        (target final hidden state, or the head's own `out` at the parent); positions [q] (or per row [B, q]).
        New keys are appended to `cache` (a DynamicCache, or None); visible: bool [q, cached + q] (or per row
        [B, q, cached + q]; None = causal over cache and block). Returns (logits [B, q or logits_to_keep, V], or
        None when logits_to_keep is None; out [B, q, H] after shared_head.norm).
        """
        q = input_ids.shape[1]
        hidden = hidden.to(device=self.device, dtype=self.dtype)
        x = self.eh_proj(torch.cat([self.enorm(self.embed(input_ids)), self.hnorm(hidden)], dim=-1))  # embedding first
        past = 0 if cache is None else cache.get_seq_length()
        if visible is None:
            visible = visibility(past, torch.ones(q, q, dtype=torch.bool, device=x.device).tril())
        rope = self._rope[0]
        if rope.inv_freq.device != x.device:
            rope.to(x.device)
        pos = positions.to(x.device)
        pos = pos if pos.dim() == 2 else pos[None]
        y = self.decoder(
            x,
            attention_mask=to_4d(visible.to(x.device), x.dtype, additive=True),
            position_ids=pos,
            cache=cache,
            use_cache=cache is not None,
            position_embeddings=rope(x, pos),
        )
        out = self.shared_head.norm(y)
        if logits_to_keep is None:  # the caller takes logits of some outputs itself
            return None, out
        return self.logits(out[:, -logits_to_keep:] if logits_to_keep else out), out


class MtpDrafter:
    """`Drafter` over an `MtpHead` (see `ecospec.drafters.base`), for a batch of rows like `Eagle3Drafter`. Keeps
    the head's KV cache of committed entries; tree entries appended by `expand` are dropped at the next `begin`
    (or when a different tree object is expanded). `target` supplies the embedding / lm_head the head has no copy
    of."""

    kind = "mtp"  # the drafter kind it drafts as (method.drafter; engine.scope)

    def __init__(self, head: MtpHead, target=None):
        if target is not None:
            head.tie(target)
        self.head = head
        self.vocab_size = head.config.vocab_size
        self.hidden_layers = (head.config.num_hidden_layers,)  # after model.norm (module docstring)
        self.reset()

    def reset(self, rows: int = 1) -> None:
        from transformers import DynamicCache

        self.cache = DynamicCache()
        self.slots = RowSlots(rows)
        self._topk = 1
        self._root_out: torch.Tensor | None = None  # head output at each row's root entry [B, H]
        self._drop_tree()

    def _drop_tree(self) -> None:
        crop_cache(self.cache, self.slots.crop())
        rows = self.slots.rows
        self._trees: list[DraftTree | None] = [None] * rows
        self._node_slot: list[dict[int, int]] = [{} for _ in range(rows)]  # node -> its cache slot
        self._node_out: list[dict[int, torch.Tensor]] = [{} for _ in range(rows)]  # node -> head output [H]

    def keep_rows(self, keep: list[int]) -> None:
        """Only rows `keep` (in that order) stay: finished sequences leave the batch."""
        drop_rows(self.cache, keep)
        self.slots.keep_rows(keep)
        if self._root_out is not None:
            self._root_out = self._root_out[torch.tensor(keep, dtype=torch.long, device=self._root_out.device)]
        self._trees = [self._trees[b] for b in keep]
        self._node_slot = [self._node_slot[b] for b in keep]
        self._node_out = [self._node_out[b] for b in keep]

    def _topk_children(self, logits: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
        if logits.dtype != torch.float64:
            logits = logits.float()
        return torch.log_softmax(logits, dim=-1).topk(k, dim=-1)

    @torch.no_grad()
    def begin(
        self, new_tokens: torch.Tensor, new_hidden: torch.Tensor | None, topk: int, depth: int | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if new_hidden is None:
            raise ValueError("MtpDrafter needs the target's final hidden states (hidden_layers is non-empty)")
        if new_tokens.dim() != 2 or new_tokens.shape[0] != 1 or new_hidden.dim() != 3 or new_hidden.shape[0] != 1:
            raise ValueError("begin expects new_tokens [1, m] and new_hidden [1, m', H] (batch size 1)")
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
        """`begin` for every row in one head forward (see `Eagle3Drafter.begin_rows`)."""
        if new_hidden is None:
            raise ValueError("MtpDrafter needs the target's final hidden states (hidden_layers is non-empty)")
        if len(new_tokens) != self.slots.rows or len(new_hidden) != self.slots.rows:
            raise ValueError(f"begin_rows: {len(new_tokens)} rows of tokens for a drafter of {self.slots.rows} rows")
        for toks, hid in zip(new_tokens, new_hidden, strict=True):
            m, m_h = toks.shape[0], hid.shape[0]
            if not 1 <= m_h <= m:
                raise ValueError(f"need 1 <= m' <= m, got m={m}, m'={m_h}")
            if hid.dim() != 2 or hid.shape[-1] != self.head.config.hidden_size:
                raise ValueError(f"new_hidden has width {hid.shape[-1]}, expected {self.head.config.hidden_size}")
        self._drop_tree()
        # new_hidden[b][j] (the row's target position committed + j) is paired with the token that follows it.
        counts = [h.shape[0] for h in new_hidden]
        tokens = pad_rows([t[t.shape[0] - c :] for t, c in zip(new_tokens, counts, strict=True)])
        positions, visible = self.slots.commit(counts)
        _, out = self.head(tokens, pad_rows(list(new_hidden)), positions, self.cache, visible, logits_to_keep=None)
        self._topk = topk
        self._root_out = out[torch.arange(len(counts)), torch.tensor(counts) - 1]
        return self._topk_children(self.head.logits(self._root_out), topk)

    @torch.no_grad()
    def expand(self, tree: DraftTree, beam: list[int], topk: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        logp, ids = self.expand_rows([tree], [beam], topk)
        return logp[0], ids[0]

    @torch.no_grad()
    def expand_rows(
        self, trees: list[DraftTree], beams: list[list[int]], topk: int | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """`expand` for every row, one head forward per missing tree level (see `Eagle3Drafter.expand_rows`)."""
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
        outs = torch.stack([torch.stack([outs[n] for n in b]) for b, outs in zip(beams, self._node_out, strict=True)])
        return self._topk_children(self.head.logits(outs), k)

    def _run_level(self, trees: list[DraftTree], nodes: list[list[int]]) -> None:
        hidden, tokens, positions, sees = [], [], [], []
        for b, (tree, level) in enumerate(zip(trees, nodes, strict=True)):
            parents = [tree.parents[n] for n in level]
            outs = self._node_out[b]
            hidden.append(torch.stack([self._root_out[b] if p < 0 else outs[p] for p in parents]))
            tokens.append(torch.tensor([tree.tokens[n] for n in level]))
            root_pos = self.slots.n[b] - 1  # the root's entry is the row's last committed one
            positions.append([root_pos + tree.depths[n] for n in level])
            sees.append([[self._node_slot[b][a] for a in tree.path(n)[:-1]] for n in level])
        start = self.slots.width
        qpos, visible = self.slots.tree(positions, sees)
        _, out = self.head(pad_rows(tokens), pad_rows(hidden), qpos, self.cache, visible, logits_to_keep=None)
        for b, level in enumerate(nodes):
            for i, n in enumerate(level):
                self._node_slot[b][n] = start + i
                self._node_out[b][n] = out[b, i]


def init_random_weights(head: MtpHead, std: float = 0.2, seed: int = 0) -> MtpHead:
    """Random weights (std 0.2 like the tiny targets), norm weights near (not at) 1, and a small random
    router bias, so every tensor matters (tests, smoke runs). Deterministic for a seed."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, t in [*head.named_parameters(), *head.named_buffers()]:
            noise = torch.randn(t.shape, generator=g, dtype=torch.float64)
            if name.endswith("norm.weight"):
                value = 1.0 + 0.1 * noise
            elif name.endswith("e_score_correction_bias"):
                value = 0.01 * noise
            else:
                value = std * noise
            t.copy_(value)
    return head
