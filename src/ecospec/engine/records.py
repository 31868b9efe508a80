"""Plain records of one generation: what every SD step did and how long each phase took."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class StepTrace:
    """One verify pass, for routing analyses: block index 0 is the root."""

    tokens: list[int]
    parents: list[int]  # block index of each token's parent (-1 for the root)
    depths: list[int]  # draft depth (root 0)
    path: list[int]  # accepted block indices, root first (the bonus token is not in the block)
    routes: list[list[list[int]]]  # [MoE layers][block tokens][k] expert ids


@dataclass
class StepStats:
    accepted: int  # tokens the step produced: accepted draft tokens + the bonus token (AR: 1)
    verified: int  # tokens in the verify pass, root included
    experts: list[int]  # unique experts per MoE layer activated by the verify pass
    t_pred: float = 0.0  # seconds: predictor (or oracle) expert sets for the candidates
    t_draft: float = 0.0  # drafter forwards + tree growth
    t_select: float = 0.0
    t_verify: float = 0.0  # target forward + acceptance + cache compaction
    t_total: float = 0.0
    # the calling thread's CPU time over the step (time.thread_time): what the step cost this core, without the
    # moments the OS gave it to someone else; equals t_total's work at one intra-op thread only (docs/design.md)
    t_cpu: float = 0.0
    trace: StepTrace | None = None  # generate(trace=True) only
    drafted_depth: int = 0  # the draft tree's depth this step (0: nothing drafted, an AR step)


@dataclass
class GenerateResult:
    tokens: list[int]  # new tokens, eos kept, truncated at max_new_tokens; the first is the prefill's (no step's)
    steps: list[StepStats] = field(default_factory=list)
    prompt_len: int = 0
    t_prefill: float = 0.0
    t_prefill_cpu: float = 0.0  # thread CPU time of the prefill
    # [MoE layers][N]: tokens routed to each expert over all verify passes (prefill excluded)
    expert_load: list[list[int]] = field(default_factory=list)

    @property
    def alpha(self) -> float:
        """Mean tokens produced per step, bonus included (AR = 1)."""
        return sum(s.accepted for s in self.steps) / max(len(self.steps), 1)

    @property
    def experts_per_layer(self) -> float:
        """E: mean over verify passes and MoE layers of the unique experts per layer."""
        return mean_experts(self.steps)


@dataclass
class BatchStepStats:
    """One verify pass over every sequence still in the batch."""

    sequences: int  # sequences in the pass
    verified: int  # tokens verified, all sequences (padding excluded)
    experts: list[int]  # unique experts per MoE layer over the whole pass
    t_draft: float = 0.0  # seconds, all sequences
    t_pred: float = 0.0
    t_select: float = 0.0
    t_verify: float = 0.0  # the target's pass + acceptance + compaction
    t_total: float = 0.0
    t_cpu: float = 0.0  # the thread's CPU time over the pass (StepStats.t_cpu)


@dataclass
class BatchResult:
    results: list[GenerateResult]  # per prompt, in input order
    steps: list[BatchStepStats] = field(default_factory=list)
    t_prefill: float = 0.0
    t_prefill_cpu: float = 0.0

    @property
    def experts_per_layer(self) -> float:
        """E of the batched passes: mean over passes and MoE layers of the unique experts per layer."""
        return mean_experts(self.steps)


def mean_experts(steps) -> float:
    """Mean over verify passes (anything with `.experts`, unique experts per MoE layer) and layers."""
    vals = [e for s in steps for e in s.experts]
    return sum(vals) / max(len(vals), 1)
