"""Run the engine end to end on the embedded default and print one line per method.

Until the Hydra grid entry point lands (configs, datasets, result records), the embedded default
is a tiny random-init Qwen3-MoE target with a weight-perturbed copy of itself as the draft model,
on random prompts: everything runs on CPU with no network.
"""

from __future__ import annotations

import time

import torch

import ecospec
from ecospec.drafters.draft_model import DraftModelDrafter
from ecospec.models import moe_info, perturbed_copy, tiny_model

METHODS = [  # (name, selector, predictor, drafter?)
    ("ar", "confidence", None, False),
    ("confidence", "confidence", None, True),
    ("ecospec+oracle", "ecospec", "oracle", True),
    ("global_cost+oracle", "global_cost", "oracle", True),
]


def main(num_prompts: int = 6, prompt_len: int = 32, max_new_tokens: int = 48) -> None:
    torch.set_num_threads(1)
    target = tiny_model("qwen3_moe-a", seed=0, num_experts=16, num_experts_per_tok=4)
    drafter = DraftModelDrafter(perturbed_copy(target, scale=0.05, seed=1))
    info = moe_info(target)
    gen = torch.Generator().manual_seed(0)
    prompts = [torch.randint(3, target.config.vocab_size, (1, prompt_len), generator=gen) for _ in range(num_prompts)]
    print(f"target: tiny {type(target).__name__}, {info.num_moe_layers} MoE layers x {info.num_experts} experts, "
          f"top-{info.top_k}; {num_prompts} prompts, {max_new_tokens} new tokens, depth 3, top-2, gamma 4")  # fmt: skip
    print(f"{'method':<20}{'alpha':>7}{'E':>7}{'tok/s':>9}{'speedup':>9}{'matches AR':>12}")
    ar_tps, ar_out = None, None
    for name, selector, predictor, use_drafter in METHODS:
        outs, tokens, seconds, alphas, experts = [], 0, 0.0, [], []
        for ids in prompts:
            t0 = time.perf_counter()
            res = ecospec.generate(target, ids, drafter=drafter if use_drafter else None, selector=selector,
                                   predictor=predictor, max_new_tokens=max_new_tokens, eos_token_id=[])  # fmt: skip
            oracle_time = sum(s.t_pred for s in res.steps) if predictor == "oracle" else 0.0
            seconds += time.perf_counter() - t0 - oracle_time  # the oracle is analysis only
            tokens += len(res.tokens)
            outs.append(res.tokens)
            alphas.append(res.alpha)
            experts.append(res.experts_per_layer)
        tps = tokens / seconds
        if ar_tps is None:
            ar_tps, ar_out = tps, outs
        matches = sum(a == b for a, b in zip(outs, ar_out, strict=True)) / len(outs)
        print(f"{name:<20}{sum(alphas) / len(alphas):>7.2f}{sum(experts) / len(experts):>7.2f}{tps:>9.1f}"
              f"{tps / ar_tps:>8.2f}x{matches:>11.0%}")  # fmt: skip
    print("(CPU wall-clock on a tiny model: real numbers, not GPU numbers)")


if __name__ == "__main__":
    main()
