"""What the decode loop asks of a drafter (EAGLE-3 head, MTP head, separate draft LM): the protocol every kind's
`load` (`drafters.registry`) returns.

A drafter keeps its own KV cache of the committed sequences, one row per sequence of the batch (`reset(rows=B)`;
one sequence is a batch of one). Each SD step the loop calls `begin_rows` with what each row committed since the
previous call, then `expand_rows` depth-1 times to grow every row's tree at once (`engine.tree.grow_trees`); when
sequences finish, `keep_rows` keeps the others. Tree entries a drafter appends to its cache during `expand_rows`
are its own business: it drops them at the next `begin_rows`. `begin` and `expand` are the one-row forms, for
tests and analyses that grow one tree (`engine.tree.grow_tree`); the loop never calls them, so a new drafter may
leave them out.
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
        """Forget the sequences (new prompts): `rows` of them, each a row of the batch."""

    def begin_rows(
        self,
        new_tokens: list[torch.Tensor],
        new_hidden: list[torch.Tensor] | None,
        topk: int,
        depth: int | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Consume each row's committed tokens and return its root's top-k children: (log-probs [B, k], target
        ids [B, k]).

        new_tokens[b] [m_b]: the tokens row b committed since the last call; the last one is its root (the step's
        bonus token). On the first call after `reset` it is the whole prompt followed by the root.
        new_hidden[b] [m'_b, F] (only when hidden_layers is non-empty): the target's hidden states, concatenated
        over hidden_layers, at the positions *before* new_tokens[b][-m'_b:], i.e. new_hidden[b][j] was computed
        at the token preceding new_tokens[b][m_b - m'_b + j] (first call: the prompt positions, m'_b = m_b - 1;
        later: the previous root and accepted nodes).
        depth: how many levels this step's trees will grow (None: unknown), for a drafter that drafts ahead (the
        compiled EAGLE-3 head); one that drafts level by level ignores it.
        """
        ...

    def expand_rows(
        self, trees: list[DraftTree], beams: list[list[int]], topk: int | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Run the drafter on every row's beam nodes (their ancestors were beam nodes of earlier levels; the rows'
        beams alike in shape) and return their top-k children: (log-probs [B, beam, k], target ids [B, beam, k])."""
        ...

    def keep_rows(self, keep: list[int]) -> None:
        """Only rows `keep` (in that order) stay: finished sequences leave the batch."""

    def begin(
        self, new_tokens: torch.Tensor, new_hidden: torch.Tensor | None, topk: int, depth: int | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """`begin_rows` for one row: new_tokens [1, m], new_hidden [1, m', F]; returns [k] each."""
        ...

    def expand(self, tree: DraftTree, beam: list[int], topk: int) -> tuple[torch.Tensor, torch.Tensor]:
        """`expand_rows` for one row: (log-probs [len(beam), k], target ids [len(beam), k])."""
        ...
