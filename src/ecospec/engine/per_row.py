"""A batch's EAGLE-3 head and expert predictor on the compiled engine: one copy of the one-sequence part per row
(`CompiledEagle3`, `CompiledPredictor`: each its own KV cache and step buffers, the weights shared), the loop's row
calls handed to each live row's copy in turn.

    drafter = prepare_drafter(head, gamma=6, depth=3, topk=2, max_len=512, rows=8)   # a `PerRow` of 8

Why a pass a row and not one pass over the rows: on the CPU each copy's pass is one native call, so B of them cost
B calls and B reads of weights that the cache still holds after the first, where the eager head's batched pass pays
its per-op overhead at every level (docs/engine.md, "A batch"). Only the native form is run this way: inductor's
graphs would compile once per copy, so a batch there keeps the eager head and predictor.
"""

from __future__ import annotations

import torch

from ecospec.engine.tree import DraftTree


class PerRow:
    """`parts`: one prepared one-sequence part per row; `live`: the part of each sequence the loop decodes, in its
    order. The drafter's and the predictor's row calls; what the loop or a record reads of the part itself (kind,
    vocab_size, hidden_layers, logits_log, static) is the first copy's, the same for all."""

    def __init__(self, parts: list):
        self.parts = parts
        self.live = list(range(len(parts)))
        self.compile_s = sum(p.compile_s for p in parts)

    def __getattr__(self, name: str):
        if name == "parts":  # not set yet (copy, pickle): no delegation
            raise AttributeError(name)
        return getattr(self.parts[0], name)

    def reset(self, rows: int = 1) -> None:
        if rows > len(self.parts):
            raise ValueError(f"{rows} sequences; the compiled head and predictor were prepared for {len(self.parts)}")
        self.live = list(range(rows))
        for part in self.parts[:rows]:
            part.reset()

    def keep_rows(self, keep: list[int]) -> None:
        self.live = [self.live[i] for i in keep]

    def _each(self, call: str, *rows, **same):
        """`call` on each live row's part with that row's arguments (`rows`: one list per argument) and `same`."""
        return [getattr(self.parts[p], call)(*args, **same) for p, *args in zip(self.live, *rows, strict=True)]

    def begin_rows(self, new_tokens: list[torch.Tensor], new_hidden: list[torch.Tensor] | None, topk: int, depth=None):
        hidden = [None] * len(new_tokens) if new_hidden is None else [h[None] for h in new_hidden]
        out = self._each("begin", [t[None] for t in new_tokens], hidden, topk=topk, depth=depth)
        return torch.stack([v for v, _ in out]), torch.stack([i for _, i in out])

    def expand_rows(self, trees: list[DraftTree], beams: list[list[int]], topk: int | None = None):
        out = self._each("expand", trees, beams, topk=topk)
        return torch.stack([v for v, _ in out]), torch.stack([i for _, i in out])

    def predict_rows(self, new_tokens: list[torch.Tensor], trees: list[DraftTree]) -> tuple[list[int], list[list[int]]]:
        out = self._each("predict", [t[None] for t in new_tokens], trees)
        return [root for root, _ in out], [nodes for _, nodes in out]
