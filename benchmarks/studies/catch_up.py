"""What starting to draft costs on the compiled engine, and the two answers to it: a method that has drafted nothing
for some steps (Cascade's K = 0 phases, a declining EcoSpec-Adaptive) first runs its head and predictor over every
token they have not seen. Two switches, each on and off in one process, interleaved prompt by prompt with AR (one
torch thread, the decoding thread's CPU time), on the embedded default:

- `chunked`: the native head takes a few steps' unseen tokens γ at a time (`static_eagle3.CATCH_UP` blocks) instead
  of once through the uncompiled tensor code;
- `priced`: EcoSpec-Adaptive starts drafting only where the tokens left can repay the catch-up
  (`AdaptiveSession._repays`; off: it always may).

    python benchmarks/studies/catch_up.py [--prompts 16] [--tokens 64] [--out reports/tiny]

Each variant must give AR's greedy tokens (asserted); the speedups are each variant's over the same prompts' AR.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch
from provenance import run_commit

import ecospec
import ecospec.engine.static_eagle3 as static_eagle3
from ecospec.analysis.profiles import load_profile
from ecospec.experiment.engines import CellEngine
from ecospec.experiment.records import hardware
from ecospec.methods.ecospec_adaptive import AdaptiveSession
from ecospec.tiny import load_tiny
from ecospec.tiny.evaluate import humaneval_ids

GAMMA = 6
PRICED = AdaptiveSession._repays
# variant -> (selector, chunked, priced)
VARIANTS = {
    "AR": ("confidence", True, True),
    "Cascade, chunked": ("cascade", True, True),
    "Cascade, uncompiled": ("cascade", False, True),
    "EcoSpec-Adaptive, priced": ("ecospec_adaptive", True, True),
    "EcoSpec-Adaptive, unpriced": ("ecospec_adaptive", True, False),
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--prompts", type=int, default=16)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--out", type=Path, default=None, help="write catch_up.json there")
    a = ap.parse_args()
    torch.set_num_threads(1)
    target, tokenizer, drafter, predictor = load_tiny()
    profile, _ = load_profile("tiny", "compiled", "float32", hardware(torch.device("cpu")))
    prompts = humaneval_ids(tokenizer, a.prompts)
    cell = CellEngine("compiled")
    spent = {v: [0.0, 0] for v in VARIANTS}
    names = list(VARIANTS)
    for warm in (True, False):
        for i, ids in enumerate(prompts):
            engine = cell.for_decode(
                target, drafter, GAMMA, ids.shape[1], a.tokens, predictor=predictor, depth=5, topk=2, depths=(1, 2, 3)
            )
            tokens = {}
            for name in names[i % len(names) :] + names[: i % len(names)]:  # each variant first in turn
                selector, chunked, priced = VARIANTS[name]
                static_eagle3.CATCH_UP = 8 if chunked else 0
                AdaptiveSession._repays = PRICED if priced else (lambda self, behind, left: True)
                c0 = time.thread_time()
                res = ecospec.generate(
                    target,
                    ids,
                    drafter=None if name == "AR" else drafter,
                    selector=selector,
                    predictor=predictor if selector == "ecospec_adaptive" else None,
                    gamma=GAMMA,
                    depth=3,
                    topk=2,
                    max_new_tokens=a.tokens,
                    engine=engine,
                    profile=profile,
                )
                if not warm:
                    spent[name][0] += time.thread_time() - c0
                    spent[name][1] += len(res.tokens)
                tokens[name] = res.tokens
            assert all(t == tokens["AR"] for t in tokens.values()), f"prompt {i}: a variant left AR's tokens"
    static_eagle3.CATCH_UP, AdaptiveSession._repays = 8, PRICED
    ms = {name: 1e3 * s / n for name, (s, n) in spent.items()}
    result = {
        "commit": run_commit(),
        "hardware": hardware(torch.device("cpu")),
        "prompts": a.prompts,
        "tokens": a.tokens,
        "ms_per_token": {k: round(v, 3) for k, v in ms.items()},
        "speedup_over_ar": {k: round(ms["AR"] / v, 3) for k, v in ms.items() if k != "AR"},
    }
    print(json.dumps(result, indent=1))
    if a.out:
        a.out.mkdir(parents=True, exist_ok=True)
        (a.out / "catch_up.json").write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
