"""`make demo` (`python run.py experiment=demo`): AR, EAGLE-3 and EcoSpec on the same prompts, interleaved prompt by
prompt (AR, transformers' `generate`, EAGLE-3, EcoSpec), at the model's own γ, and a small table that says what
EcoSpec is for: fewer experts per verify pass than EAGLE-3 at equal output, what that buys on this CPU, and what it
would buy on one GPU (the roofline model: modeled, not measured). One record, one figure."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from tqdm.auto import tqdm

import ecospec
from ecospec.analysis.bootstrap import bootstrap, ratio_of, speedup
from ecospec.analysis.cost import load_model_config, model_cost, modeled_step, step_parts
from ecospec.data import encode_turn, load_prompts
from ecospec.drafters.registry import labels as drafter_labels
from ecospec.experiment.clock import now as clock_now
from ecospec.experiment.clock import pick_clock
from ecospec.experiment.components import load_components
from ecospec.experiment.hf_peer import hf_generate
from ecospec.experiment.intervals import speedup_units
from ecospec.experiment.job import run_job
from ecospec.experiment.metrics import hf_seconds, prompt_row, summarize

LABELS = drafter_labels()  # the baseline's row: the model's own drafter (drafters.registry)
FIGURE = "demo.png"


def _prompts(d: dict) -> list:
    s = d["demo"]
    out = []
    for name in s["datasets"]:
        out += list(load_prompts(name, s["prompts_per_dataset"], split=d.get("split", "heldout")))
    return out


def _generate(comp, ids: list[int], d: dict, selector: str | None):
    kw = dict(gamma=d["gamma"], depth=d["depth"], topk=d["topk"], max_new_tokens=d["max_new_tokens"], seed=d["seed"])
    if selector is None:
        return ecospec.generate(comp.target, torch.tensor([ids]), drafter=None, **kw)
    predictor = comp.predictor if selector == "ecospec" else None
    return ecospec.generate(
        comp.target, torch.tensor([ids]), drafter=comp.drafter, selector=selector, predictor=predictor, **kw
    )


def methods_of(d: dict) -> tuple[tuple[str, str | None], ...]:
    """(label, selector; None = AR): AR, the model's own drafter with confidence selection (EAGLE-3 on the embedded
    default), EcoSpec on that drafter."""
    kind = d["model"].get("default_drafter")
    return ("AR", None), (LABELS.get(kind, str(kind)), "confidence"), ("EcoSpec", "ecospec")


def modeled(model: dict, depth: int, gpu: str, selector: str | None, alpha: float, experts: float) -> dict:
    """The roofline model's step on `gpu` at this α and E, the whole step costed: the verify pass, each draft pass
    (a tree's depth of them) and the predictor's pass for EcoSpec (`analysis.cost.step_parts`)."""
    drafter = None if selector is None else model.get("default_drafter")
    parts = step_parts(model, drafter, depth, predictor=selector == "ecospec")
    return modeled_step(model_cost(model), alpha, experts, gpu, parts=parts)


def _demo(d: dict, job_dir: Path, device: torch.device, record: dict) -> None:
    prompts = _prompts(d)
    methods = methods_of(d)  # the table's rows
    comp = load_components(
        {**d, "method": {"name": "ecospec", "drafter": "default", "selector": "ecospec", "predictor": "learned"}},
        device,
    )
    rows = {label: [] for label, _ in methods}
    same = {label: 0 for label, _ in methods}
    clock, why = pick_clock(d.get("clock"), device)
    template = d["model"].get("chat_template", True)
    desc = " / ".join(label for label, _ in methods)
    for p in tqdm(prompts, desc=desc, unit="prompt", disable=not d.get("progress", True)):
        ids = encode_turn(comp.tokenizer, p.turns[:1], [], p.completion, template)
        ar_tokens = None
        for label, selector in methods:
            t0, c0 = clock_now()
            res = _generate(comp, ids, d, selector)
            t1, c1 = clock_now()
            rows[label].append(prompt_row(p.id, 0, len(ids), res, t1 - t0, False, c1 - c0))
            ar_tokens = list(res.tokens) if selector is None else ar_tokens
            same[label] += list(res.tokens) == ar_tokens
            if selector is None:  # transformers' generate, right after our AR (the AR its users have)
                toks, secs, cpu = hf_generate(
                    comp.target, torch.tensor([ids]), 0.0, 1.0, d["max_new_tokens"], d["seed"]
                )
                rows[label][-1].update(hf_tokens=len(toks), hf_seconds=secs, hf_cpu_seconds=cpu)
    ours_ar = summarize(rows["AR"], clock=clock)["tokens_per_s"]
    hf_ar = sum(r["hf_tokens"] for r in rows["AR"]) / sum(hf_seconds(r, clock) for r in rows["AR"])
    denominator = max(ours_ar, hf_ar)
    gpu = d["demo"]["gpu"]
    measured = {}
    units = {label: speedup_units(rows[label], rows["AR"], clock, False) for label, _ in methods}
    for label, selector in methods:
        s = summarize(rows[label], clock=clock)
        iv = bootstrap([units[label]], speedup, seed=d["seed"])
        alpha = 1.0 if selector is None else s["alpha"]
        experts = s["experts_per_layer"]
        measured[label] = {
            "alpha": alpha,
            "E": experts,
            "tokens_per_s": s["tokens_per_s"],
            "speedup": s["tokens_per_s"] / denominator,
            "modeled_speedup": modeled(d["model"], d["depth"], gpu, selector, alpha, experts)["speedup"],
            "matches_ar": same[label] / len(prompts),
            "t_step_s": s["t_step_s"],
            "speedup_interval": [iv.low, iv.high] if iv else None,
        }
    base = methods[1][0]  # EcoSpec against the baseline on the same prompts, interleaved: paired
    pair = bootstrap(
        [np.concatenate([units["EcoSpec"], units[base]], 1)],
        ratio_of(speedup, speedup, slice(0, 6), slice(6, 12)),
        seed=d["seed"],
    )
    record["summary"] = {
        "methods": measured,
        "prompts": len(prompts),
        "datasets": list(d["demo"]["datasets"]),
        "gamma": d["gamma"],
        "max_new_tokens": d["max_new_tokens"],
        "gpu": gpu,
        "ar_source": "hf_generate" if hf_ar > ours_ar else "ecospec",
        "ar_ecospec_tokens_per_s": ours_ar,
        "ar_hf_tokens_per_s": hf_ar,
        "figure": str(job_dir / FIGURE),
        "clock": clock,
        "ecospec_vs_baseline": pair.as_dict() if pair else None,
    }
    if why:
        record["summary"]["clock_note"] = why
    write_figure(record["summary"], job_dir / FIGURE)


def pct_interval(iv: dict | None) -> tuple[str, bool]:
    """A ratio and its interval as a change, '+4 % [−2, +9]', and whether the interval holds no change (within
    noise); ('(no interval)', False) without one."""
    if not iv:
        return "(no interval)", False
    est, lo, hi = (100 * (iv[k] - 1) for k in ("estimate", "low", "high"))
    return f"{signed(est)} % [{signed(lo)}, {signed(hi)}]", lo <= 0 <= hi


def signed(x: float) -> str:
    """A rounded percentage with its sign, minus as U+2212 (as the papers print it)."""
    return f"{round(x):+d}".replace("-", "\u2212")


def reading(s: dict) -> str:
    """One sentence that reads the table as it is: how much EcoSpec saves in experts, and how its lead over EAGLE-3
    on this CPU splits into acceptance (α) and step time (speedup ∝ α / step time)."""
    base = [k for k in s["methods"] if k not in ("AR", "EcoSpec")][0]
    e, c = s["methods"][base], s["methods"]["EcoSpec"]
    fewer = 1 - c["E"] / e["E"]
    alpha = c["alpha"] / e["alpha"] - 1
    step = e["t_step_s"] / c["t_step_s"] - 1  # > 0: EcoSpec's steps are shorter
    lead = c["speedup"] / e["speedup"] - 1
    gpu = c["modeled_speedup"] / e["modeled_speedup"] - 1
    where = f"on this CPU ({'CPU time' if s.get('clock') == 'thread_cpu' else 'wall clock'}, 95 % interval)"
    if "ecospec_vs_baseline" in s:
        change, noise = pct_interval(s["ecospec_vs_baseline"])
        versus = f"is {change} against it {where}{', within noise' if noise else ''}"
    else:
        versus = f"is {100 * lead:+.0f} % against it {where} (a record from before intervals)"
    return (
        f"EcoSpec verifies {100 * fewer:.0f} % fewer experts per layer than {base} (E {c['E']:.1f} vs {e['E']:.1f}) "
        f"and {versus}; acceptance gives {100 * alpha:+.0f} % "
        f"(α {c['alpha']:.2f} vs {e['alpha']:.2f}) and step time {100 * step:+.0f} % (its step includes the expert "
        f"predictor); on one {s['gpu']}, where weight bytes set a pass's time, the roofline "
        f"model gives it {100 * gpu:+.0f} % (modeled, not measured)."
    )


def clock_words(s: dict) -> str:
    return "CPU time of the decoding thread" if s.get("clock") == "thread_cpu" else "wall clock"


def table(s: dict, config: dict | None = None) -> str:
    """The demo's table as printed (plain text, one row per method). With the record's `config`, the modeled column
    is computed anew from α and E (a record kept from before the whole step was costed prints today's model)."""
    if config is not None:
        model = load_model_config(config["model"]["name"])
        depth = (config.get("demo") or {}).get("depth", 3)
        selectors = dict(zip(s["methods"], (sel for _, sel in methods_of({"model": model})), strict=True))
        s = {
            **s,
            "methods": {
                label: {
                    **m,
                    "modeled_speedup": modeled(model, depth, s["gpu"], selectors[label], m["alpha"], m["E"])["speedup"],
                }
                for label, m in s["methods"].items()
            },
        }
    gpu = s["gpu"]
    head = f"{'':<9}{'α':>6}{'E':>7}{'speedup (CPU) [95 %]':>24}{f'modeled ({gpu})':>17}{'same as AR':>12}"
    lines = [head]
    for label, m in s["methods"].items():
        iv = m.get("speedup_interval")
        band = f"[{iv[0]:.2f}, {iv[1]:.2f}]" if iv else ""
        lines.append(
            f"{label:<9}{m['alpha']:>6.2f}{m['E']:>7.2f}{m['speedup']:>9.2f}x {band:>13}"
            f"{m['modeled_speedup']:>16.2f}x{100 * m['matches_ar']:>11.0f}%"
        )
    ar = "transformers' generate" if s["ar_source"] == "hf_generate" else "our AR loop"
    lines.append(
        f"{s['prompts']} held-out prompts ({', '.join(s['datasets'])}) x {s['max_new_tokens']} tokens, greedy, "
        f"γ = {s['gamma']}; speedup vs the faster AR ({ar}), {clock_words(s)}, with its 95 % interval (paired "
        f"bootstrap over prompts); α: tokens per step; E: unique experts per MoE layer per verify pass; modeled: "
        f"roofline weight bytes on one {gpu} (the verify pass, each draft pass and the predictor's), not measured."
    )
    return "\n".join([*lines, reading(s)])


def write_figure(s: dict, path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = list(s["methods"])
    colors = ["#9e9e9e", "#4c72b0", "#dd8452"]
    fig, (ax_e, ax_s) = plt.subplots(1, 2, figsize=(8, 3.2))
    ax_e.bar(labels, [s["methods"][k]["E"] for k in labels], color=colors)
    ax_e.set_title("E: experts per MoE layer per pass")
    x = range(len(labels))
    w = 0.38
    measured = [s["methods"][k]["speedup"] for k in labels]
    bands = [s["methods"][k].get("speedup_interval") or [v, v] for k, v in zip(labels, measured, strict=True)]
    err = [
        [v - b[0] for v, b in zip(measured, bands, strict=True)],
        [b[1] - v for v, b in zip(measured, bands, strict=True)],
    ]
    ax_s.bar(
        [i - w / 2 for i in x],
        measured,
        w,
        color=colors,
        label="CPU (measured, 95 % interval)",
        yerr=err,
        capsize=3,
        error_kw={"lw": 0.8},
    )
    ax_s.bar(
        [i + w / 2 for i in x],
        [s["methods"][k]["modeled_speedup"] for k in labels],
        w,
        color=colors,
        alpha=0.45,
        hatch="//",
        label=f"{s['gpu']} (modeled)",
    )
    ax_s.set_xticks(list(x), labels)
    ax_s.axhline(1.0, color="black", lw=0.6)
    ax_s.set_title("speedup vs AR")
    ax_s.legend(fontsize=7, loc="upper left")
    title = f"embedded default, γ = {s['gamma']}, {s['prompts']} prompts x {s['max_new_tokens']} tokens"
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=130)
    plt.close(fig)
    return path


def run_demo(cfg, job_dir: str | Path) -> dict:
    return run_job(cfg, job_dir, _demo)
