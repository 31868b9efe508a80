"""A separate, smaller causal LM with the target's vocabulary as the drafter."""

from __future__ import annotations

import torch

from ecospec.engine.forward import attention_layout, forward_block, new_cache
from ecospec.engine.tree import DraftTree


class DraftModelDrafter:
    """Wraps any HF causal LM sharing the target's vocabulary.

    Its cache holds the committed sequence; tree nodes of the current step are appended behind it
    (one slot per expanded beam node) and dropped at the next `begin`.
    """

    hidden_layers: tuple[int, ...] = ()

    def __init__(self, model):
        self.model = model.eval()
        self.vocab_size = model.config.vocab_size
        self.layout = attention_layout(model.config)
        self.reset()

    def reset(self) -> None:
        self.cache = new_cache()
        self.committed = 0
        self.slots: dict[int, int] = {}  # tree node -> its slot index behind the committed cache
        self.slot_pos: list[int] = []  # position id of each slot

    def _topk(self, logits: torch.Tensor, topk: int) -> tuple[torch.Tensor, torch.Tensor]:
        return torch.log_softmax(logits.float(), dim=-1).topk(topk, dim=-1)

    @torch.no_grad()
    def begin(self, new_tokens: torch.Tensor, new_hidden, topk: int) -> tuple[torch.Tensor, torch.Tensor]:
        dev = self.model.device
        extra = self.cache.get_seq_length() - self.committed
        if extra:
            self.cache.crop(-extra)
        self.slots, self.slot_pos = {}, []
        m = new_tokens.shape[1]
        c = self.committed
        pos = torch.arange(c, c + m, device=dev)
        kpos = torch.arange(c + m, device=dev)
        vis = torch.ones(m, c + m, dtype=torch.bool, device=dev).tril(diagonal=c)
        out = forward_block(self.model, self.layout, self.cache, new_tokens.to(dev), pos, kpos, vis, logits_to_keep=1)
        self.committed = c + m
        logp, ids = self._topk(out.logits[0, -1], topk)
        return logp, ids

    @torch.no_grad()
    def expand(self, tree: DraftTree, beam: list[int], topk: int) -> tuple[torch.Tensor, torch.Tensor]:
        dev = self.model.device
        c, s, b = self.committed, len(self.slot_pos), len(beam)
        root_pos = c - 1
        qpos = [root_pos + tree.depths[n] for n in beam]
        rows = []  # per beam node: which tree slots it sees (its ancestors, beam nodes of earlier levels, and itself)
        for row, node in enumerate(beam):
            seen = [False] * (s + b)
            anc = tree.parents[node]
            while anc >= 0:
                seen[self.slots[anc]] = True
                anc = tree.parents[anc]
            seen[s + row] = True
            rows.append(seen)
        vis = torch.cat([torch.ones(b, c, dtype=torch.bool), torch.tensor(rows, dtype=torch.bool)], dim=1)
        for row, node in enumerate(beam):
            self.slots[node] = s + row
        self.slot_pos.extend(qpos)
        qpos_t = torch.tensor(qpos, device=dev)
        kpos = torch.cat([torch.arange(c, device=dev), torch.tensor(self.slot_pos, device=dev)])
        tokens = torch.tensor([[tree.tokens[n] for n in beam]], device=dev)
        out = forward_block(self.model, self.layout, self.cache, tokens, qpos_t, kpos, vis.to(dev))
        return self._topk(out.logits[0], topk)
