"""What moves the tiny GTO head's acceptance length: train variants of the build's `gto` stage, then measure
alpha of each head against the EAGLE-3 head it started from, on the held-out prompts of the four offline
benchmarks (greedy, depth 3, top-2, gamma 4 = Table 5's setting). alpha is deterministic at T = 0, so the
comparison is exact; no timing here.

    python benchmarks/studies/gto_study.py train --out /tmp/gto --name lr3e-3 --set lr=0.003 [--set gto_weight=0 ...]
    python benchmarks/studies/gto_study.py eval /tmp/gto/lr3e-3 /tmp/gto/ablation [--prompts 8] [--tokens 64]

`train` runs the stage's own code (`ecospec.tiny.gto.gto_stage`) with `GtoRecipe` fields overridden, on the
embedded build's target and EAGLE-3 head, and writes `<out>/<name>/head` and `metrics.json` (with the commit it ran
at).
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import asdict, fields, replace
from pathlib import Path

import torch
from provenance import run_commit

DATASETS = ("gsm8k", "humaneval", "math500", "mtbench")


def _value(field_type: str, text: str):
    """A GtoRecipe field's value from text (the module's annotations are strings: `from __future__`)."""
    return {"int": int, "float": float, "str": str}[field_type](text)


def train(out: Path, name: str, overrides: list[str], threads: int) -> None:
    from ecospec.tiny.budgets import GtoRecipe, get_budget
    from ecospec.tiny.build import Context, build, paths
    from ecospec.tiny.gto import gto_stage

    build("full", until="predictor")
    types = {f.name: f.type for f in fields(GtoRecipe)}
    changes = {}
    for item in overrides:
        key, _, text = item.partition("=")
        if key not in types:
            raise SystemExit(f"unknown GtoRecipe field {key!r}; fields: {', '.join(types)}")
        changes[key] = _value(types[key], text)
    budget = get_budget("full")
    budget = replace(budget, gto=replace(budget.gto, **changes))
    dirs = paths("full")  # the default build's target and EAGLE-3 head (the variant changes only this stage)
    target_dir = out / name
    target_dir.mkdir(parents=True, exist_ok=True)
    torch.set_num_threads(threads)
    ctx = Context(budget=budget, root=dirs["root"], out=target_dir, dirs=dirs, metrics={}, progress=True)
    t0 = time.perf_counter()
    metrics = gto_stage(ctx)
    metrics["seconds"] = time.perf_counter() - t0
    metrics["threads"] = threads
    metrics["commit"] = run_commit()
    (target_dir / "metrics.json").write_text(json.dumps(metrics, indent=1))
    print(json.dumps({k: v for k, v in metrics.items() if k != "recipe"}, indent=1), asdict(budget.gto))


def evaluate(heads: list[Path], n: int, tokens: int) -> None:
    import ecospec
    from ecospec.components import load_build
    from ecospec.drafters.eagle3 import Eagle3Drafter
    from ecospec.drafters.eagle3_checkpoint import load_eagle3
    from ecospec.tiny.build import paths
    from ecospec.tiny.evaluate import heldout_ids

    torch.set_num_threads(1)
    target, tokenizer, base, _ = load_build(paths("full"))
    drafters = {"eagle3": base}
    for h in heads:
        drafters[h.name] = Eagle3Drafter(load_eagle3(h / "head", target.config), target.get_input_embeddings())
    prompts = heldout_ids(tokenizer, DATASETS, n)
    alpha: dict[str, dict[str, float]] = {name: {} for name in drafters}
    for ds, ids_list in prompts.items():
        for name, drafter in drafters.items():
            acc = steps = 0
            for ids in ids_list:
                res = ecospec.generate(target, ids, drafter=drafter, gamma=4, depth=3, topk=2, max_new_tokens=tokens)
                acc += sum(s.accepted for s in res.steps)
                steps += len(res.steps)
            alpha[name][ds] = acc / steps
    print(f"alpha, {n} held-out prompts x {tokens} tokens per benchmark, T = 0, depth 3, top-2, gamma 4")
    print(f"{'head':<16}" + "".join(f"{d:>11}" for d in DATASETS) + f"{'mean':>9}{'vs EAGLE-3':>12}")
    base_mean = sum(alpha["eagle3"].values()) / len(DATASETS)
    for name, a in alpha.items():
        mean = sum(a.values()) / len(DATASETS)
        print(f"{name:<16}" + "".join(f"{a[d]:>11.3f}" for d in DATASETS) + f"{mean:>9.3f}{mean / base_mean:>11.3f}x")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    t = sub.add_parser("train")
    t.add_argument("--out", type=Path, required=True)
    t.add_argument("--name", required=True)
    t.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE", help="a GtoRecipe field")
    t.add_argument("--threads", type=int, default=2)
    e = sub.add_parser("eval")
    e.add_argument("heads", type=Path, nargs="*", help="directories written by train")
    e.add_argument("--prompts", type=int, default=8)
    e.add_argument("--tokens", type=int, default=64)
    args = parser.parse_args()
    if args.command == "train":
        train(args.out, args.name, args.set, args.threads)
    else:
        evaluate(args.heads, args.prompts, args.tokens)


if __name__ == "__main__":
    main()
