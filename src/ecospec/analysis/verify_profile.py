"""A verify-cost profile: what a step costs on the engine and machine that run the cells, measured by
`python -m ecospec.bench.profile` (`fit_verify` fits its verify line); the methods that price a step in seconds read
it at decode time. Where profiles live and how a cell loads one: `analysis.profiles`."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace

import numpy as np

PROFILE_VERSION = 4  # a profile written by another version is made again (`analysis.profiles.load_profile`)


@dataclass(frozen=True)
class VerifyProfile:
    """What a step costs on one engine and machine, measured (`python -m ecospec.bench.profile`): a verify pass as
    a line in its tokens and its unique experts per MoE layer (`t_verify`), the loop's own cost per step
    (`overhead_s`: what a real AR step costs beyond its verify pass), one drafter pass of each shape the methods
    use, the expert predictor's pass, and the unique experts per layer a block of t tokens of real text routes to
    (`experts`). The same questions `modeled_step` answers from weight bytes on a GPU profile (one cost interface,
    two sources: measured here, roofline there)."""

    model: str
    engine: str
    dtype: str
    processor: str
    layers: int  # MoE layers the verify fit covers (the model's)
    intercept_s: float  # a pass's fixed seconds
    per_token_s: float  # seconds per token in the block
    per_expert_layer_s: float  # seconds per unique expert per MoE layer
    r2: float
    points: int
    ar_step_s: float  # one AR step of the decode loop, everything included
    overhead_s: float  # ar_step_s minus the fit's AR pass: the loop's cost per step outside the verify pass
    draft_pass_s: dict  # drafter shape ("tree", "chain") -> seconds of one head pass
    predictor_pass_s: float | None
    experts_by_tokens: dict  # str(t) -> mean unique experts per MoE layer of t consecutive tokens
    source: str
    # str(t) -> [seconds, unique experts per layer]: the mean verify phase of real steps of t tokens and their mean E
    verify_by_tokens: dict | None = None
    # str(B) -> {str(t): [seconds, unique experts per layer over the batch]}: the mean verify phase of real batched
    # passes of B sequences whose longest block is t tokens (a batch runs padded to it), B > 1
    verify_by_batch: dict | None = None
    draft_by_batch: dict | None = None  # str(B) -> seconds of one tree head pass over B sequences, B > 1
    # "head" / "predictor" -> [seconds, seconds per token]: what a step's drafting (its predictor's pass) costs beyond
    # its usual passes when the drafter first runs over tokens it has not seen (the prompt, or the steps since it last
    # drafted), as a line in those tokens
    catchup: dict | None = None
    version: int = PROFILE_VERSION

    def t_verify(self, tokens: int, experts_per_layer: float) -> float:
        """A verify pass of `tokens` tokens routed to `experts_per_layer` unique experts per MoE layer: the real
        steps of that size, their experts repriced at `per_expert_layer_s`, where measured; else the line."""
        measured = (self.verify_by_tokens or {}).get(str(tokens))
        if measured is not None:
            seconds, experts = measured
            return seconds + self.per_expert_layer_s * (experts_per_layer - experts) * self.layers
        return self.intercept_s + self.per_token_s * tokens + self.per_expert_layer_s * experts_per_layer * self.layers

    def experts(self, tokens: int) -> float:
        """The expected unique experts per layer of a block of `tokens` (the largest measured size beyond them)."""
        sizes = sorted(int(t) for t in self.experts_by_tokens)
        return float(self.experts_by_tokens[str(min(tokens, sizes[-1]))])

    def t_catchup(self, tokens: int, gamma: int, predictor: bool = False) -> float:
        """What drafting costs beyond a step's usual passes when the head (and the predictor) first take `tokens`
        they have not seen: nothing up to a step's own `gamma`, else the measured line (none measured: nothing)."""
        if tokens <= gamma or not self.catchup:
            return 0.0
        parts = ("head", "predictor") if predictor else ("head",)
        return sum(max(0.0, a + b * tokens) for a, b in (self.catchup.get(p, (0.0, 0.0)) for p in parts))

    def t_step(self, draft_s: float, tokens: int, experts_per_layer: float | None = None) -> float:
        """A whole SD step: the loop's overhead, drafting `draft_s`, and a verify pass of `tokens` (with
        `experts_per_layer`, or the expected count for that many tokens)."""
        e = self.experts(tokens) if experts_per_layer is None else experts_per_layer
        return self.overhead_s + draft_s + self.t_verify(tokens, e)

    def t_batch(self, sequences: int, tokens: int) -> float:
        """A verify pass of `sequences` sequences whose longest block is `tokens` tokens: one sequence's
        `t_verify` at the experts that many tokens route to; a batch's real passes of that shape where measured
        (`verify_by_batch`); between or beyond the measured batch sizes, the straight line in the batch size
        through the nearest two (one sequence counting as measured); else the line over every row's tokens."""
        if sequences == 1:
            return self.t_verify(tokens, self.experts(tokens))
        by_size = {1: self.t_verify(tokens, self.experts(tokens))}
        for b, by_t in (self.verify_by_batch or {}).items():
            if str(tokens) in by_t:
                by_size[int(b)] = by_t[str(tokens)][0]
        if sequences in by_size:
            return by_size[sequences]
        if len(by_size) > 1:
            sizes = sorted(by_size)
            above = [b for b in sizes if b > sequences]
            lo, hi = (sizes[-2], sizes[-1]) if not above else (max(b for b in sizes if b < sequences), above[0])
            return by_size[lo] + (by_size[hi] - by_size[lo]) * (sequences - lo) / (hi - lo)
        total = sequences * tokens
        return self.intercept_s + self.per_token_s * total + self.per_expert_layer_s * self.experts(total) * self.layers

    def t_draft(self, sequences: int, passes: int, shape: str = "tree") -> float:
        """`passes` head passes of `shape` over `sequences` sequences (one pass serves every row): a tree pass at
        the largest measured batch size up to `sequences` (`draft_by_batch`), else one sequence's."""
        measured = {int(b): s for b, s in (self.draft_by_batch or {}).items() if int(b) <= sequences}
        batched = measured[max(measured)] if shape == "tree" and measured else None
        return passes * (batched if batched is not None else self.draft_pass_s.get(shape, 0.0))

    def batch_experts(self, sequences: int, tokens: int) -> float:
        """The unique experts per layer over a pass of `sequences` sequences of `tokens` tokens each: the batch
        table's at the largest measured batch size up to `sequences`, else what that many tokens of one sequence
        route to."""
        measured = {
            int(b): by_t[str(tokens)][1]
            for b, by_t in (self.verify_by_batch or {}).items()
            if int(b) <= sequences and str(tokens) in by_t
        }
        return measured[max(measured)] if measured else self.experts(sequences * tokens)

    def at_batch(self, sequences: int, shared: bool = False) -> VerifyProfile:
        """One sequence's prices in a pass of `sequences` sequences that all verify as it does: a block of t tokens
        costs the batched pass `t_batch(sequences, t)`, an AR step the batched AR pass, a tree head pass the batched
        one. Experts beyond the expected are priced as at one sequence: beyond what t tokens of one sequence route
        to, or with `shared` (one expert buffer for the batch, whose count a row's choice sees) beyond the batch's.
        The profile itself at one sequence, or where it has no batch table (`verify_by_batch`)."""
        if sequences == 1 or not self.verify_by_batch:
            return self
        sizes = sorted({int(t) for t in self.experts_by_tokens} | {int(t) for t in self.verify_by_tokens or {}})
        expected = (lambda t: self.batch_experts(sequences, t)) if shared else self.experts
        by_tokens = {str(t): [self.t_batch(sequences, t), expected(t)] for t in sizes}
        drafts = {**self.draft_pass_s, "tree": self.t_draft(sequences, 1)}
        return replace(
            self,
            ar_step_s=self.overhead_s + self.t_batch(sequences, 1),
            per_token_s=self.per_token_s * sequences,
            draft_pass_s=drafts,
            verify_by_tokens=by_tokens,
        )

    @property
    def key(self) -> str:
        return profile_key(self.model, self.engine, self.dtype, self.processor)


