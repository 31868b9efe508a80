"""Build stage: what the embedded default achieves on HumanEval prompts (paper setting: depth 3,
top-2, γ = 4, greedy): α and E per selector, predictor accuracy in the loop, T_pred per step."""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass

import torch

METHODS = (  # name, selector, predictor kind
    ("ar", "confidence", None),
    ("confidence", "confidence", None),
    ("ecospec", "ecospec", "learned"),
    ("global_cost", "global_cost", "learned"),
    ("oracle", "oracle", "oracle"),
)


@dataclass(frozen=True)
class EvalRecipe:
    prompts: int = 16
    max_new_tokens: int = 64
    gamma: int = 4
    depth: int = 3
    topk: int = 2


def load_components(dirs):
    """(target, tokenizer, drafter, predictor) of a finished build."""
    from transformers import AutoTokenizer

    from ecospec.drafters.eagle3 import Eagle3Drafter
    from ecospec.drafters.eagle3_checkpoint import load_eagle3
    from ecospec.predictor.model import ExpertPredictor
    from ecospec.tiny.build import _load_model

    target = _load_model(dirs["target"] / "model")
    tokenizer = AutoTokenizer.from_pretrained(dirs["corpus"] / "tokenizer")
    head = load_eagle3(dirs["drafter"] / "head", target.config)
    drafter = Eagle3Drafter(head, target.get_input_embeddings())
    predictor = ExpertPredictor.load(dirs["predictor"] / "final")
    return target, tokenizer, drafter, predictor


def humaneval_ids(tokenizer, n: int) -> list[torch.Tensor]:
    from ecospec.data.humaneval import humaneval_prompts

    bos = tokenizer.convert_tokens_to_ids("<|bos|>")
    out = []
    for problem in humaneval_prompts(n):
        ids = [bos] + tokenizer.encode(problem["prompt"], add_special_tokens=False)
        out.append(torch.tensor([ids]))
    return out


def evaluate(dirs, r: EvalRecipe, bar=lambda it, **kw: it) -> dict:
    import ecospec

    target, tokenizer, drafter, predictor = load_components(dirs)
    prompts = humaneval_ids(tokenizer, r.prompts)
    results: dict[str, dict] = {}
    ar_tokens = None
    for name, selector, kind in METHODS:
        pred = {"learned": predictor, "oracle": "oracle", None: None}[kind]
        outs, steps, tokens, seconds = [], [], 0, 0.0
        for ids in bar(prompts, desc=name, unit="prompt"):
            t0 = time.perf_counter()
            res = ecospec.generate(target, ids, drafter=None if name == "ar" else drafter, selector=selector,
                                   predictor=pred, gamma=r.gamma, depth=r.depth, topk=r.topk,
                                   max_new_tokens=r.max_new_tokens)  # fmt: skip
            seconds += time.perf_counter() - t0 - (sum(s.t_pred for s in res.steps) if kind == "oracle" else 0)
            tokens += len(res.tokens)
            outs.append(res.tokens)
            steps.extend(res.steps)
        if ar_tokens is None:
            ar_tokens = outs
        n = max(len(steps), 1)
        experts = [e for s in steps for e in s.experts]
        results[name] = {
            "alpha": sum(s.accepted for s in steps) / n,
            "experts_per_layer": sum(experts) / max(len(experts), 1),
            "t_pred_ms": 1e3 * sum(s.t_pred for s in steps) / n,
            "t_draft_ms": 1e3 * sum(s.t_draft for s in steps) / n,
            "t_verify_ms": 1e3 * sum(s.t_verify for s in steps) / n,
            "t_step_ms": 1e3 * sum(s.t_total for s in steps) / n,
            "tokens_per_s": tokens / seconds,
            "matches_ar": sum(a == b for a, b in zip(outs, ar_tokens, strict=True)) / len(outs),
            "steps": len(steps),
        }
    for name in results:
        results[name]["speedup"] = results[name]["tokens_per_s"] / results["ar"]["tokens_per_s"]
    return {"recipe": asdict(r), "methods": results, "top_k": predictor.config.top_k}


def evaluate_stage(ctx) -> dict:
    return evaluate(ctx.dirs, ctx.budget.evaluate, bar=ctx.bar)


def evaluate_summary(m: dict) -> list[str]:
    r = m["recipe"]
    lines = [f"HumanEval, {r['prompts']} prompts x {r['max_new_tokens']} tokens, depth {r['depth']}, "
             f"top-{r['topk']}, gamma {r['gamma']}, greedy (CPU wall clock, not GPU numbers):"]  # fmt: skip
    for name, x in m["methods"].items():
        lines.append(
            f"  {name:<12} alpha {x['alpha']:.2f}  E {x['experts_per_layer']:.2f}  T_pred {x['t_pred_ms']:.1f} ms"
            f"  T_step {x['t_step_ms']:.1f} ms  speedup {x['speedup']:.2f}x  matches AR {x['matches_ar']:.0%}"
        )
    return lines
