"""Does one expert buffer for the batch lower E? At batch size B: confidence selection, EcoSpec with a buffer per
sequence (`batch_buffer="sequence"`, the paper's rule applied to each sequence) and one buffer for the batch
(`batch_buffer="batch"`: an expert another sequence already brings into the pass costs nothing), on the embedded
default, greedy, the same prompts; E = unique experts per MoE layer over the whole batched pass.

    python benchmarks/batch_buffer.py [--batch 4] [--batches 4] [--tokens 64] [--dataset humaneval]

Both modes are lossless (outputs equal AR; checked), so the comparison is E and alpha. One torch thread.
"""

from __future__ import annotations

import argparse
import statistics

import torch

import ecospec
from ecospec.data import encode_turn, load_prompts
from ecospec.tiny import load_tiny_target
from ecospec.tiny.build import paths
from ecospec.tiny.evaluate import load_components


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--batches", type=int, default=4)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--dataset", default="humaneval")
    a = ap.parse_args()
    torch.set_num_threads(1)
    load_tiny_target()  # builds the embedded default on first use
    target, tokenizer, drafter, predictor = load_components(paths("full"))
    prompts = load_prompts(a.dataset, a.batch * a.batches, split="heldout")
    ids = [torch.tensor(encode_turn(tokenizer, p.turns, [], p.completion, False)) for p in prompts]
    modes = {
        "confidence": ("confidence", "sequence"),
        "sequence": ("ecospec", "sequence"),
        "batch": ("ecospec", "batch"),
    }
    rows = {mode: {"E": [], "alpha": [], "same": True} for mode in modes}
    for i in range(a.batches):
        batch = ids[i * a.batch : (i + 1) * a.batch]
        ar = [ecospec.generate(target, p[None], max_new_tokens=a.tokens).tokens for p in batch]
        for mode, row in rows.items():
            selector, buffer = modes[mode]
            res = ecospec.generate_batch(target, batch, drafter=drafter, selector=selector, predictor=predictor,
                                         max_new_tokens=a.tokens, batch_buffer=buffer)  # fmt: skip
            row["E"] += [e for s in res.steps for e in s.experts]
            row["alpha"] += [r.alpha for r in res.results]
            row["same"] &= [r.tokens for r in res.results] == ar
    print(f"Batch {a.batch}, {a.batches} batches of held-out {a.dataset} prompts x {a.tokens} tokens, greedy")
    print(f"{'selection':<22}{'E (pass)':>10}{'alpha':>8}  outputs = AR")
    for mode, row in rows.items():
        name = {
            "confidence": "confidence (EAGLE-3)",
            "sequence": "EcoSpec, per sequence",
            "batch": "EcoSpec, batch buffer",
        }
        print(f"{name[mode]:<22}{statistics.mean(row['E']):>10.2f}{statistics.mean(row['alpha']):>8.2f}  {row['same']}")
    ratio = statistics.mean(rows["batch"]["E"]) / statistics.mean(rows["sequence"]["E"])
    print(f"E(batch buffer) / E(per-sequence buffers) = {ratio:.3f}")


if __name__ == "__main__":
    main()
