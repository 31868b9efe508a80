"""The compiled engine against the eager one on the embedded default: AR, EAGLE-3 and EcoSpec through both engines,
interleaved prompt by prompt in one process, greedy tokens, α and E per verify pass checked equal, time per token of
each (the decoding thread's CPU time, one torch thread), the compile warm-up, and per engine the line of a full
verify pass's latency (wall) against its unique experts per layer, and the shares of a step (T_draft / T_AR,
T_pred / T_verify) under each engine beside the weight bytes each part reads (`weights_read`): the compiled engine
compiles the EAGLE-3 head's draft steps and the predictor's pass too, yet on the embedded default both shares grow
with it, towards what their bytes say (docs/benchmarks.md).

    python benchmarks/studies/compiled_engine.py [--prompts 8] [--tokens 64] [--gamma 6] [--out reports/tiny]

A greedy token that differs is reported with the top-2 logit gap of the eager engine at its position: inductor may
reorder fp32 reductions, so a near-tie (gap below 1e-5) may flip; anything else is a bug.
"""

from __future__ import annotations

import argparse
import json
import math
import time
from pathlib import Path

import torch
from provenance import run_commit

import ecospec
from ecospec.analysis.latency import fit_line
from ecospec.analysis.weight_bytes import model_cost, verify_hbm_bytes
from ecospec.engine.compiled import prepare
from ecospec.engine.static_eagle3 import prepare_drafter
from ecospec.engine.static_predictor import prepare_predictor
from ecospec.tiny import load_tiny
from ecospec.tiny.evaluate import humaneval_ids

