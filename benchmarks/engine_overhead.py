"""`make bench`: engine overhead per SD step outside the target and drafter forwards, and the
latency of `ecospec.select`.

Overhead = step wall time - time inside the target's and the draft model's forward calls
(measured with forward pre/post hooks on the two top-level modules). It covers tree growth,
selection, mask building, acceptance, cache compaction and routing bookkeeping.
Goals (issue 2): overhead < 5 % of the step; select('ecospec') < 100 µs at depth 3, top-2, γ = 4. A third table
times the denominator: ecospec AR against transformers' greedy `generate` on the same target (goal: >= 1.00x).
"""

from __future__ import annotations

import statistics
import time

import torch
from ar_denominator import compare
from select_bench import bench_select

import ecospec
from ecospec.drafters.draft_model import DraftModelDrafter
from ecospec.models.loading import perturbed_copy, tiny_model

# A small but not toy-sized target: forwards of a few ms on CPU, like the embedded default.
TARGET = dict(
    hidden_size=256,
    intermediate_size=512,
    moe_intermediate_size=128,
    num_hidden_layers=4,
    num_attention_heads=8,
    num_key_value_heads=4,
    head_dim=32,
    num_experts=32,
    num_experts_per_tok=4,
    vocab_size=4096,
    mlp_only_layers=[],
)


class ForwardTimer:
    """Accumulates wall time spent inside a module's forward."""

    def __init__(self, module):
        self.total = 0.0
        self._t0 = 0.0
        module.register_forward_pre_hook(self._pre)
        module.register_forward_hook(self._post)

    def _pre(self, *_):
        self._t0 = time.perf_counter()

    def _post(self, *_):
        self.total += time.perf_counter() - self._t0


def bench_engine(selector: str, predictor, steps_wanted: int = 200, seed: int = 0) -> dict[str, float]:
    torch.manual_seed(seed)
    target = tiny_model("qwen3_moe-a", seed=seed, **TARGET)
    draft = perturbed_copy(target, scale=0.1, seed=seed + 1)
    t_timer, d_timer = ForwardTimer(target), ForwardTimer(draft)
    drafter = DraftModelDrafter(draft)
    gen = torch.Generator().manual_seed(seed)
    prompt = torch.randint(3, TARGET["vocab_size"], (1, 64), generator=gen)
    ecospec.generate(target, prompt, drafter=drafter, selector=selector, predictor=predictor, max_new_tokens=16)
    steps, step_time, fwd_time, per_step = 0, 0.0, 0.0, []
    while steps < steps_wanted:
        t_timer.total = d_timer.total = 0.0
        res = ecospec.generate(
            target,
            prompt,
            drafter=drafter,
            selector=selector,
            predictor=predictor,
            gamma=4,
            depth=3,
            topk=2,
            max_new_tokens=64,
            eos_token_id=[],
        )
        total = sum(s.t_total for s in res.steps)
        # prefill forward is outside the steps: take it out of the forward time
        fwd = t_timer.total + d_timer.total - res.t_prefill
        steps += len(res.steps)
        step_time += total
        fwd_time += fwd
        per_step.extend(s.t_total for s in res.steps)
        prompt = torch.randint(3, TARGET["vocab_size"], (1, 64), generator=gen)
    overhead = step_time - fwd_time
    return {
        "steps": steps,
        "step_us": 1e6 * step_time / steps,
        "median_step_us": 1e6 * statistics.median(per_step),
        "forward_us": 1e6 * fwd_time / steps,
        "overhead_us": 1e6 * overhead / steps,
        "overhead_pct": 100 * overhead / step_time,
    }


def bench_ar(prompts: int = 8, tokens: int = 64, rounds: int = 2, seed: int = 0) -> dict:
    """The speedup's denominator on the same target: ecospec AR (our loop) against transformers' greedy `generate`,
    prompt by prompt interleaved, outputs checked equal (`ar_denominator.compare`)."""
    target = tiny_model("qwen3_moe-a", seed=seed, **TARGET)
    gen = torch.Generator().manual_seed(seed)
    return compare(
        target, [torch.randint(3, TARGET["vocab_size"], (1, 64), generator=gen) for _ in range(prompts)], tokens, rounds
    )


def main() -> None:
    torch.set_num_threads(max(1, torch.get_num_threads()))
    print("Engine overhead per SD step (tiny random Qwen3-MoE target, 4 layers x 32 experts, top-4;")
    print("draft model = perturbed copy; depth 3, top-2, gamma 4; CPU)")
    print(f"{'selector':<12}{'steps':>7}{'step µs':>11}{'forwards µs':>13}{'overhead µs':>13}{'overhead %':>12}")
    for selector, predictor in (("confidence", None), ("ecospec", "oracle")):
        r = bench_engine(selector, predictor)
        print(
            f"{selector:<12}{r['steps']:>7}{r['step_us']:>11.0f}{r['forward_us']:>13.0f}"
            f"{r['overhead_us']:>13.0f}{r['overhead_pct']:>11.1f}%"
        )
    print("(ecospec here uses the oracle: its extra target forward counts as a forward, not overhead)")
    print()
    r = bench_ar()
    print("AR, the speedup's denominator, on the same target (8 random prompts x 64 tokens x 2 rounds, interleaved)")
    print(f"{'decoder':<22}{'tokens/s':>10}{'vs HF generate':>16}  outputs equal")
    print(f"{'HF greedy generate':<22}{r['HF generate tok/s']:>10.1f}{1.0:>15.2f}x")
    print(f"{'ecospec AR':<22}{r['ecospec AR tok/s']:>10.1f}{r['ratio']:>15.2f}x  {'yes' if r['same'] else 'NO'}")
    print()
    print("ecospec.select latency (median µs per call)")
    for name, us in bench_select().items():
        print(f"  {name:<44}{us:>8.1f}")


if __name__ == "__main__":
    main()
