"""The tiny build's `calibrate` stage: a temperature on the EAGLE-3 head's logits so that its confidence tracks the
target's acceptance (`analysis.calibration`), fitted on prompts no cell evaluates (the benchmarks' non-held-out
80 %), written to `calibrate/calibration.json` and applied wherever the build's head drafts (the model config's
`drafters.eagle3.temperature: calibrated`, read by `components.calibrated_temperature`). The head's weights are
untouched (vLLM serves them as they are: its chain drafting takes the top token, which a temperature does not
change)."""

from __future__ import annotations

import json
from dataclasses import asdict

import torch

from ecospec.components import CALIBRATION, load_build
from ecospec.tiny.budgets import CalibrateRecipe, calibrate_recipe

DATASETS = ("gsm8k", "humaneval", "math500", "mtbench")  # the four with an offline copy


def train_ids(tokenizer, datasets, n: int) -> list[torch.Tensor]:
    """The first turn of the first `n` prompts of each dataset outside its held-out split, [1, T] each; datasets
    this machine cannot load are left out."""
    from ecospec.data import DatasetUnavailableError, encode_turn, load_prompts
    from ecospec.data.split import is_heldout

    out = []
    for name in datasets:
        try:
            rows = load_prompts(name, None, None, split="all")
        except DatasetUnavailableError:
            continue
        prompts = [p for p in rows if not is_heldout(p.id)][:n]
        out += [torch.tensor([encode_turn(tokenizer, p.turns, [], p.completion, False)]) for p in prompts]
    return out


def calibrate_stage(ctx) -> dict:
    from ecospec.analysis.calibration import collect, fit_temperatures, nll, reliability

    r = CalibrateRecipe(**calibrate_recipe(ctx.budget))
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        target, tokenizer, drafter, _ = load_build(ctx.dirs, calibrated=False)
        prompts = train_ids(tokenizer, DATASETS, r.prompts_per_dataset)
        if not prompts:
            raise RuntimeError("no calibration prompts: none of gsm8k, humaneval, math500, mtbench loads here")
        ctx.log(f"calibrating the EAGLE-3 head's temperature on {len(prompts)} train-split prompts")
        samples = collect(target, drafter, prompts, r.depth, r.max_new_tokens)
    finally:
        torch.set_num_threads(threads)
    t = fit_temperatures(samples)
    before, after = reliability(samples, 1.0), reliability(samples, t)
    metrics = {
        "recipe": asdict(r),
        "temperature": list(t),
        "prompts": len(prompts),
        "samples": int((samples.labels >= 0).sum()),
        "nll_before": nll(samples, 1.0),
        "nll_after": nll(samples, t),
        "ece_before": before.ece,
        "ece_after": after.ece,
        "confidence_before": before.confidence,
        "confidence_after": after.confidence,
        "acceptance": before.accuracy,
    }
    (ctx.out / CALIBRATION).write_text(json.dumps(metrics, indent=1))
    return metrics


def calibrate_summary(m: dict) -> list[str]:
    by_depth = ", ".join(
        f"d{d + 1} {b:.2f}->{a:.2f} (acc {x:.2f})"
        for d, (b, a, x) in enumerate(zip(m["confidence_before"], m["confidence_after"], m["acceptance"], strict=True))
    )
    return [
        f"draft temperature by depth {' / '.join(f'{x:.3f}' for x in m['temperature'])} on {m['samples']} "
        f"draft tokens of {m['prompts']} train-split "
        f"prompts: NLL {m['nll_before']:.3f} -> {m['nll_after']:.3f}, "
        f"ECE {m['ece_before']:.3f} -> {m['ece_after']:.3f}",
        f"top-1 confidence by depth {by_depth}",
    ]
