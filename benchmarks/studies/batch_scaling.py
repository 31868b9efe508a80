"""Batched decoding on the embedded default: tokens/s, step time and E against the batch size B, for AR, EAGLE-3
(confidence), EcoSpec with a buffer per sequence and EcoSpec with one buffer for the batch (`batch_buffer="batch"`).

    python benchmarks/studies/batch_scaling.py [--sizes 1,2,4,8] [--prompts 16] [--tokens 64] [--out DIR]

Every batch (prompts grouped in dataset order, held-out split of four offline benchmarks) is decoded by the four
methods one after another, so a machine that slows down slows all of them alike; greedy, no eos (every sequence
makes --tokens tokens, so AR's passes are all full), one torch thread. Figures:

* AR decode throughput at B: B / t_step (decode steps only) and its ratio to B = 1 (issue 12: >= 1.6 at B = 4; the
  per-expert loop touches ~3x the experts in a 4-row pass, so ~2x is the ceiling);
* the SD step at B: mean time of the batched passes with B sequences, and its ratio to B = 1 (goal < 2.5 at B = 4);
* tokens/s = all new tokens / wall time (a batch counted once) and E = unique experts per MoE layer over the whole
  batched pass, per method and B; alpha per sequence; outputs equal AR (checked).

--out DIR writes batch_scaling.md (these lines), batch_scaling.json and batch_scaling.png (tokens/s and E against
B); the .md and .json name the commit they ran at.
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
from ecospec.components import load_build
from ecospec.data import encode_turn, load_prompts
from ecospec.tiny import load_tiny_target
from ecospec.tiny.build import paths

DATASETS = ("humaneval", "gsm8k", "math500", "mtbench")
METHODS = {  # name: (drafter?, selector, batch_buffer)
    "AR": (False, "confidence", "sequence"),
    "EAGLE-3": (True, "confidence", "sequence"),
    "EcoSpec": (True, "ecospec", "sequence"),
    "EcoSpec, batch buffer": (True, "ecospec", "batch"),
}


def prompts_of(tokenizer, n: int) -> list[torch.Tensor]:
    """n held-out prompts, taken in turn from the four offline benchmarks (first turns only)."""
    per = -(-n // len(DATASETS))
    sets = [load_prompts(d, per, split="heldout") for d in DATASETS]
    out = [p for group in zip(*sets, strict=False) for p in group][:n]
    return [torch.tensor(encode_turn(tokenizer, p.turns[:1], [], p.completion, False)) for p in out]


def measure(target, drafter, predictor, ids, sizes, tokens) -> dict:
    out = {}
    for size in sizes:
        acc = {m: {"tokens": 0, "wall": 0.0, "full_steps": [], "E": [], "alpha": [], "same": True} for m in METHODS}
        for i in range(0, len(ids) - size + 1, size):  # whole batches only: every B decodes alike
            batch = ids[i : i + size]
            ar_tokens = None
            for name, (draft, selector, buffer) in METHODS.items():
                t0 = time.perf_counter()
                res = ecospec.generate_batch(
                    target,
                    batch,
                    drafter=drafter if draft else None,
                    selector=selector,
                    predictor=predictor if selector == "ecospec" else None,
                    max_new_tokens=tokens,
                    eos_token_id=[],
                    batch_buffer=buffer,
                )
                a = acc[name]
                a["wall"] += time.perf_counter() - t0
                a["tokens"] += sum(len(r.tokens) for r in res.results)
                a["full_steps"] += [s.t_total for s in res.steps if s.sequences == size]
                a["E"] += [statistics.mean(s.experts) for s in res.steps]
                a["alpha"] += [r.alpha for r in res.results]
                got = [r.tokens for r in res.results]
                ar_tokens = got if name == "AR" else ar_tokens
                a["same"] &= got == ar_tokens
        out[size] = {
            name: {
                "tokens_per_s": a["tokens"] / a["wall"],
                "t_step_s": statistics.mean(a["full_steps"]),
                "E": statistics.mean(a["E"]),
                "alpha": statistics.mean(a["alpha"]),
                "outputs_equal_ar": a["same"],
                "batches": len(a["alpha"]) // size,
            }
            for name, a in acc.items()
        }
    return out


def report(res: dict, sizes, prompts: int, tokens: int) -> list[str]:
    lines = [f"batched decoding, embedded default: {prompts} held-out prompts x {tokens} tokens, greedy, 1 thread"]
    lines.append(f"{'method':<23}{'B':>3}{'tokens/s':>10}{'t_step ms':>11}{'E':>7}{'alpha':>7}  = AR")
    for name in METHODS:
        for b in sizes:
            r = res[b][name]
            lines.append(
                f"{name:<23}{b:>3}{r['tokens_per_s']:>10.1f}{r['t_step_s'] * 1e3:>11.2f}{r['E']:>7.2f}"
                f"{r['alpha']:>7.2f}  {r['outputs_equal_ar']}"
            )
    base = sizes[0]
    for b in sizes[1:]:
        ar = (b / res[b]["AR"]["t_step_s"]) / (base / res[base]["AR"]["t_step_s"])
        sd = {m: res[b][m]["t_step_s"] / res[base][m]["t_step_s"] for m in METHODS if m != "AR"}
        lines.append(
            f"B={b} vs B={base}: AR decode throughput (B / t_step) x{ar:.2f}; one SD step costs "
            + ", ".join(f"x{v:.2f} ({m})" for m, v in sd.items())
        )
    if len(sizes) > 1:
        for b in sizes[1:]:
            e_seq, e_batch = res[b]["EcoSpec"]["E"], res[b]["EcoSpec, batch buffer"]["E"]
            a_seq, a_batch = res[b]["EcoSpec"]["alpha"], res[b]["EcoSpec, batch buffer"]["alpha"]
            lines.append(
                f"B={b}: batch buffer E {e_batch:.2f} vs per-sequence {e_seq:.2f} (x{e_batch / e_seq:.3f}); "
                f"alpha {a_batch:.2f} vs {a_seq:.2f}"
            )
    return lines


def plot(res: dict, sizes, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(9, 3.4))
    for name in METHODS:
        ax1.plot(sizes, [res[b][name]["tokens_per_s"] for b in sizes], marker="o", label=name)
        ax2.plot(sizes, [res[b][name]["E"] for b in sizes], marker="o", label=name)
    for ax, label in ((ax1, "tokens/s (CPU wall clock)"), (ax2, "E per verify pass")):
        ax.set_xlabel("batch size B")
        ax.set_ylabel(label)
        ax.set_xticks(list(sizes))
        ax.grid(alpha=0.3)
    ax2.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", default="1,2,4,8")
    ap.add_argument("--prompts", type=int, default=16)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--out", type=Path, default=None)
    a = ap.parse_args()
    sizes = [int(x) for x in a.sizes.split(",")]
    torch.set_num_threads(1)
    load_tiny_target()  # builds the embedded default on first use
    target, tokenizer, drafter, predictor = load_build(paths("full"))
    ids = prompts_of(tokenizer, a.prompts)
    res = measure(target, drafter, predictor, ids, sizes, a.tokens)
    lines = report(res, sizes, a.prompts, a.tokens)
    print("\n".join(lines))
    if a.out is not None:
        a.out.mkdir(parents=True, exist_ok=True)
        commit = run_commit()
        (a.out / "batch_scaling.json").write_text(
            json.dumps({"commit": commit, "sizes": sizes, "results": res, "lines": lines})
        )
        plot(res, sizes, a.out / "batch_scaling.png")
        cmd = f"python benchmarks/studies/batch_scaling.py --sizes {a.sizes} --prompts {a.prompts} --tokens {a.tokens}"
        (a.out / "batch_scaling.md").write_text(
            f"# Batched decoding against the batch size\n\n`{cmd}` ({time.strftime('%Y-%m-%d')}, commit {commit}; "
            "CPU wall clock, not GPU numbers)\n\n```\n"
            + "\n".join(lines)
            + "\n```\n\n![tokens/s and E against B](batch_scaling.png)\n"
        )


if __name__ == "__main__":
    main()
