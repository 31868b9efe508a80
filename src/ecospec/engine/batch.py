"""One target forward over a batch of sequences, each with its own block (a prompt, or a root and its tree).

The batched verify pass of docs/design.md ("Batches"): every row has its own committed length, positions and tree
mask; one forward runs them all. Layout of the shared `DynamicCache` (right-padded): row b's committed entries
are slots [0, lengths[b]) at positions 0..lengths[b]-1; slots beyond are padding or stale and never visible.
A forward appends its q block slots after the cache's C slots (q = the longest block; shorter blocks are padded
with queries that see only themselves, and nobody sees them). `compact_rows` then keeps, per row, its prefix
and its accepted block slots and moves them to the front, so the layout holds again.

Padded queries still run through the model (and its routers): `forward_rows` returns which queries are real,
so routing counts and logits can leave the padding out.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from transformers import DynamicCache

from ecospec.engine.forward import AttentionLayout, cache_len, filled_layers, forward_block


@dataclass(frozen=True)
class RowBlock:
    """One row's block: its tokens, each token's position offset from the row's committed length, and which
    block tokens each token sees besides the committed prefix (bool [n, n], diagonal set; a prompt's is
    lower-triangular, a tree's its ancestor mask)."""

    tokens: list[int]
    offsets: list[int]
    visible: torch.Tensor


def forward_rows(
    model,
    layout: AttentionLayout,
    cache: DynamicCache,
    lengths: Sequence[int],
    blocks: Sequence[RowBlock],
    *,
    hidden: bool = False,
    pad_token_id: int = 0,
):
    """Run every row's block against its committed prefix in one forward; return (HF output, real [B, q] bool).

    Row b's block token j sits at position lengths[b] + offsets[j] and sees the row's committed slots and the
    block tokens its `visible` row allows (sliding-window layers: only keys within the window)."""
    if len(lengths) != len(blocks):
        raise ValueError(f"forward_rows: {len(lengths)} lengths for {len(blocks)} blocks")
    rows, q, c = len(blocks), max(len(b.tokens) for b in blocks), cache_len(cache)
    tokens = torch.full((rows, q), pad_token_id, dtype=torch.long)
    qpos = torch.zeros(rows, q, dtype=torch.long)
    kpos = torch.zeros(rows, c + q, dtype=torch.long)
    vis = torch.zeros(rows, q, c + q, dtype=torch.bool)
    real = torch.zeros(rows, q, dtype=torch.bool)
    for b, (n, blk) in enumerate(zip(lengths, blocks, strict=True)):
        m = len(blk.tokens)
        if n > c:
            raise ValueError(f"forward_rows: row {b} has {n} committed entries, the cache {c}")
        tokens[b, :m] = torch.tensor(blk.tokens, dtype=torch.long)
        qpos[b, :m] = n + torch.tensor(blk.offsets, dtype=torch.long)
        qpos[b, m:] = n  # padding: any valid position; it attends to itself only
        kpos[b, :c] = torch.arange(c)
        kpos[b, c:] = qpos[b]
        vis[b, :m, :n] = True
        vis[b, :m, c : c + m] = blk.visible
        vis[b, m:, c + m :] = torch.eye(q - m, dtype=torch.bool)
        real[b, :m] = True
    device = model.device
    out = forward_block(
        model, layout, cache, tokens.to(device), qpos.to(device), kpos.to(device), vis.to(device), hidden=hidden
    )
    return out, real


def compact_rows(cache: DynamicCache, lengths: Sequence[int], start: int, keeps: Sequence[Sequence[int]]) -> list[int]:
    """After a forward whose block began at slot `start`: row b keeps slots [0, lengths[b]) and start + keeps[b][i]
    (in that order), moved to the front; the cache is cut to the longest row. Returns the new lengths."""
    new = [n + len(k) for n, k in zip(lengths, keeps, strict=True)]
    width = max(new)
    index = torch.zeros(len(new), width, dtype=torch.long)
    for b, (n, keep) in enumerate(zip(lengths, keeps, strict=True)):
        row = list(range(n)) + [start + i for i in keep]
        index[b, : len(row)] = torch.tensor(row, dtype=torch.long)
    for layer in filled_layers(cache):
        i = index.to(layer.keys.device)[:, None, :, None]
        layer.keys = layer.keys.gather(2, i.expand(-1, layer.keys.shape[1], -1, layer.keys.shape[3]))
        layer.values = layer.values.gather(2, i.expand(-1, layer.values.shape[1], -1, layer.values.shape[3]))
    return new


def drop_rows(cache: DynamicCache, keep: Sequence[int]) -> None:
    """Keep only cache rows `keep` (in that order): finished sequences leave the batch."""
    index = torch.tensor(list(keep), dtype=torch.long)
    for layer in filled_layers(cache):
        i = index.to(layer.keys.device)
        layer.keys, layer.values = layer.keys.index_select(0, i), layer.values.index_select(0, i)
