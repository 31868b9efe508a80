"""The compiled engine at batch sizes above 1: what a sequence that finishes early should become, on the embedded
default, AR decoding (one torch thread).

    python benchmarks/studies/compiled_batch.py [--batches 4,8,32] [--tokens 64] [--rounds 3] [--out reports/tiny]

Each batch mixes the held-out prompts of the four offline benchmarks. The tiny model rarely ends a sequence within
`--tokens`, so each sequence stops at a stop token chosen from a first eager decode (`stop_token`: of the tokens it
makes often, the one whose first appearance is most spread across the batch), and sequences finish at different
steps, as a real batch's do. The same batch is decoded three ways, interleaved
round by round in one process: the eager engine, and the compiled one with finished sequences masked at the fixed
shape (`finished="mask"`: one graph per block size) or leaving the batch (`finished="leave"`: the live sequences move
to the next smaller prepared batch size, a power of two). Tokens must be equal across the three (checked); each
way's time is the median over rounds of the batch's decode wall time, prefill included. Warm-ups (compiles) are
reported apart and never timed.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch
from provenance import run_commit

import ecospec
from ecospec.engine.compiled import FINISHED, prepare
from ecospec.engine.scope import slots
from ecospec.experiment.records import hardware
from ecospec.tiny import load_tiny
from ecospec.tiny.evaluate import heldout_ids

BENCHMARKS = ("gsm8k", "humaneval", "math500", "mtbench")


def batch_prompts(tokenizer, size: int) -> list[torch.Tensor]:
    """`size` prompts taken in turn from the four benchmarks' held-out prompts."""
    per = heldout_ids(tokenizer, BENCHMARKS, -(-size // len(BENCHMARKS)))
    mixed = [per[name][i][0] for i in range(len(per[BENCHMARKS[0]])) for name in BENCHMARKS]
    return mixed[:size]


def stop_token(outputs: list[list[int]], tokens: int) -> int:
    """Of the 20 tokens the batch makes most often, the one whose first position in each sequence (`tokens` where
    it never appears) varies most across the batch."""
    from collections import Counter

    common = [t for t, _ in Counter(t for out in outputs for t in out).most_common(20)]
    first = lambda t: [out.index(t) if t in out else tokens for out in outputs]  # noqa: E731
    return max(common, key=lambda t: statistics.pvariance(first(t)))


def run(batches: list[int], tokens: int, rounds: int) -> dict:
    torch.set_num_threads(1)
    target, tokenizer, _, _ = load_tiny()
    out = {"tokens": tokens, "rounds": rounds, "batches": {}}
    with torch.inference_mode():
        for size in batches:
            prompts = batch_prompts(tokenizer, size)
            longest = max(p.shape[0] for p in prompts) + tokens + 1
            engines, warm = {"eager": "eager"}, {}
            for way in FINISHED:
                t0 = time.perf_counter()
                engines[way] = prepare(target, gamma=1, max_len=slots(longest), rows=size, finished=way)
                warm[way] = round(time.perf_counter() - t0, 1)
            free = ecospec.generate_batch(target, prompts, max_new_tokens=tokens, eos_token_id=[])
            stop = stop_token([r.tokens for r in free.results], tokens)
            times = {name: [] for name in engines}
            results = {}
            for _ in range(rounds):
                for name, engine in engines.items():
                    t0 = time.perf_counter()
                    res = ecospec.generate_batch(
                        target, prompts, max_new_tokens=tokens, eos_token_id=[stop], engine=engine
                    )
                    times[name].append(time.perf_counter() - t0)
                    results[name] = [r.tokens for r in res.results]
            if not results["eager"] == results["mask"] == results["leave"]:
                raise RuntimeError(f"B={size}: the compiled engine's tokens differ from the eager engine's")
            lengths = [len(t) for t in results["eager"]]
            med = {name: statistics.median(ts) for name, ts in times.items()}
            out["batches"][str(size)] = {
                "stop_token": stop,
                "new_tokens": lengths,
                "warm_up_s": warm,
                "seconds": {k: [round(t, 4) for t in v] for k, v in times.items()},
                "median_s": {k: round(v, 4) for k, v in med.items()},
                "leave_over_mask": round(med["leave"] / med["mask"], 3),
                "compiled_over_eager": {w: round(med[w] / med["eager"], 3) for w in FINISHED},
            }
            print(
                f"B={size}: new tokens {min(lengths)}..{max(lengths)}, median s eager {med['eager']:.3f}, "
                f"mask {med['mask']:.3f}, leave {med['leave']:.3f} (leave/mask {med['leave'] / med['mask']:.3f}); "
                f"warm-up mask {warm['mask']} s, leave {warm['leave']} s",
                flush=True,
            )
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--batches", default="4,8,32", help="batch sizes, comma-separated")
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--out", type=Path, default=None, help="write compiled_batch.json there")
    a = ap.parse_args()
    res = run([int(b) for b in a.batches.split(",")], a.tokens, a.rounds)
    res["commit"] = run_commit()
    res["machine"] = hardware(torch.device("cpu"))
    if a.out:
        a.out.mkdir(parents=True, exist_ok=True)
        (a.out / "compiled_batch.json").write_text(json.dumps(res, indent=1) + "\n")


if __name__ == "__main__":
    main()
