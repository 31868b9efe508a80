"""The compiled engine two ways on the embedded default: the CPU's native steps (one C++ call a pass for the target,
`StaticQwen3.native_step`, for a step's EAGLE-3 draft tree, `StaticEagle3.native_draft_step`, and for the expert
predictor's pass, `StaticPredictor.native_step`: the engine on the CPU) against inductor's graphs of the same
forwards (the engine where the native steps do not run, `native=False`). AR, the EAGLE-3 tree and EcoSpec run
through each, interleaved prompt by prompt in one process (one torch thread): time per token (the decoding thread's
CPU time), each method's speedup over the same target's AR, the step's parts (ms a step: draft, predictor, verify
phase, whole step) and whether the two targets gave the same greedy tokens.

    python benchmarks/studies/native_step.py [--prompts 8] [--tokens 64] [--gamma 6] [--out reports/tiny]

A greedy token that differs between the two is reported with its position: the two sum in different orders, so a
near-tie may flip; the loop's lossless claim (each method against its own target's AR) is checked as well.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch
from provenance import run_commit

import ecospec
from ecospec.engine.compiled import prepare
from ecospec.engine.static_eagle3 import prepare_drafter
from ecospec.engine.static_predictor import prepare_predictor
from ecospec.experiment.records import hardware
from ecospec.tiny import load_tiny
from ecospec.tiny.evaluate import humaneval_ids

METHODS = {"AR": {}, "EAGLE-3": {"selector": "confidence"}, "EcoSpec": {"selector": "ecospec"}}
DEPTH, TOPK = 3, 2
TARGETS = {"native": None, "inductor": False}  # prepare's `native`: None lets the CPU take the native step
PARTS = ("t_draft", "t_pred", "t_verify", "t_total")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--gamma", type=int, default=6)
    ap.add_argument("--out", type=Path, default=None, help="write native_step.json there")
    a = ap.parse_args()
    torch.set_num_threads(1)
    target, tokenizer, drafter, predictor = load_tiny()
    prompts = humaneval_ids(tokenizer, a.prompts)
    max_len = -(-(max(p.shape[1] for p in prompts) + a.tokens + a.gamma) // 128) * 128
    hidden = tuple(drafter.hidden_layers)
    t0 = time.perf_counter()
    targets = {
        (kind, m): prepare(
            target,
            gamma=1 if m == "AR" else a.gamma,
            max_len=max_len,
            hidden_layers=() if m == "AR" else hidden,
            native=native,
        )
        for kind, native in TARGETS.items()
        for m in ("AR", "SD")
    }
    shape = {"gamma": a.gamma, "depth": DEPTH, "topk": TOPK, "max_len": max_len}
    heads = {kind: prepare_drafter(drafter, **shape, native=native) for kind, native in TARGETS.items()}
    preds = {kind: prepare_predictor(predictor, **shape, native=native) for kind, native in TARGETS.items()}
    prepare_s = time.perf_counter() - t0
    cpu = {(m, k): 0.0 for m in METHODS for k in TARGETS}
    count = dict.fromkeys(cpu, 0)
    parts = {key: dict.fromkeys((*PARTS, "steps"), 0.0) for key in cpu}
    flips, lossless = [], True
    for i, ids in enumerate(prompts):
        ar_tokens = {}
        for method, kw in METHODS.items():
            args = dict(kw)
            if method != "AR":
                args.update(
                    drafter=None,
                    predictor=None,
                    gamma=a.gamma,
                    depth=DEPTH,
                    topk=TOPK,
                )
            outs = {}
            for kind in TARGETS if i % 2 == 0 else list(TARGETS)[::-1]:  # each target first in half the prompts
                run = targets[kind, "AR" if method == "AR" else "SD"]
                if method != "AR":
                    args["drafter"] = heads[kind]
                if method == "EcoSpec":
                    args["predictor"] = preds[kind]
                c0 = time.thread_time()
                outs[kind] = ecospec.generate(target, ids, max_new_tokens=a.tokens, engine=run, **args)
                cpu[method, kind] += time.thread_time() - c0
                count[method, kind] += len(outs[kind].tokens)
                for st in outs[kind].steps:
                    for part in PARTS:
                        parts[method, kind][part] += getattr(st, part)
                    parts[method, kind]["steps"] += 1
            if method == "AR":
                ar_tokens = {k: o.tokens for k, o in outs.items()}
            lossless &= all(outs[k].tokens == ar_tokens[k] for k in TARGETS)
            n, c = outs["native"].tokens, outs["inductor"].tokens
            if n != c:
                j = next(k for k, (x, y) in enumerate(zip(n, c, strict=False)) if x != y)
                flips.append({"prompt": i, "method": method, "position": j})
    ms = {f"{m} {k}": 1e3 * cpu[m, k] / count[m, k] for m, k in cpu}
    result = {
        "commit": run_commit(),
        "hardware": hardware(torch.device("cpu")),
        "prompts": a.prompts,
        "tokens": a.tokens,
        "gamma": a.gamma,
        "prepare_s": round(prepare_s, 1),
        "ms_per_token": {k: round(v, 3) for k, v in ms.items()},
        "native_vs_inductor": {m: round(ms[f"{m} inductor"] / ms[f"{m} native"], 2) for m in METHODS},
        "sd_vs_ar": {
            f"{m} {k}": round(ms[f"AR {k}"] / ms[f"{m} {k}"], 2) for m in METHODS if m != "AR" for k in TARGETS
        },
        "ms_a_step": {
            f"{m} {k}": {part: round(1e3 * p[part] / max(p["steps"], 1), 3) for part in PARTS}
            for (m, k), p in parts.items()
        },
        "lossless": lossless,
        "flips": flips,
    }
    print(json.dumps(result, indent=1))
    if a.out:
        a.out.mkdir(parents=True, exist_ok=True)
        (a.out / "native_step.json").write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
