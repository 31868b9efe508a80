"""Verify-pass traces of a result record (`record["trace"]`, cells with trace_steps > 0) as routing data.

A trace entry is one verify pass: {"prompt", "turn", "step", "tokens", "parents" (block index of each token's
parent, -1 for the root), "depths" (root 0), "path" (accepted block indices, root first), "routes" ([MoE layers]
[block tokens][k] expert ids)}. Two views of it:

* `sequence_routes`: the committed sequence's routes. A pass's root is the previous pass's bonus token (the first
  pass's is the last prompt token) and its accepted path the tokens after it, so the paths of consecutive steps,
  concatenated, are the routes of every committed token once, in order (last prompt token first); tree attention is
  exact, so they equal a plain forward's (`tests/test_routing.py`). A missing step (a trace cut short) ends the run:
  the steps after it start a new sequence, so no token pair spans the gap.
* `draft_tokens`: one row per drafted block token (root excluded) for the acceptance analysis: depth, accepted,
  first-rejected (not accepted, and its parent is accepted or the root: the first rejection on its branch; deeper
  tokens under it were never in the running), consecutive overlap with its parent and anchor overlap with the root.
  Overlap of two tokens = mean over MoE layers of |S_a ∩ S_b| / k.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, fields

import numpy as np


def block_routes(step: Mapping) -> np.ndarray:
    """A pass's routes as [block tokens, MoE layers, k] (the trace stores [layers][tokens][k])."""
    routes = np.asarray(step["routes"], dtype=np.int64)
    if routes.ndim != 3 or routes.shape[1] != len(step["tokens"]):
        n = len(step["tokens"])
        raise ValueError(f"trace routes must be [MoE layers][{n} block tokens][k], got {routes.shape}")
    return routes.transpose(1, 0, 2)


def sequence_routes(trace: Iterable[Mapping]) -> list[tuple[tuple, np.ndarray]]:
    """((prompt, turn), routes [tokens, MoE layers, k]) of each committed sequence, in first-seen order; a
    (prompt, turn) whose steps have a gap gives one sequence per run of consecutive steps."""
    by_key: dict[tuple, dict[int, Mapping]] = {}
    for step in trace:
        by_key.setdefault((step["prompt"], step["turn"]), {})[int(step["step"])] = step
    out = []
    for key, steps in by_key.items():
        run: list[np.ndarray] = []
        previous = None
        for i in sorted(steps):
            if previous is not None and i != previous + 1 and run:
                out.append((key, np.concatenate(run)))
                run = []
            run.append(block_routes(steps[i])[list(steps[i]["path"])])
            previous = i
        out.append((key, np.concatenate(run)))
    return out


@dataclass(frozen=True)
class DraftTokens:
    """One row per drafted block token of a set of verify passes."""

    depth: np.ndarray  # int: draft depth (1 = child of the root)
    accepted: np.ndarray  # bool: on the accepted path
    first_rejected: np.ndarray  # bool: not accepted, parent accepted or the root
    overlap: np.ndarray  # float: consecutive overlap with the parent
    anchor: np.ndarray  # float: overlap with the root (= overlap at depth 1)

    def __len__(self) -> int:
        return len(self.depth)

    def select(self, mask) -> DraftTokens:
        return DraftTokens(**{f.name: getattr(self, f.name)[mask] for f in fields(self)})

    @classmethod
    def concat(cls, parts: Iterable[DraftTokens]) -> DraftTokens:
        parts = list(parts)
        if not parts:
            return cls(np.zeros(0, int), np.zeros(0, bool), np.zeros(0, bool), np.zeros(0), np.zeros(0))
        return cls(**{f.name: np.concatenate([getattr(p, f.name) for p in parts]) for f in fields(cls)})


def _overlap(routes: np.ndarray, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Mean over layers of |S_a ∩ S_b| / k for token index arrays a, b of a block's routes [tokens, layers, k]."""
    same = routes[a][..., :, None] == routes[b][..., None, :]  # [pairs, layers, k, k]
    return same.sum(axis=(-1, -2)).mean(axis=-1) / routes.shape[-1]


def step_draft_tokens(step: Mapping) -> DraftTokens:
    """The drafted tokens (block index >= 1) of one verify pass."""
    routes = block_routes(step)
    parents = np.asarray(step["parents"], dtype=np.int64)
    n = len(parents)
    if n < 2:
        return DraftTokens.concat([])
    if parents[0] != -1 or np.any(parents[1:] < 0) or np.any(parents[1:] >= np.arange(1, n)):
        raise ValueError(f"block parents must be -1 for the root and point to earlier tokens, got {parents.tolist()}")
    idx = np.arange(1, n)
    on_path = np.zeros(n, dtype=bool)
    on_path[list(step["path"])] = True
    accepted = on_path[idx]
    return DraftTokens(
        depth=np.asarray(step["depths"], dtype=np.int64)[idx],
        accepted=accepted,
        first_rejected=~accepted & on_path[parents[idx]],  # the root is always on the path
        overlap=_overlap(routes, idx, parents[idx]),
        anchor=_overlap(routes, idx, np.zeros_like(idx)),
    )


def draft_tokens(trace: Iterable[Mapping]) -> DraftTokens:
    """The drafted tokens of every verify pass of a trace."""
    return DraftTokens.concat(step_draft_tokens(s) for s in trace)
