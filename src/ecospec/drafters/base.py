"""What the decode loops ask of a drafter (EAGLE-3 head, MTP head, separate draft LM): the protocol every kind's
`load` (`drafters.registry`) returns.

A drafter keeps its own KV cache of the committed sequence. Each SD step the loop calls `begin`
with what was committed since the previous call, then `expand` depth-1 times to grow the tree
(see `ecospec.engine.tree.grow_tree`). Tree entries a drafter appends to its cache during `expand`
are its own business: it drops them at the next `begin`. The batched loop (`generate_batch`) calls the row forms:
`reset(rows=B)`, then `begin_rows` / `expand_rows` over every row at once (`grow_trees`). A drafter that only runs
at batch 1 may leave the row methods out; `generate_batch` then fails on it by name.
"""

from __future__ import annotations

from typing import Protocol

import torch

from ecospec.engine.tree import DraftTree


class Drafter(Protocol):
    kind: str  # the drafter kind it drafts as (`drafters.registry`; the compiled engine's check reads it)
    vocab_size: int  # size of the target vocabulary it proposes tokens in
    hidden_layers: tuple[int, ...]  # target `hidden_states` indices it needs; () for none

    def reset(self, rows: int = 1) -> None:
        """Forget the sequence(s) (new prompts): `rows` sequences for the batched loop."""

    def begin(
        self, new_tokens: torch.Tensor, new_hidden: torch.Tensor | None, topk: int, depth: int | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Consume committed tokens and return the root's top-k children: (log-probs [k], target ids [k]).

        new_tokens [1, m]: tokens committed since the last call; the last one is the root (the step's
        bonus token). On the first call after `reset` it is the whole prompt followed by the root.
        new_hidden [1, m', F] (only when hidden_layers is non-empty): the target's hidden states,
        concatenated over hidden_layers, at the positions *before* new_tokens[-m':], i.e.
        new_hidden[:, j] was computed at the token preceding new_tokens[:, m - m' + j]
        (first call: the prompt positions, m' = m - 1; later: the previous root and accepted nodes).
        depth: how many levels this step's tree will grow (None: unknown), for a drafter that drafts ahead (the
        compiled EAGLE-3 head); one that drafts level by level ignores it.
        """
        ...

    def expand(self, tree: DraftTree, beam: list[int], topk: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Run the drafter on the beam nodes (their ancestors were beam nodes of earlier levels) and
        return their top-k children: (log-probs [len(beam), k], target ids [len(beam), k])."""
        ...

    def begin_rows(
        self, new_tokens: list[torch.Tensor], new_hidden: list[torch.Tensor] | None, topk: int
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """`begin` for every row at once: new_tokens[b] [m_b], new_hidden[b] [m'_b, F]; returns [B, k] each."""
        ...

    def expand_rows(
        self, trees: list[DraftTree], beams: list[list[int]], topk: int | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """`expand` for every row at once: (log-probs [B, beam, k], target ids [B, beam, k])."""
        ...
