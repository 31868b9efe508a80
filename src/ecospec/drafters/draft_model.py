"""A separate, smaller causal LM with the target's vocabulary as the drafter."""

from __future__ import annotations

import torch

from ecospec.engine.batch import drop_rows
from ecospec.engine.forward import attention_layout, forward_block, new_cache
from ecospec.engine.rows import RowSlots, aligned_levels, moved, pad_rows
from ecospec.engine.tree import DraftTree, missing_levels


class DraftModelDrafter:
    """Wraps any HF causal LM sharing the target's vocabulary, for a batch of rows like `Eagle3Drafter`.

    Its cache holds the committed sequence of every row (`engine.rows.RowSlots`); tree nodes of the current step
    are appended behind it (one slot per expanded node) and dropped at the next `begin`.
    """

    kind = "draft_model"  # the drafter kind it drafts as (method.drafter; engine.scope)

    hidden_layers: tuple[int, ...] = ()

    def __init__(self, model):
        self.model = model.eval()
        self.vocab_size = model.config.vocab_size
        self.reset()

    def reset(self, rows: int = 1) -> None:
        self.layout = attention_layout(self.model.config, self.model)  # per generation: the model may have moved
        self.device = self.model.device
        self.cache = new_cache()
        self.slots = RowSlots(rows)
        self._drop_tree()

    def _drop_tree(self) -> None:
        width = self.slots.width
        if width > self.slots.crop():
            self.cache.crop(self.slots.width - width)  # transformers >= 5.24: crop(-n) drops the last n
        rows = self.slots.rows
        self._trees: list[DraftTree | None] = [None] * rows
        self._node_slot: list[dict[int, int]] = [{} for _ in range(rows)]  # tree node -> its cache slot
        self._outputs: list[torch.Tensor] = []  # logits [B, q, V] of this step's tree forwards
        self._node_logits: list[dict[int, tuple[int, int]]] = [{} for _ in range(rows)]  # node -> (output, query)

    def keep_rows(self, keep: list[int]) -> None:
        """Only rows `keep` (in that order) stay: finished sequences leave the batch."""
        drop_rows(self.cache, keep)
        self.slots.keep_rows(keep)
        self._trees = [self._trees[b] for b in keep]
        self._node_slot = [self._node_slot[b] for b in keep]
        self._node_logits = [self._node_logits[b] for b in keep]
        index = torch.tensor(list(keep), dtype=torch.long)
        self._outputs = [out.index_select(0, index.to(out.device)) for out in self._outputs]

    def _forward(self, tokens: torch.Tensor, qpos: torch.Tensor, vis: torch.Tensor, keep) -> torch.Tensor:
        kpos = moved(self.slots.pos, self.device) if self.layout.windowed else None  # only sliding windows read them
        dev = self.device
        out = forward_block(
            self.model,
            self.layout,
            self.cache,
            moved(tokens, dev),
            moved(qpos, dev),
            kpos,
            moved(vis, dev),
            logits_to_keep=keep,
        )
        return out.logits

    @staticmethod
    def _topk(logits: torch.Tensor, topk: int) -> tuple[torch.Tensor, torch.Tensor]:
        logits = logits if logits.dtype == torch.float32 else logits.float()
        return torch.log_softmax(logits, dim=-1).topk(topk, dim=-1)

    @torch.no_grad()
    def begin(self, new_tokens: torch.Tensor, new_hidden, topk: int, depth=None) -> tuple[torch.Tensor, torch.Tensor]:
        return self._topk(self._begin([new_tokens[0]])[0], topk)

    @torch.no_grad()
    def begin_rows(
        self, new_tokens: list[torch.Tensor], new_hidden, topk: int, depth: int | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """`begin` for every row in one forward: new_tokens[b] [m_b] -> (log-probs [B, k], ids [B, k])."""
        return self._topk(self._begin(new_tokens), topk)

    def _begin(self, new_tokens: list[torch.Tensor]) -> torch.Tensor:
        """Commit every row's new tokens in one forward; the logits [B, V] at each row's last one."""
        if len(new_tokens) != self.slots.rows:
            raise ValueError(f"begin_rows: {len(new_tokens)} rows of tokens for a drafter of {self.slots.rows} rows")
        self._drop_tree()
        counts = [t.shape[0] for t in new_tokens]
        qpos, vis = self.slots.commit(counts)
        last = sorted({c - 1 for c in counts})  # each row's last new token: the logits to keep
        logits = self._forward(pad_rows(list(new_tokens)), qpos, vis, torch.tensor(last) if len(last) > 1 else 1)
        if len(last) == 1:  # every row's last new token at the same query (always at batch size 1)
            return logits[:, 0]
        col = [last.index(c - 1) for c in counts]
        return logits[torch.arange(len(counts)), torch.tensor(col)]

    @torch.no_grad()
    def expand(self, tree: DraftTree, beam: list[int], topk: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self._topk(self._expand([tree], [beam]), topk)  # one row: [beam, V] -> [beam, k]

    @torch.no_grad()
    def expand_rows(
        self, trees: list[DraftTree], beams: list[list[int]], topk: int
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Children of every row's beam nodes ([B, beam, k] twice): the beam nodes (and any ancestor not yet in the
        cache) run through the model, one forward per tree level for all rows."""
        logp, ids = self._topk(self._expand(trees, beams), topk)
        return logp.view(len(beams), -1, topk), ids.view(len(beams), -1, topk)

    def _expand(self, trees: list[DraftTree], beams: list[list[int]]) -> torch.Tensor:
        """The logits [B * beam, V] of every row's beam nodes, rows back to back."""
        if any(t is not mine for t, mine in zip(trees, self._trees, strict=True)):
            self._drop_tree()
            self._trees = list(trees)
        levels = [missing_levels(t, b, slots) for t, b, slots in zip(trees, beams, self._node_slot, strict=True)]
        for nodes in aligned_levels(levels):
            positions, sees = [], []
            for b, (tree, level) in enumerate(zip(trees, nodes, strict=True)):
                root_pos = self.slots.n[b] - 1  # the root is the row's last committed token
                positions.append([root_pos + tree.depths[n] for n in level])
                sees.append([[self._node_slot[b][a] for a in tree.path(n)[:-1]] for n in level])
            start = self.slots.width
            ids = [[t.tokens[n] for n in level] for t, level in zip(trees, nodes, strict=True)]
            same = len({len(row) for row in ids}) == 1  # one tensor op where no row needs padding
            tokens = torch.tensor(ids) if same else pad_rows([torch.tensor(row) for row in ids])
            qpos, vis = self.slots.tree(positions, sees)
            self._outputs.append(self._forward(tokens, qpos, vis, 0))
            for b, level in enumerate(nodes):
                for i, n in enumerate(level):
                    self._node_slot[b][n] = start + i
                    self._node_logits[b][n] = (len(self._outputs) - 1, i)
        refs = [[lg[n] for n in beam] for beam, lg in zip(beams, self._node_logits, strict=True)]
        if all(o == refs[0][0][0] for row in refs for o, _ in row):  # the usual case: the newest level, one gather
            out = self._outputs[refs[0][0][0]]
            flat = torch.tensor([b * out.shape[1] + i for b, row in enumerate(refs) for _, i in row], device=out.device)
            return out.flatten(0, 1).index_select(0, flat)
        return torch.stack([self._outputs[o][b, i] for b, row in enumerate(refs) for o, i in row])
