"""The overlap paper's figures from routing data (`report/routing.py`), PNG + PDF as `report/figures.py` writes them:

* fig_overlap_distance_<model>: overlap vs step distance per data source, with its independence line and k/N,
  the paper's Table 17 curves in grey for reference;
* fig_layer_overlap_<model>: step-1 overlap of each MoE layer vs its independence baseline (Figure 10);
* fig_ipf_unique: IPF-predicted vs empirical unique experts in a 4-token window, every model and source, the
  paper's Table 20 models as reference points, y = x;
* fig_accept_overlap_<model>: consecutive and anchor overlap of accepted vs first-rejected tokens by draft depth,
  mean ± SEM over all the model's traced SD records (Figure 9).
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from ecospec.analysis.acceptance import compare_by_depth
from ecospec.analysis.traces import DraftTokens
from ecospec.report.figures import FigureInfo, remove_stale, save, slug, suptitle
from ecospec.report.frame import model_label
from ecospec.report.overlap_paper import PAPER_LABELS
from ecospec.report.paper import overlap_paper_values
from ecospec.report.routing_data import CORPUS, RoutingData, RoutingSource, data_label

FILE_NAME = re.compile(r"(fig_(overlap_distance|layer_overlap|accept_overlap)_.+|fig_ipf_unique)\.(png|pdf)")
SOURCE_STYLE = {True: ("tab:green", "s"), False: ("tab:blue", "o")}  # corpus?, (colour, marker)


def _style(s: RoutingSource) -> tuple[str, str]:
    return SOURCE_STYLE[s.data == CORPUS]


def _info(name: str, fig: Figure, out_dir: Path, caption: str, used: pd.DataFrame) -> FigureInfo:
    experiments = sorted(used["experiment"].dropna().astype(str).unique()) if len(used) else []
    return FigureInfo(name, save(fig, out_dir / name), caption, experiments, len(used))


def distance_figure(sources: list[RoutingSource]) -> tuple[Figure, str]:
    model = sources[0].model
    fig = Figure(figsize=(6.4, 4.6), layout="constrained")
    ax = fig.subplots()
    d = np.arange(1, len(sources[0].stats.all.overlap) + 1)
    paper = overlap_paper_values(17).pivot_table(index="model", columns="metric", values="value", sort=False)
    for i, (name, row) in enumerate(paper.iterrows()):
        ax.plot(
            d,
            [row[f"overlap_d{j}"] for j in d],
            color="0.75",
            linewidth=1,
            zorder=1,
            label="paper Table 17 (6 models)" if i == 0 else None,
        )
        ax.annotate(
            PAPER_LABELS.get(name, name),
            (d[-1], row[f"overlap_d{d[-1]}"]),
            xytext=(3, 0),
            textcoords="offset points",
            fontsize=6,
            color="0.5",
            va="center",
        )
    for s in sources:
        colour, marker = _style(s)
        a = s.stats.all
        ax.plot(d, a.overlap, marker=marker, color=colour, linewidth=2, label=data_label(s), zorder=3)
        ax.axhline(a.independence, color=colour, linestyle="--", linewidth=1.2, label=f"independence ({s.data})")
    ax.axhline(sources[0].stats.all.uniform, color="black", linestyle=":", linewidth=1.2, label="uniform k/N")
    ax.set_xticks(d)
    ax.set_xlim(0.8, d[-1] + 0.6)
    ax.set_ylim(bottom=0)
    ax.set_xlabel("step distance d (tokens)")
    ax.set_ylabel("overlap ratio (experts shared by tokens t, t+d) / k")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="best")
    suptitle(fig, f"Expert overlap vs step distance: {model_label(model)}")
    caption = (
        f"Overlap vs step distance ({model}): mean over MoE layers of the experts tokens t and t+d share / k, "
        "d = 1..4, per data source (SD records: committed sequences of traced SD runs; tiny corpus: the build's "
        "routing traces), dashed: each source's independence baseline, dotted: uniform k/N; grey: the overlap "
        "paper's Table 17."
    )
    return fig, caption


def layer_figure(sources: list[RoutingSource]) -> tuple[Figure, str]:
    model = sources[0].model
    layers = len(sources[0].stats.all.layer_overlap)
    fig = Figure(figsize=(max(6.4, 0.12 * layers + 3), 4.4), layout="constrained")
    ax = fig.subplots()
    for s in sources:
        colour, marker = _style(s)
        a = s.stats.all
        x = np.arange(len(a.layer_overlap))
        ax.plot(x, a.layer_overlap, marker=marker, color=colour, linewidth=1.8, label=f"empirical: {data_label(s)}")
        ax.plot(x, a.layer_independence, color=colour, linestyle="--", linewidth=1.2, label=f"independence ({s.data})")
    ax.axhline(sources[0].stats.all.uniform, color="black", linestyle=":", linewidth=1.2, label="uniform k/N")
    ax.set_xlabel("MoE layer")
    ax.set_ylabel("step-1 overlap ratio")
    if layers <= 16:
        ax.set_xticks(np.arange(layers))
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="best")
    suptitle(fig, f"Per-layer step-1 overlap: {model_label(model)}")
    caption = (
        f"Per-layer step-1 overlap ({model}, Figure 10 of the overlap paper): experts shared by consecutive tokens "
        "/ k in each MoE layer (solid) against that layer's independence baseline (dashed), per data source; "
        "dotted: k/N."
    )
    return fig, caption


def ipf_figure(sources: list[RoutingSource]) -> tuple[Figure, str]:
    fig = Figure(figsize=(6.4, 5.4), layout="constrained")
    ax = fig.subplots()
    paper = overlap_paper_values(20).pivot_table(index="model", columns="metric", values="value", sort=False)
    ax.scatter(
        paper["unique_empirical"],
        paper["unique_ipf_uniform"],
        marker="o",
        facecolors="none",
        edgecolors="0.5",
        label="paper Table 20: uniform IPF",
    )
    ax.scatter(
        paper["unique_empirical"],
        paper["unique_ipf_skewed"],
        marker="x",
        color="0.5",
        label="paper Table 20: skewed IPF",
    )
    for name, row in paper.iterrows():
        ax.annotate(
            PAPER_LABELS.get(name, name),
            (row["unique_empirical"], row["unique_ipf_skewed"]),
            xytext=(4, -8),
            textcoords="offset points",
            fontsize=6,
            color="0.4",
        )
    cycle = [f"C{i}" for i in range(10)]
    values = list(paper["unique_empirical"])
    for i, s in enumerate(sources):
        a = s.stats.all
        label = f"{model_label(s.model)}, {s.data}"
        ax.scatter(
            [a.unique_empirical],
            [s.ipf_uniform],
            marker="o",
            color=cycle[i % 10],
            s=50,
            label=f"{label}: uniform IPF",
            zorder=3,
        )
        ax.scatter(
            [a.unique_empirical],
            [s.ipf_skewed],
            marker="X",
            color=cycle[i % 10],
            s=60,
            label=f"{label}: skewed IPF",
            zorder=3,
        )
        values.append(a.unique_empirical)
    top = max(v for v in [*values, *paper["unique_ipf_uniform"]] if np.isfinite(v)) * 1.08
    ax.plot([0, top], [0, top], color="black", linewidth=1, label="y = x")
    ax.set_xlim(0, top)
    ax.set_ylim(0, top)
    ax.set_aspect("equal")
    ax.set_xlabel("empirical unique experts per MoE layer (4-token window)")
    ax.set_ylabel("IPF-predicted unique experts")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=6, loc="upper left")
    suptitle(fig, "Unique experts: IPF prediction vs empirical")
    caption = (
        "IPF-predicted vs empirical unique experts per MoE layer in a 4-token window (K = 3 drafts + root): the "
        "maximum-entropy IPF model from the measured overlaps at distance 1-3, with uniform (circles) or measured "
        "per-expert loads (crosses), for every model and data source with routes; grey: the overlap paper's "
        "Table 20 models; black: y = x."
    )
    return fig, caption


def accept_figure(model: str, tokens: DraftTokens) -> tuple[Figure, str] | None:
    comps = [c for c in compare_by_depth(tokens) if c.n_accepted and c.n_first_rejected]
    if not comps:
        return None
    fig = Figure(figsize=(10.5, 4.4), layout="constrained")
    axes = fig.subplots(1, 2, sharey=True)
    depth = np.array([c.depth for c in comps], dtype=float)
    panels = (
        ("consecutive overlap (token vs parent)", "overlap", "sem", "consecutive"),
        ("anchor overlap (depth 0 -> depth j)", "anchor", "anchor_sem", "anchor"),
    )
    for ax, (title, mean, sem, test) in zip(axes, panels, strict=True):
        for offset, group, colour in ((-0.06, "accepted", "tab:blue"), (0.06, "first_rejected", "tab:red")):
            means = [getattr(c, f"{mean}_{group}") for c in comps]
            errs = [getattr(c, f"{sem}_{group}") for c in comps]
            label = "accepted" if group == "accepted" else "first rejected"
            ax.errorbar(
                depth + offset,
                means,
                yerr=np.nan_to_num(errs),
                marker="o",
                capsize=4,
                color=colour,
                linewidth=1.8,
                label=label,
            )
        for c in comps:
            cmp = getattr(c, test)
            if cmp is not None:
                top = max(getattr(c, f"{mean}_accepted"), getattr(c, f"{mean}_first_rejected"))
                ax.annotate(
                    f"d = {cmp.cohen_d:+.2f}",
                    (c.depth, top),
                    xytext=(0, 10),
                    textcoords="offset points",
                    ha="center",
                    fontsize=8,
                )
        ax.set_title(title, fontsize=10)
        ax.set_xticks(depth)
        ax.set_xlabel("draft depth j")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    axes[0].set_ylabel("overlap ratio (mean ± SEM)")
    suptitle(fig, f"Accepted vs first-rejected draft tokens: routing overlap by depth, {model_label(model)}")
    n = ", ".join(f"depth {c.depth}: {c.n_accepted} / {c.n_first_rejected}" for c in comps)
    caption = (
        f"Accepted vs first-rejected tokens ({model}; Figure 9 of the overlap paper): consecutive overlap with the "
        "parent (left) and anchor overlap with the root (right) by draft depth, mean ± SEM, Cohen's d of accepted "
        f"- rejected annotated; all traced SD records of the model pooled (every method and T). n accepted / "
        f"first rejected: {n}."
    )
    return fig, caption


def write_routing_figures(data: RoutingData, out_dir: Path) -> list[FigureInfo]:
    """Every figure whose inputs exist, into `out_dir`; stale ones of this module are removed."""
    out_dir = Path(out_dir)
    infos: list[FigureInfo] = []
    if data.sources or data.tokens:
        out_dir.mkdir(parents=True, exist_ok=True)
    for model in data.models():
        sources = [s for s in data.sources if s.model == model]
        used = pd.concat([s.used for s in sources]).drop_duplicates("path")
        fig, caption = distance_figure(sources)
        infos.append(_info(f"fig_overlap_distance_{slug(model)}", fig, out_dir, caption, used))
        fig, caption = layer_figure(sources)
        infos.append(_info(f"fig_layer_overlap_{slug(model)}", fig, out_dir, caption, used))
    if data.sources:
        fig, caption = ipf_figure(data.sources)
        used = pd.concat([s.used for s in data.sources]).drop_duplicates("path")
        infos.append(_info("fig_ipf_unique", fig, out_dir, caption, used))
    for model, rows in data.traced.groupby("model", sort=True):
        drawn = accept_figure(model, DraftTokens.concat(data.tokens[p] for p in rows["path"]))
        if drawn is not None:
            infos.append(_info(f"fig_accept_overlap_{slug(model)}", drawn[0], out_dir, drawn[1], rows))
    remove_stale(out_dir, infos, FILE_NAME)
    return infos
