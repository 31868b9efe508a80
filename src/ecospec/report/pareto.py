"""The MoE-Spec comparison's figure, from the MoE-Spec table (`moespec.table_moespec`), PNG + PDF as
`report/figures.py` writes them:

* fig_moespec_pareto_<model>: speedup against quality at T = 0, one panel per quality measure (budget error rate,
  1 - matches_ar): the lossless methods (EAGLE-3 / the model's baseline, EcoSpec) sit at zero error, each expert
  budget of MoE-Spec and EcoSpec + MoE-Spec is a point labelled B, measured speedup solid, the roofline speedups
  on each GPU profile hollow. Up and to the left is better: a Pareto picture of lossless vs lossy savings.
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from ecospec.report.figures import FigureInfo, remove_stale, save, slug, suptitle
from ecospec.report.frame import model_label

FILE_NAME = re.compile(r"fig_moespec_pareto_.+\.(png|pdf)")
GPU_MARKERS = {"H100": "^", "H200": "s", "B200": "D"}
QUALITY = [
    ("budget_error_rate", "budget error rate (share of committed tokens ≠ uncapped greedy)"),
    ("1 - matches_ar", "1 − matches_ar (share of prompts whose output differs from AR)"),
]


def _colour(method: str) -> str:
    if method.startswith("EcoSpec + MoE-Spec"):
        return "tab:purple"
    if method.startswith("MoE-Spec"):
        return "tab:red"
    return "tab:green" if method.startswith("EcoSpec") else "tab:blue"


def pareto_figure(table: pd.DataFrame, model: str) -> tuple[Figure, str] | None:
    """One model's greedy rows of the MoE-Spec table as speedup-vs-quality panels; None without budgeted rows."""
    rows = table[(table["Model"] == model) & (table["T"] == 0)].copy()
    if rows.empty or not (rows["Budget"] != "—").any() or "matches_ar" not in rows:
        return None
    rows["1 - matches_ar"] = 1.0 - rows["matches_ar"]
    gpus = [c.split()[1] for c in rows.columns if c.startswith("modeled ") and c.endswith(" speedup")]
    fig = Figure(figsize=(6.2 * len(QUALITY), 4.8), layout="constrained")
    axes = fig.subplots(1, len(QUALITY), squeeze=False)[0]
    suptitle(fig, f"{model}: speedup vs quality, EcoSpec (lossless) and MoE-Spec's expert budget (T = 0)")
    for ax, (metric, xlabel) in zip(axes, QUALITY, strict=True):
        for method, g in rows.groupby("Method", sort=False):
            colour = _colour(method)
            g = g[g[metric].notna()]
            if g.empty:
                continue
            x = g[metric].to_numpy(float)
            ax.plot(x, g["speedup"].to_numpy(float), marker="o", color=colour, linewidth=1.5, label=method)
            for gpu in gpus:
                ax.plot(
                    x,
                    g[f"modeled {gpu} speedup"].to_numpy(float),
                    marker=GPU_MARKERS.get(gpu, "v"),
                    color=colour,
                    linestyle=":",
                    linewidth=0.8,
                    markerfacecolor="none",
                )
            for xi, yi, b in zip(x, g["speedup"].to_numpy(float), g["Budget"], strict=True):
                if b != "—":
                    ax.annotate(b[2:], (xi, yi), textcoords="offset points", xytext=(4, 3), fontsize=7, color=colour)
        for gpu in gpus:  # legend entries for the modeled markers
            ax.plot(
                [],
                [],
                marker=GPU_MARKERS.get(gpu, "v"),
                color="gray",
                linestyle=":",
                markerfacecolor="none",
                label=f"{gpu} (modeled)",
            )
        ax.axhline(1.0, color="black", linewidth=0.8, linestyle="--")
        ax.set_xlabel(xlabel)
        ax.set_ylabel("speedup vs AR (solid: measured)")
        ax.set_xlim(left=-0.02 * max(1e-3, float(np.nanmax(rows[metric].to_numpy(float)))))
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7, loc="best")
    caption = (
        f"MoE-Spec comparison, {model}, greedy: speedup vs AR against quality for the model's baseline and EcoSpec "
        "(lossless: zero error) and each expert budget B of MoE-Spec and EcoSpec + MoE-Spec (point labels = B). "
        "Solid: measured wall clock; hollow, dotted: the roofline model at the measured α and E on each GPU profile. "
        "Left: budget error rate (committed tokens the uncapped target would not have produced); right: 1 − "
        "matches_ar. From the MoE-Spec table (moespec.md)."
    )
    return fig, caption


def write_pareto_figures(table: pd.DataFrame | None, used: pd.DataFrame | None, out_dir: Path) -> list[FigureInfo]:
    """A figure per model of the MoE-Spec table with budgeted greedy rows; this module's stale files removed."""
    out_dir = Path(out_dir)
    infos = []
    for model in [] if table is None or table.empty else list(dict.fromkeys(table["Model"])):
        drawn = pareto_figure(table, model)
        if drawn is None:
            continue
        out_dir.mkdir(parents=True, exist_ok=True)
        name = f"fig_moespec_pareto_{slug(model)}"
        rows = used if used is not None else pd.DataFrame({"experiment": [], "model": []})
        rows = rows[rows["model"].map(model_label) == model]
        experiments = sorted(rows["experiment"].dropna().astype(str).unique())
        infos.append(FigureInfo(name, save(drawn[0], out_dir / name), drawn[1], experiments, len(rows)))
    remove_stale(out_dir, infos, FILE_NAME)
    return infos
