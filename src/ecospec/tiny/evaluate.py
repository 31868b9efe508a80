"""Build stage: what the embedded default achieves on HumanEval prompts (paper setting: depth 3,
top-2, γ = 4, greedy): α and E per selector, predictor accuracy in the loop, T_pred per step."""

from __future__ import annotations

import time
from dataclasses import asdict

import torch

from ecospec.analysis.loops import in_loop
from ecospec.components import load_build
from ecospec.tiny.budgets import EvalRecipe

METHODS = (  # name, selector, predictor kind (the other methods: python run.py -m experiment=tiny_repro)
    ("ar", "confidence", None),
    ("confidence", "confidence", None),
    ("ecospec", "ecospec", "learned"),
)


def humaneval_ids(tokenizer, n: int) -> list[torch.Tensor]:
    from ecospec.data.humaneval import humaneval_prompts

    bos = tokenizer.convert_tokens_to_ids("<|bos|>")
    out = []
    for problem in humaneval_prompts(n):
        ids = [bos] + tokenizer.encode(problem["prompt"], add_special_tokens=False)
        out.append(torch.tensor([ids]))
    return out


def heldout_ids(tokenizer, datasets, n: int) -> dict[str, list[torch.Tensor]]:
    """Per dataset, the first turn of its first `n` held-out prompts as a tiny cell encodes it (plain text: the tiny
    model has no chat template), each [1, T]; for benchmarks that compare heads or selectors outside run.py."""
    from ecospec.data import encode_turn, load_prompts

    return {
        name: [
            torch.tensor([encode_turn(tokenizer, p.turns, [], p.completion, False)])
            for p in load_prompts(name, n, None, split="heldout")
        ]
        for name in datasets
    }


def evaluate(dirs, r: EvalRecipe, bar=lambda it, **kw: it) -> dict:
    """Every method on every prompt, interleaved (a prompt's methods run back to back, so a machine that slows
    down mid-run slows them alike), greedy; per method α, E, per-step phase times, tokens/s, speedup vs AR,
    whether the output equals AR's, and AR's loop share (`analysis.loops.in_loop`)."""
    import ecospec

    target, tokenizer, drafter, predictor = load_build(dirs)
    prompts = humaneval_ids(tokenizer, r.prompts)
    outs = {name: [] for name, _, _ in METHODS}
    steps = {name: [] for name, _, _ in METHODS}
    seconds = dict.fromkeys(outs, 0.0)
    for ids in bar(prompts, desc="evaluate", unit="prompt"):
        for name, selector, kind in METHODS:
            pred = {"learned": predictor, "oracle": "oracle", None: None}[kind]
            t0 = time.perf_counter()
            res = ecospec.generate(
                target,
                ids,
                drafter=None if name == "ar" else drafter,
                selector=selector,
                predictor=pred,
                gamma=r.gamma,
                depth=r.depth,
                topk=r.topk,
                max_new_tokens=r.max_new_tokens,
            )
            seconds[name] += time.perf_counter() - t0 - (sum(s.t_pred for s in res.steps) if kind == "oracle" else 0)
            outs[name].append(res.tokens)
            steps[name].extend(res.steps)
    results: dict[str, dict] = {}
    for name, st in steps.items():
        n = max(len(st), 1)
        experts = [e for s in st for e in s.experts]
        results[name] = {
            "alpha": sum(s.accepted for s in st) / n,
            "experts_per_layer": sum(experts) / max(len(experts), 1),
            "t_pred_ms": 1e3 * sum(s.t_pred for s in st) / n,
            "t_draft_ms": 1e3 * sum(s.t_draft for s in st) / n,
            "t_verify_ms": 1e3 * sum(s.t_verify for s in st) / n,
            "t_step_ms": 1e3 * sum(s.t_total for s in st) / n,
            "tokens_per_s": sum(map(len, outs[name])) / seconds[name],
            "matches_ar": sum(a == b for a, b in zip(outs[name], outs["ar"], strict=True)) / len(prompts),
            "steps": len(st),
        }
    for name in results:
        results[name]["speedup"] = results[name]["tokens_per_s"] / results["ar"]["tokens_per_s"]
    loops = [x for x in (in_loop(list(t)) for t in outs["ar"]) if x is not None]
    return {
        "recipe": asdict(r),
        "methods": results,
        "top_k": predictor.config.top_k,
        "loop_share": sum(loops) / len(loops) if loops else None,
    }


def evaluate_stage(ctx) -> dict:
    """Decodes on one thread, as a cell does (``model.cpu_threads``: tiny matmuls only synchronise on more)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return evaluate(ctx.dirs, ctx.budget.evaluate, bar=ctx.bar)
    finally:
        torch.set_num_threads(threads)


def evaluate_summary(m: dict) -> list[str]:
    r = m["recipe"]
    lines = [
        f"HumanEval, {r['prompts']} prompts x {r['max_new_tokens']} tokens, depth {r['depth']}, "
        f"top-{r['topk']}, gamma {r['gamma']}, greedy (CPU wall clock, not GPU numbers):"
    ]
    ar_ms = m["methods"]["ar"]["t_step_ms"]
    for name, x in m["methods"].items():
        lines.append(
            f"  {name:<12} alpha {x['alpha']:.2f}  E {x['experts_per_layer']:.2f}  T_draft/T_AR "
            f"{x['t_draft_ms'] / ar_ms:.0%}  T_pred/T_verify {x['t_pred_ms'] / x['t_verify_ms']:.1%}  T_step "
            f"{x['t_step_ms']:.1f} ms  speedup {x['speedup']:.2f}x  matches AR {x['matches_ar']:.0%}"
        )
    if m.get("loop_share") is not None:
        lines.append(f"  AR outputs in a loop of period <= 2 (last 16 tokens): {m['loop_share']:.0%}")
    return lines
