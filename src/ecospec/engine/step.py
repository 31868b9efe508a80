"""The pieces of a decode step (`loop.decode`): argument checks, the block a step verifies, acceptance and
committing the produced tokens."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ecospec.engine.acceptance import accept_greedy, accept_sampling
from ecospec.engine.records import StepStats, StepTrace
from ecospec.engine.tree import DraftTree
from ecospec.methods import method, names


def check_args(
    target, input_ids, drafter, selector, predictor, gamma, depth, topk, temperature, top_p, max_new, profile=None
):
    """One ValueError naming the first argument of a decode that cannot run."""
    if not (input_ids.dim() == 2 and input_ids.shape[0] == 1 and input_ids.shape[1] >= 1):
        raise ValueError(f"input_ids must have shape [1, n>=1] (batch size 1), got {tuple(input_ids.shape)}")
    try:
        spec = method(selector)
    except ValueError:
        raise ValueError(f"unknown selector {selector!r}; choose one of {', '.join(names())}") from None
    if gamma < 2:
        raise ValueError(f"gamma must be >= 2 (tokens verified per step, root included), got {gamma}")
    if depth < 1:
        raise ValueError(f"depth must be >= 1 (draft forward steps), got {depth}")
    if topk < 1:
        raise ValueError(f"topk must be >= 1 (children per expanded node), got {topk}")
    if temperature < 0:
        raise ValueError(f"temperature must be >= 0, got {temperature}")
    if not 0 < top_p <= 1:
        raise ValueError(f"top_p must be in (0, 1], got {top_p}")
    if max_new < 1:
        raise ValueError(f"max_new_tokens must be >= 1, got {max_new}")
    if drafter is not None and drafter.vocab_size != target.config.vocab_size:
        raise ValueError(
            f"drafter vocabulary ({drafter.vocab_size} tokens) does not match the target's "
            f"({target.config.vocab_size} tokens)"
        )
    if drafter is not None and spec.predictor is not None and predictor is None:
        raise ValueError(f"selector {selector!r} needs expert sets: pass predictor=<ExpertPredictor> or 'oracle'")
    if spec.predictor == "oracle" and predictor != "oracle":
        raise ValueError(f"selector {selector!r} takes the target router's true expert sets: pass predictor='oracle'")
    if drafter is not None and spec.cost_model and profile is None:
        raise ValueError(
            f"selector {selector!r} prices passes in seconds: pass profile=<VerifyProfile> "
            "(analysis.profiles.load_profile; make one with python -m ecospec.bench.profile --model M "
            "--engine E)"
        )


def eos_set(target, eos_token_id: int | list[int] | None) -> set[int]:
    """The tokens that end a sequence: `eos_token_id`, or the target's generation config's when None."""
    if eos_token_id is None:
        eos_token_id = target.generation_config.eos_token_id if target.generation_config else None
    return set([eos_token_id] if isinstance(eos_token_id, int) else (eos_token_id or []))


def first_token(logits: torch.Tensor, temperature: float, top_p: float, gen: torch.Generator) -> int:
    """The token the prefill's last logits [1, V] give: the acceptance rule's bonus for a block of one token."""
    if temperature == 0:
        return accept_greedy([0], [-1], logits)[1]
    return accept_sampling([0], [-1], [1.0], logits, temperature, top_p, gen)[1]


@dataclass
class Block:
    """What one verify pass checks: the root, then the chosen nodes (ascending, so parents precede children), with
    block-index parents (root -1) and draft depths (root 0); `ranks`: each token's draft probability (root 1)."""

    tokens: list[int]
    parents: list[int]
    depths: list[int]
    ranks: list[float]

    @classmethod
    def of(cls, root: int, tree: DraftTree, chosen: list[int]) -> Block:
        slot = {node: j + 1 for j, node in enumerate(chosen)}
        return cls(
            tokens=[root] + [tree.tokens[i] for i in chosen],
            parents=[-1] + [slot.get(tree.parents[i], 0) for i in chosen],
            depths=[0] + [tree.depths[i] for i in chosen],
            ranks=[1.0] + [tree.probs[i] for i in chosen],
        )

    def stats(self, times: dict[str, float], path: list[int], produced: int, trace: bool, drafted: int) -> StepStats:
        """The step's record: `times` from its `StepTimer`, `drafted` the draft tree's depth; the experts are filled
        in from the routes after the decode (one count for every pass)."""
        return StepStats(
            accepted=produced,
            verified=len(self.tokens),
            experts=[],
            t_pred=times["pred"],
            t_draft=times["draft"],
            t_select=times["select"],
            t_verify=times["verify"],
            t_total=times["total"],
            t_cpu=times["cpu"],
            trace=StepTrace(self.tokens, self.parents, self.depths, list(path), []) if trace else None,
            drafted_depth=drafted,
        )

    def accept(self, logits: torch.Tensor, temperature: float, top_p: float, gen: torch.Generator):
        """(accepted block indices from the root, bonus token): greedy or lossless rejection sampling."""
        if temperature == 0:
            return accept_greedy(self.tokens, self.parents, logits)
        return accept_sampling(self.tokens, self.parents, self.ranks, logits, temperature, top_p, gen)


def commit(out_tokens: list[int], produced: list[int], eos: set[int], max_new_tokens: int) -> bool:
    """Append the step's tokens up to an eos or the length limit; whether the sequence is done."""
    for tok in produced:
        out_tokens.append(tok)
        if tok in eos or len(out_tokens) >= max_new_tokens:
            return True
    return False
