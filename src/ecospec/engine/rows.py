"""Slot bookkeeping for a drafter's (or the predictor's) batched KV cache: which cache slots hold each row's
committed entries, and the positions of every slot.

A drafter's cache only ever grows at its end and shrinks from its end, so it needs no compaction (unlike the
target's cache in `engine.batch`, whose accepted path sits inside a verified block). Each SD step a row commits
the tokens the target accepted: one block of max_b(m_b) slots is appended for all rows, row b's first m_b of them
hold its entries, the rest are padding that nobody sees. The draft tree's levels are appended behind them (all
rows' nodes at the same slot indices) and cut off again before the next commit (`crop`). At batch size 1 there is
no padding, so the single-sequence drafters run through the same code; the masks are built in a handful of tensor
ops because they are built several times per SD step.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch


class RowSlots:
    """`valid` [B, C] bool: slot holds a committed entry of the row; `pos` [B, C]: every slot's position id;
    `n[b]`: row b's committed entries (= the position of its next committed entry)."""

    def __init__(self, rows: int):
        self._valid = torch.zeros(rows, 256, dtype=torch.bool)  # capacity doubles as needed; [:, :width] is live
        self._pos: list[list[int]] = [[] for _ in range(rows)]
        self._causal: dict[int, torch.Tensor] = {}
        self.n = [0] * rows
        self.width = 0
        self.committed_width = 0  # slots before the first tree slot
        self.dense = True  # no padding slot yet: every committed slot is valid (always at batch size 1)

    @property
    def rows(self) -> int:
        return len(self.n)

    @property
    def valid(self) -> torch.Tensor:
        return self._valid[:, : self.width]

    @property
    def pos(self) -> torch.Tensor:
        """[B, C]: the position id of every cached slot (sliding windows need it)."""
        return torch.tensor(self._pos, dtype=torch.long).view(self.rows, self.width)

    def commit(self, counts: Sequence[int]) -> tuple[torch.Tensor, torch.Tensor]:
        """Append a block of max(counts) slots; row b's first counts[b] are its next committed entries, causal
        behind its committed prefix. Returns (positions [B, q], visible [B, q, C + q]); a padded query sees
        only itself. Call `crop()` first when tree slots are cached."""
        if len(counts) != self.rows:
            raise ValueError(f"commit: {len(counts)} counts for {self.rows} rows")
        rows, q, c = self.rows, max(counts), self.width
        positions = [[n + j for j in range(q)] for n in self.n]
        causal = self._causal.get(q)
        if causal is None:
            causal = self._causal[q] = torch.ones(q, q, dtype=torch.bool).tril()
        self._grow(q)
        if min(counts) == q:  # no padding (always at batch size 1)
            committed = torch.ones(rows, q, c, dtype=torch.bool) if self.dense else self._valid[:, None, :c]
            vis = torch.cat([committed.expand(rows, q, c), causal.expand(rows, q, q)], dim=2)
            self._valid[:, c : c + q].fill_(True)
        else:
            committed = self._valid[:, None, :c]
            self.dense = False
            real = torch.arange(q)[None, :] < torch.tensor(list(counts))[:, None]  # [B, q]
            block = torch.where(real[:, :, None] & real[:, None, :], causal, torch.eye(q, dtype=torch.bool))
            vis = torch.cat([committed & real[:, :, None], block], dim=2)
            self._valid[:, c : c + q] = real
        self._extend(positions)
        self.n = [n + m for n, m in zip(self.n, counts, strict=True)]
        self.committed_width = self.width
        return torch.tensor(positions, dtype=torch.long), vis

    def tree(
        self, positions: Sequence[Sequence[int]], sees: Sequence[Sequence[Sequence[int]]]
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Append one block of tree queries (not committed): row b's query i sits at positions[b][i] and sees the
        row's committed slots, the cached tree slots sees[b][i] (its ancestors) and itself. Rows with fewer
        queries are padded (a padded query sees only itself). Returns (positions [B, q], visible [B, q, C + q])."""
        rows, q, c, cw = self.rows, max(len(p) for p in positions), self.width, self.committed_width
        # the committed part is the rows' valid slots; the tree part (earlier levels and this one) is small
        tree_rows = []
        for b in range(rows):
            block = []
            for i in range(q):
                row = [False] * (c - cw + q)
                if i < len(positions[b]):
                    for s in sees[b][i]:
                        row[s - cw] = True
                row[c - cw + i] = True
                block.append(row)
            tree_rows.append(block)
        tree = torch.tensor(tree_rows, dtype=torch.bool)  # [B, q, tree slots + q]
        if self.dense:
            committed = torch.ones(rows, q, cw, dtype=torch.bool)
        else:
            committed = self._valid[:, None, :cw].expand(rows, q, cw)
        if min(len(p) for p in positions) < q:
            real = torch.arange(q)[None, :] < torch.tensor([len(p) for p in positions])[:, None]  # [B, q]
            committed = committed & real[:, :, None]
        padded = [list(p) + [p[-1] if p else 0] * (q - len(p)) for p in positions]
        self._grow(q)  # tree slots are never committed: they stay False, as every slot past the width is
        self._extend(padded)
        return torch.tensor(padded, dtype=torch.long), torch.cat([committed, tree], dim=2)

    def crop(self) -> int:
        """Forget the tree slots (everything behind the last committed block); returns the width to crop the
        cache to."""
        cw = self.committed_width
        if self.width > cw:
            self.width = cw
            self._pos = [p[:cw] for p in self._pos]
        return cw

    def keep_rows(self, keep: Sequence[int]) -> None:
        self._valid = self._valid[torch.tensor(list(keep), dtype=torch.long)]
        self._pos = [self._pos[b] for b in keep]
        self.n = [self.n[b] for b in keep]

    def _grow(self, q: int) -> None:
        """Make room for q more slots. Every slot past the width is False (slots are committed only by `commit`, and
        `crop` cuts tree slots, which are never set), so new slots need no clearing."""
        if self.width + q > self._valid.shape[1]:
            bigger = torch.zeros(self.rows, 2 * (self.width + q), dtype=torch.bool)
            bigger[:, : self.width] = self.valid
            self._valid = bigger
        self.width += q

    def _extend(self, positions: list[list[int]]) -> None:
        for mine, new in zip(self._pos, positions, strict=True):
            mine.extend(new)


def moved(t: torch.Tensor, device: torch.device, dtype: torch.dtype | None = None) -> torch.Tensor:
    """`t` on `device` (and in `dtype`): itself when it is there already (a no-op `.to` is still a dispatched op,
    and a drafter runs several a step)."""
    if t.device == device and (dtype is None or t.dtype == dtype):
        return t
    return t.to(device=device, dtype=dtype if dtype is not None else t.dtype)


def pad_rows(rows: Sequence[torch.Tensor], value: float = 0) -> torch.Tensor:
    """Stack tensors [m_b, ...] into [B, max m_b, ...], padded at the end with `value`."""
    q = max(r.shape[0] for r in rows)
    if all(r.shape[0] == q for r in rows):
        return torch.stack(list(rows))
    out = rows[0].new_full((len(rows), q, *rows[0].shape[1:]), value)
    for b, r in enumerate(rows):
        out[b, : r.shape[0]] = r
    return out


def aligned_levels(levels: Sequence[Sequence[list[int]]]) -> list[list[list[int]]]:
    """Per-row missing tree levels (`tree.missing_levels`, shallowest first) -> one list of the rows' nodes per
    forward. Rows must need the same number of levels: a batched drafter runs a level for every row at once."""
    if len({len(row) for row in levels}) > 1:
        raise ValueError("expand_rows: the rows' beams need different numbers of tree levels; grow them alike")
    return [list(level) for level in zip(*levels, strict=True)]
