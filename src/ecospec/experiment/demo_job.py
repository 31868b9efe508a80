"""`make demo` (`python run.py experiment=demo`): AR, EAGLE-3 and EcoSpec on the same prompts, interleaved prompt by
prompt (AR, transformers' `generate`, EAGLE-3, EcoSpec), at the model's own γ, and a small table that says what
EcoSpec is for: fewer experts per verify pass than EAGLE-3 at equal output, what that buys on this CPU, and what it
would buy on one GPU (the roofline model: modeled, not measured). One record, one figure."""

from __future__ import annotations

import time
from pathlib import Path

import torch
from tqdm.auto import tqdm

import ecospec
from ecospec.analysis.cost import model_cost, modeled_step
from ecospec.data import encode_turn, load_prompts
from ecospec.experiment.components import load_components
from ecospec.experiment.hf_peer import hf_generate
from ecospec.experiment.job import run_job
from ecospec.experiment.metrics import prompt_row, summarize

LABELS = {"eagle3": "EAGLE-3", "mtp": "MTP", "draft_model": "Draft model", "gto": "GTO"}  # the baseline's row
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
    return ecospec.generate(comp.target, torch.tensor([ids]), drafter=comp.drafter, selector=selector,
                            predictor=predictor, **kw)  # fmt: skip


def methods_of(d: dict) -> tuple[tuple[str, str | None], ...]:
    """(label, selector; None = AR): AR, the model's own drafter with confidence selection (EAGLE-3 on the embedded
    default), EcoSpec on that drafter."""
    kind = d["model"].get("default_drafter")
    return ("AR", None), (LABELS.get(kind, str(kind)), "confidence"), ("EcoSpec", "ecospec")


def _demo(d: dict, job_dir: Path, device: torch.device, record: dict) -> None:
    prompts = _prompts(d)
    methods = methods_of(d)  # the table's rows
    comp = load_components({**d, "method": {"name": "ecospec", "drafter": "default", "selector": "ecospec",
                                             "predictor": "learned"}}, device)  # fmt: skip
    rows = {label: [] for label, _ in methods}
    hf_tokens = hf_seconds = 0.0
    same = {label: 0 for label, _ in methods}
    template = d["model"].get("chat_template", True)
    desc = " / ".join(label for label, _ in methods)
    for p in tqdm(prompts, desc=desc, unit="prompt", disable=not d.get("progress", True)):
        ids = encode_turn(comp.tokenizer, p.turns[:1], [], p.completion, template)
        ar_tokens = None
        for label, selector in methods:
            t0 = time.perf_counter()
            res = _generate(comp, ids, d, selector)
            rows[label].append(prompt_row(p.id, 0, len(ids), res, time.perf_counter() - t0, False))
            ar_tokens = list(res.tokens) if selector is None else ar_tokens
            same[label] += list(res.tokens) == ar_tokens
        toks, secs = hf_generate(comp.target, torch.tensor([ids]), 0.0, 1.0, d["max_new_tokens"], d["seed"])
        hf_tokens, hf_seconds = hf_tokens + len(toks), hf_seconds + secs
    ours_ar = summarize(rows["AR"])["tokens_per_s"]
    hf_ar = hf_tokens / hf_seconds
    denominator = max(ours_ar, hf_ar)
    cost = model_cost(d["model"])
    gpu = d["demo"]["gpu"]
    measured = {}
    for label, selector in methods:
        s = summarize(rows[label])
        alpha = 1.0 if selector is None else s["alpha"]
        experts = s["experts_per_layer"]
        measured[label] = {
            "alpha": alpha,
            "E": experts,
            "tokens_per_s": s["tokens_per_s"],
            "speedup": s["tokens_per_s"] / denominator,
            "modeled_speedup": modeled_step(cost, alpha, experts, gpu)["speedup"],
            "matches_ar": same[label] / len(prompts),
            "t_step_s": s["t_step_s"],
        }
    record["summary"] = {
        "methods": measured, "prompts": len(prompts), "datasets": list(d["demo"]["datasets"]), "gamma": d["gamma"],
        "max_new_tokens": d["max_new_tokens"], "gpu": gpu, "ar_source": "hf_generate" if hf_ar > ours_ar else "ecospec",
        "ar_ecospec_tokens_per_s": ours_ar, "ar_hf_tokens_per_s": hf_ar, "figure": str(job_dir / FIGURE),
    }  # fmt: skip
    write_figure(record["summary"], job_dir / FIGURE)


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
    return (
        f"EcoSpec verifies {100 * fewer:.0f} % fewer experts per layer than {base} (E {c['E']:.1f} vs {e['E']:.1f}) "
        f"and is {100 * lead:+.0f} % against it on this CPU, of which acceptance gives {100 * alpha:+.0f} % "
        f"(α {c['alpha']:.2f} vs {e['alpha']:.2f}) and step time {100 * step:+.0f} % (its step includes the expert "
        f"predictor); on one {s['gpu']}, where weight bytes set a pass's time, the roofline "
        f"model gives it {100 * gpu:+.0f} % (modeled, not measured)."
    )


def table(s: dict) -> str:
    """The demo's table as printed (plain text, one row per method)."""
    gpu = s["gpu"]
    head = f"{'':<9}{'α':>6}{'E':>7}{'speedup (CPU)':>15}{f'modeled ({gpu})':>17}{'same as AR':>12}"
    lines = [head]
    for label, m in s["methods"].items():
        lines.append(f"{label:<9}{m['alpha']:>6.2f}{m['E']:>7.2f}{m['speedup']:>14.2f}x{m['modeled_speedup']:>16.2f}x"
                     f"{100 * m['matches_ar']:>11.0f}%")  # fmt: skip
    ar = "transformers' generate" if s["ar_source"] == "hf_generate" else "our AR loop"
    lines.append(
        f"{s['prompts']} held-out prompts ({', '.join(s['datasets'])}) x {s['max_new_tokens']} tokens, greedy, "
        f"γ = {s['gamma']}; speedup vs the faster AR ({ar}); α: tokens per step; E: unique experts per MoE "
        f"layer per verify pass; modeled: roofline weight bytes on one {gpu}, not measured."
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
    ax_s.bar([i - w / 2 for i in x], measured, w, color=colors, label="CPU (measured)")
    ax_s.bar([i + w / 2 for i in x], [s["methods"][k]["modeled_speedup"] for k in labels], w, color=colors, alpha=0.45,
             hatch="//", label=f"{s['gpu']} (modeled)")  # fmt: skip
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