METHODS = {"AR": {}, "EAGLE-3": {"selector": "confidence"}, "EcoSpec": {"selector": "ecospec"}}
DEPTH, TOPK = 3, 2  # the draft tree's (generate's defaults): DEPTH head passes a draft step


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--gamma", type=int, default=6)
    ap.add_argument("--out", type=Path, default=None, help="write compiled_engine.json / .md there")
    a = ap.parse_args()
    torch.set_num_threads(1)
    target, tokenizer, drafter, predictor = load_tiny()
    prompts = humaneval_ids(tokenizer, a.prompts)
    longest = max(p.shape[1] for p in prompts) + a.tokens + a.gamma
    max_len = -(-longest // 128) * 128
    t0 = time.perf_counter()
    prepared = {
        "AR": prepare(target, gamma=1, max_len=max_len),  # an AR step verifies one token
        "SD": prepare(target, gamma=a.gamma, max_len=max_len, hidden_layers=tuple(drafter.hidden_layers)),
    }
    for make, part in ((prepare_drafter, drafter), (prepare_predictor, predictor)):  # generate reuses them
        make(part, gamma=a.gamma, depth=DEPTH, topk=TOPK, max_len=max_len)
    compile_s = time.perf_counter() - t0
    cpu = {(m, e): 0.0 for m in METHODS for e in ("eager", "compiled")}
    count = dict.fromkeys(cpu, 0)
    parts = {key: dict.fromkeys(("t_draft", "t_pred", "t_verify", "t_total", "steps", "experts"), 0.0) for key in cpu}
    flips, same_steps = [], True
    passes = {"eager": [], "compiled": []}  # (mean unique experts per layer, verify seconds) of full γ-token passes
    for i, ids in enumerate(prompts):
        for method, kw in METHODS.items():
            args = dict(kw)
            if method != "AR":
                args.update(
                    drafter=drafter,
                    predictor=predictor if method == "EcoSpec" else None,
                    gamma=a.gamma,
                    depth=DEPTH,
                    topk=TOPK,
                )
            outs = {}
            for engine in ("eager", "compiled"):
                run = engine if engine == "eager" else prepared["AR" if method == "AR" else "SD"]
                c0 = time.thread_time()
                outs[engine] = ecospec.generate(target, ids, max_new_tokens=a.tokens, engine=run, **args)
                cpu[method, engine] += time.thread_time() - c0
                count[method, engine] += len(outs[engine].tokens)
                for st in outs[engine].steps:
                    for part in ("t_draft", "t_pred", "t_verify", "t_total"):
                        parts[method, engine][part] += getattr(st, part)
                    parts[method, engine]["steps"] += 1
                    parts[method, engine]["experts"] += sum(st.experts) / len(st.experts)
                passes[engine] += [
                    (sum(st.experts) / len(st.experts), st.t_verify)
                    for st in outs[engine].steps
                    if method != "AR" and st.verified == a.gamma
                ]
            e, c = outs["eager"], outs["compiled"]
            if e.tokens != c.tokens:
                j = next(k for k, (x, y) in enumerate(zip(e.tokens, c.tokens, strict=False)) if x != y)
                seq = torch.cat([ids, torch.tensor([e.tokens[:j]], dtype=ids.dtype)], 1)
                with torch.inference_mode():
                    top2 = target(seq).logits[0, -1].float().topk(2).values
                flips.append({"prompt": i, "method": method, "position": j, "gap": float(top2[0] - top2[1])})
            else:
                same_steps &= [s.experts for s in e.steps] == [s.experts for s in c.steps]
                same_steps &= [s.accepted for s in e.steps] == [s.accepted for s in c.steps]
    ms = {f"{m} {e}": 1e3 * cpu[m, e] / count[m, e] for m, e in cpu}
    result = {
        "commit": run_commit(),
        "prompts": a.prompts,
        "tokens": a.tokens,
        "gamma": a.gamma,
        "max_len": max_len,
        "compile_s": round(compile_s, 1),
        "ms_per_token": {k: round(v, 3) for k, v in ms.items()},
        "speedup_vs_eager": {m: round(ms[f"{m} eager"] / ms[f"{m} compiled"], 2) for m in METHODS},
        "sd_vs_ar": {
            f"{m} {e}": round(ms[f"AR {e}"] / ms[f"{m} {e}"], 2)
            for m in METHODS
            if m != "AR"
            for e in ("eager", "compiled")
        },
        "shares": _shares(parts),
        "flips": flips,
        "steps_equal_where_tokens_equal": bool(same_steps),
        "verify_vs_experts": {e: _line(passes[e]) for e in passes},
        "weights_read": _weights_read(drafter, predictor, parts),
    }
    print(json.dumps(result, indent=1))
    if a.out:
        a.out.mkdir(parents=True, exist_ok=True)
        (a.out / "compiled_engine.json").write_text(json.dumps(result, indent=1) + "\n")


def _shares(parts: dict) -> dict:
    """Per SD method and engine, the step's parts as the engines table has them (wall time, means per step): the
    drafting against the same engine's AR step (T_draft / T_AR) and the predictor against the verify pass."""
    out = {}
    for (method, engine), p in parts.items():
        if method == "AR" or not p["steps"]:
            continue
        ar = parts["AR", engine]
        t_ar = ar["t_total"] / ar["steps"]
        out[f"{method} {engine}"] = {
            "ms_draft": round(1e3 * p["t_draft"] / p["steps"], 3),
            "ms_pred": round(1e3 * p["t_pred"] / p["steps"], 3),
            "ms_verify": round(1e3 * p["t_verify"] / p["steps"], 3),
            "ms_ar_step": round(1e3 * t_ar, 3),
            "draft_over_ar": round(p["t_draft"] / p["steps"] / t_ar, 3),
            "pred_over_verify": round(p["t_pred"] / p["t_verify"], 3),
        }
    return out


def _weights_read(drafter, predictor, parts: dict) -> dict:
    """The weight bytes a step's parts read (`analysis.weight_bytes`: each unique expert once, every other weight once),
    and their ratios: what the shares come to where a pass costs its bytes (production speed), not its op count.
    A draft step runs the head `DEPTH` times, its fc (target features -> hidden) only in the first; the predictor's
    pass and the head share the target's embedding rows."""
    cost = model_cost("tiny")
    mean_e = {m: p["experts"] / p["steps"] for (m, e), p in parts.items() if m != "AR" and e == "compiled"}
    size = lambda params: sum(p.numel() * p.element_size() for p in params)  # noqa: E731
    head, fc = size(drafter.head.parameters()), size(drafter.head.fc.parameters())
    draft = DEPTH * head - (DEPTH - 1) * fc
    pred = size(p for n, p in predictor.named_parameters() if not n.startswith("embed"))
    ar = verify_hbm_bytes(cost, cost.top_k)
    out = {
        "mb_ar_step": round(ar / 1e6, 3),
        "mb_draft_step": round(draft / 1e6, 3),
        "mb_predictor_pass": round(pred / 1e6, 3),
        "draft_over_ar": round(draft / ar, 3),
    }
    for method, e in mean_e.items():
        verify = verify_hbm_bytes(cost, e)
        out[f"{method} mb_verify"] = round(verify / 1e6, 3)
        out[f"{method} pred_over_verify"] = round(pred / verify, 3)
    return out


def _line(points: list[tuple[float, float]]) -> dict:
    """Least-squares line of verify milliseconds against unique experts per layer over the passes
    (`analysis.latency.fit_line`): the cost of one more expert in a pass (positive where a pass reads each expert it
    activates), its r and the passes counted."""
    x = [p[0] for p in points]
    y = [1e3 * p[1] for p in points]
    slope, _, r2 = fit_line(x, y)
    return {
        "ms_per_expert": round(slope, 4),
        "ms_at_mean": round(sum(y) / len(y), 3),
        "r": round(math.copysign(math.sqrt(max(r2, 0.0)), slope), 3),
        "passes": len(points),
        "experts_range": [round(min(x), 2), round(max(x), 2)],
    }


if __name__ == "__main__":
    main()
