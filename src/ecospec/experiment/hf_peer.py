"""The AR every HF user already has: transformers' own `generate` on the same target and prompt, timed like our AR.

A batch-1 cell times it beside our loop's AR (`ar_peer=hf_generate`, the default) and divides by the faster of the
two, so a speedup never rests on a denominator slower than what users have (`summary.ar_source` says which).
`ecospec.generate(drafter=None)` itself stays our own loop: its step times and E are what ρ and Table 8 read.
"""

from __future__ import annotations

import time

import torch


def _now(device: torch.device) -> float:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter()


@torch.no_grad()
def hf_generate(
    target, ids: torch.Tensor, temperature: float, top_p: float, max_new_tokens: int, seed: int
) -> tuple[list[int], float, float]:
    """(new tokens, wall seconds, thread CPU seconds: `experiment.clock`) of `target.generate` on one prompt [1, n]:
    greedy at temperature 0, else sampling with
    `temperature` and `top_p` and no top-k (as `ecospec.generate`), stopping after the target's eos (kept) or
    `max_new_tokens`. Sampling draws from torch's global generator, seeded here and restored after."""
    ids = ids.to(target.device)
    sample = {"do_sample": False, "temperature": None, "top_p": None, "top_k": None}
    if temperature > 0:
        sample = {"do_sample": True, "temperature": temperature, "top_p": top_p, "top_k": 0}
    eos = target.generation_config.eos_token_id
    pad = target.generation_config.pad_token_id
    with torch.random.fork_rng(devices=[target.device] if target.device.type == "cuda" else []):
        torch.manual_seed(seed)
        t0, c0 = _now(target.device), time.thread_time()
        out = target.generate(
            ids,
            attention_mask=torch.ones_like(ids),
            max_new_tokens=max_new_tokens,
            pad_token_id=pad if pad is not None else eos,
            **sample,
        )
        seconds, cpu_seconds = _now(target.device) - t0, time.thread_time() - c0
    return out[0, ids.shape[1] :].tolist(), seconds, cpu_seconds