def independent_experts(num_experts: int, top_k: int, tokens: int) -> float:
    """Unique experts per layer of `tokens` tokens routed independently and uniformly: N (1 - (1 - k/N)^t)."""
    return num_experts * (1.0 - (1.0 - top_k / num_experts) ** tokens)


def profile_key(model: str, engine: str, dtype: str, processor: str) -> str:
    """The file stem of a profile: model, engine, dtype and processor (or GPU model), in filename characters."""
    import re

    return re.sub(r"[^A-Za-z0-9_.-]+", "_", f"{model}-{engine}-{dtype}-{processor}").strip("_")


def fit_verify(records: Iterable[Mapping], layers: int) -> tuple[float, float, float, float, int]:
    """Least squares t_pass = intercept + per_token · tokens + per_expert_layer · E · layers over `verify_latency`
    records of one implementation (the AR pass enters at γ = 1, E = k), each coefficient held >= 0 (a token or an
    expert more never makes a pass cheaper; noise in a few timed points could tilt a free fit so); returns the three
    coefficients, R² and the number of points. The records' passes cover `layers` MoE layers."""
    from scipy.optimize import nnls

    rows = [r for r in records if r.get("status", "ok") == "ok"]
    if len({(r["gamma"], r["E"]) for r in rows}) < 3:
        raise ValueError("a verify profile needs at least three distinct (tokens, E) points")
    x = np.array([[1.0, r["gamma"], r["E"] * layers] for r in rows])
    y = np.array([r["t_pass_s"] for r in rows])
    coef, _ = nnls(x, y)
    pred = x @ coef
    ss_tot = float(((y - y.mean()) ** 2).sum())
    r2 = 1.0 - float(((y - pred) ** 2).sum()) / ss_tot if ss_tot > 0 else 1.0
    return float(coef[0]), float(coef[1]), float(coef[2]), r2, len(rows)
