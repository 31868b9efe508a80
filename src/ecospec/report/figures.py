"""The paper's figures from result records: Figure 1(a)-(c) and Figure 4, each as PNG and PDF.

Input is the report's record frame (one row per result record; only `status == "ok"` rows are used). Every
figure aggregates with pandas/numpy first and draws a handful of artists, so 10,000 records cost about what
100 do. Figures are bare `Figure`s on the Agg canvas (no pyplot state) and are dropped after saving.
"""

from __future__ import annotations

import re
import textwrap
import warnings
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import matplotlib
import numpy as np
import pandas as pd
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.patches import Patch
from matplotlib.ticker import MaxNLocator

from ecospec.analysis.latency import fit_line
from ecospec.analysis.model_config import load_model_config
from ecospec.analysis.weight_bytes import FORMATS, model_cost
from ecospec.experiment.heatmap import expert_load_figure
from ecospec.methods import AR, methods
from ecospec.methods import method as selector
from ecospec.report.frame import SELECTOR_ROLES, VARIANT_DRAFTERS
from ecospec.report.lineup import BASELINE, sweep

DPI = 150
PAPER_MODELS = ("deepseek", "qwen3", "gptoss")  # Figure 1(c)'s three targets, always drawn
GAMMA_SWEEP = "table11_12"  # the experiment that sweeps γ: Figure 1(b) draws its roles (conf/experiment)
METHOD_COLOURS = {"ar": "dimgray", "eagle3": "tab:cyan", "mtp": "tab:purple", **{m.role: m.colour for m in methods()}}
METHOD_MARKERS = {"baseline": "o", "eagle3": "s", "mtp": "^", "ecospec": "D"}
FILE_NAME = re.compile(
    r"(fig1a_verify_latency|fig1b_unique_experts_vs_gamma|fig1c_expert_bytes|fig4_expert_load_.+)\.(png|pdf)"
)
FORMAT_COLOURS = {"bf16": "tab:blue", "fp16": "tab:cyan", "fp32": "tab:gray", "fp8": "tab:red", "mxfp4": "tab:green"}


@dataclass(frozen=True)
class FigureInfo:
    """One written figure: its files (PNG then PDF), a caption, and the records it was drawn from."""

    name: str
    files: list[Path]
    caption: str
    experiments: list[str]
    n_records: int


@dataclass(frozen=True)
class _Drawn:
    figure: Figure
    caption: str
    rows: pd.DataFrame  # the records drawn from


def write_figures(frame: pd.DataFrame, out_dir: Path) -> list[FigureInfo]:
    """Write every figure whose inputs exist into `out_dir` (`<name>.png` + `<name>.pdf`); return what was written.
    A figure without inputs is skipped, and its files from an earlier build are removed; an empty frame, or one
    without ok records, writes nothing."""
    out_dir = Path(out_dir)
    ok = frame[frame["status"] == "ok"] if "status" in frame else frame.iloc[0:0]
    if ok.empty:
        remove_stale(out_dir, [])
        return []
    out_dir.mkdir(parents=True, exist_ok=True)
    builders: list[tuple[str, Callable[[], _Drawn | None]]] = [
        ("fig1a_verify_latency", lambda: verify_latency_figure(ok)),
        ("fig1b_unique_experts_vs_gamma", lambda: unique_experts_figure(ok)),
        ("fig1c_expert_bytes", lambda: expert_bytes_figure(ok)),
    ]
    for model in sorted(ok["model"].dropna().unique()):
        rows = ok[ok["model"] == model]
        builders.append((f"fig4_expert_load_{slug(model)}", lambda rows=rows, model=model: load_figure(rows, model)))
    infos = []
    for name, build in builders:
        drawn = build()
        if drawn is None:
            continue
        infos.append(
            FigureInfo(
                name=name,
                files=save(drawn.figure, out_dir / name),
                caption=drawn.caption,
                experiments=sorted(drawn.rows["experiment"].dropna().astype(str).unique()),
                n_records=len(drawn.rows),
            )
        )
    remove_stale(out_dir, infos)
    return infos


def remove_stale(out_dir: Path, infos: list[FigureInfo], names: re.Pattern = FILE_NAME) -> None:
    """Delete the figure files matching `names` (a module's own figures; this module's by default) that this build
    did not write (a figure whose inputs are gone)."""
    kept = {p for info in infos for p in info.files}
    for path in Path(out_dir).glob("fig*"):
        if names.fullmatch(path.name) and path not in kept:
            path.unlink()


# Figure 1(a) -------------------------------------------------------------------------------------------------


def verify_latency_figure(ok: pd.DataFrame) -> _Drawn | None:
    """Verify latency (ms per pass) against E, one panel per (model, hardware), with a least-squares line.
    AR records enter as E = k with their per-token step."""
    rows = ok.dropna(subset=["E", "t_verify_s"])
    rows = rows[np.isfinite(rows["E"].astype(float)) & np.isfinite(rows["t_verify_s"].astype(float))]
    if rows.empty:
        return None
    rows = rows.assign(hardware=rows["hardware"].fillna("unknown hardware"), device=rows["device"].fillna(""))
    panels = list(rows.groupby(["model", "hardware"], sort=True))
    fig, axes = panel_grid(len(panels), width=5.2, height=4.4)
    suptitle(fig, "Figure 1(a): verification latency vs unique active experts (measured wall clock)")
    notes = []
    for ax, ((model, hardware), group) in zip(axes, panels, strict=False):
        clock = "CPU wall clock" if group["device"].astype(str).str.startswith("cpu").all() else "GPU wall clock"
        e = group["E"].to_numpy(float)
        t_ms = group["t_verify_s"].to_numpy(float) * 1e3
        big = len(group) > 2000  # keep the PDF light: rasterize large point clouds
        for method, sub in group.groupby("method", sort=True):
            ax.scatter(
                sub["E"].to_numpy(float),
                sub["t_verify_s"].to_numpy(float) * 1e3,
                s=14 if big else 30,
                alpha=0.5 if big else 0.85,
                zorder=3,
                color=_method_colour(method),
                label=f"{method} ({len(sub)})",
                rasterized=big,
                edgecolors="none",
            )
        if np.unique(e).size >= 2:
            slope, intercept, r2 = fit_line(e, t_ms)
            xs = np.array([e.min(), e.max()])
            ax.plot(
                xs,
                slope * xs + intercept,
                color="black",
                linewidth=1.5,
                label=f"fit: {num(slope)} ms/expert {'+' if intercept >= 0 else '−'} {num(abs(intercept))} ms, "
                f"R² = {r2:.3f}",
            )
            notes.append(f"{model} on {hardware}: {num(slope)} ms/expert, intercept {num(intercept)} ms, R² = {r2:.3f}")
        else:
            notes.append(f"{model} on {hardware}: one E value, no fit")
        ax.set_title(wrap(f"{target_label(model)} — {hardware} ({clock})", 60), fontsize=10)
        ax.set_xlabel("unique experts per MoE layer per verify pass (E)")
        ax.set_ylabel("verify latency (ms per pass)")
        ax.grid(alpha=0.3)
        # upper left: latency rises with E, so the corner is clear; "best" would test every point of the cloud
        ax.legend(fontsize=8, loc="upper left", title="method (records)", title_fontsize=8, framealpha=0.85)
    caption = (
        "Figure 1(a): verify-pass latency (ms) against E, the mean number of unique routed experts per MoE layer "
        "per verify pass, one point per ok record (AR records at E = k with their per-token step), one panel per "
        "model and hardware, least-squares line per panel. Fits: " + "; ".join(notes) + "."
    )
    return _Drawn(fig, caption, rows)


# Figure 1(b) -------------------------------------------------------------------------------------------------


AR_CAPTION = (
    ", AR as γ = 1 (its own records where a grid ran method=ar, else the AR decoded beside the SD cells: their "
    "ar_experts_per_layer)"
)


def ar_experts(ar: pd.DataFrame, sd: pd.DataFrame) -> float | None:
    """AR's E for one model's panel, averaged per dataset and then over datasets: from its own AR records, or,
    where the grid ran none (AR only decoded inside each SD cell, as tiny_repro does), from the AR measured beside
    the SD cells; None when neither holds one."""
    own = ar.dropna(subset=["E"])
    beside = sd.dropna(subset=["ar_experts_per_layer"]) if "ar_experts_per_layer" in sd else sd.iloc[0:0]
    rows, column = (own, "E") if len(own) else (beside, "ar_experts_per_layer")
    if rows.empty:
        return None
    return float(rows.groupby("dataset")[column].mean().mean())


def unique_experts_figure(ok: pd.DataFrame) -> _Drawn | None:
    """E against γ (tokens verified per step, root included) at T = 0 and batch size 1 (E of a batch is the union
    over its sequences), mean over datasets, confidence selection vs EcoSpec, with AR (γ = 1: `ar_experts`), the Top-k
    line and the no-overlap ceiling min(N, γk). A model gets a panel when its SD records span at least two γ
    values; with none, the figure is skipped."""
    greedy = ok[(ok["temperature"] == 0) & (ok["batch_size"].fillna(1) == 1) & ok["E"].notna()]
    role = greedy["selector"].map(SELECTOR_ROLES).where(greedy["drafter"].notna())
    budget = greedy["expert_budget"] if "expert_budget" in greedy else pd.Series(np.nan, index=greedy.index)
    plain = budget.isna() & ~greedy["drafter"].isin(VARIANT_DRAFTERS)  # lossless, with a model's own drafter
    sd = greedy[role.isin(sweep(GAMMA_SWEEP).roles) & plain & greedy["gamma"].notna()]
    selector_of = dict(sd[["method", "selector"]].drop_duplicates("method").values)
    drawn = sorted(selector_of, key=lambda m: (selector(selector_of[m]).order, m))
    confident = [m for m in drawn if selector_of[m] == BASELINE]
    models = sorted(m for m, g in sd.groupby("model") if g["gamma"].nunique() >= 2)
    if not models:
        return None
    fig, axes = panel_grid(len(models), width=5.2, height=4.4)
    suptitle(fig, "Figure 1(b): unique experts per MoE layer vs verified tokens γ (T = 0, batch 1, mean over datasets)")
    used, drew_ar = [], False
    for ax, model in zip(axes, models, strict=False):
        rows = sd[sd["model"] == model]
        ar = greedy[(greedy["model"] == model) & (greedy["method"] == AR)]
        used += [rows, ar]
        ar_e = ar_experts(ar, rows)
        drew_ar |= ar_e is not None
        curves = rows.groupby(["method", "gamma", "dataset"])["E"].mean().groupby(["method", "gamma"]).mean()
        for name in [m for m in drawn if m in curves.index.get_level_values(0)]:
            curve = curves.loc[name]
            spec = selector(selector_of[name])
            label = f"{spec.label or spec.name} ({name})"
            ax.plot(
                curve.index.to_numpy(float),
                curve.to_numpy(float),
                marker=METHOD_MARKERS.get(name, "o"),
                color=_method_colour(name),
                linewidth=2,
                label=label,
            )
        k, n = _mode(rows["top_k"]), _mode(rows["num_experts"])
        gmax = float(rows["gamma"].max())
        if ar_e is not None:
            ax.plot([1], [ar_e], marker="*", markersize=14, linestyle="none", color="dimgray", label="AR (γ = 1)")
        if k is not None:
            ax.axhline(k, color="black", linestyle=":", linewidth=1.2, label=f"Top-k (k = {k:g})")
            gammas = np.arange(1, int(np.ceil(gmax)) + 1)
            ceiling = gammas * k if n is None else np.minimum(n, gammas * k)
            ax.plot(gammas, ceiling, color="gray", linestyle="--", linewidth=1.2, label="no-overlap ceiling min(N, γk)")
        ax.set_title(wrap(f"{target_label(model)} ({_datasets(rows)})", 60), fontsize=10)
        ax.set_xlabel("γ: tokens verified per step (incl. root)")
        ax.set_ylabel("unique experts per MoE layer (E)")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_ylim(bottom=0)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8, loc="upper left")
    caption = (
        "Figure 1(b): E (mean unique routed experts per MoE layer per verify pass) against γ (tokens verified per "
        "step incl. the root), greedy (T = 0) batch-size-1 records, averaged per dataset (other settings pooled) "
        f"and then over datasets; confidence selection ({'/'.join(confident)}) vs EcoSpec"
        + (AR_CAPTION if drew_ar else "")
        + ". "
        "Dotted: Top-k, the k experts one token activates; dashed: min(N, γk), γ tokens with no shared expert. "
        "Models whose records span fewer than two γ values are left out."
    )
    return _Drawn(fig, caption, pd.concat(used))


# Figure 1(c) -------------------------------------------------------------------------------------------------


def expert_bytes_figure(ok: pd.DataFrame) -> _Drawn | None:
    """Bytes of one routed expert as stored (MB = 1e6 B), for the paper's three targets and every model in the
    records (`ecospec.analysis.weight_bytes.model_cost`, from conf/model facts; offline)."""
    recorded = sorted(ok["model"].dropna().unique())
    names = list(PAPER_MODELS) + [m for m in recorded if m not in PAPER_MODELS]
    bars, missing = [], []
    for name in names:
        try:
            cost = model_cost(name)
        except Exception as e:  # a model without conf/model facts: left out, named in the caption
            warnings.warn(f"figure 1(c): no expert size for model {name!r}: {e}", stacklevel=2)
            missing.append(name)
            continue
        fmt = cost.storage["experts"]
        bars.append((name, cost.expert_bytes / 1e6, cost.expert_params * FORMATS[fmt][0] / 1e6, fmt))
    if not bars:
        return None
    mb = np.array([b[1] for b in bars])
    fig = Figure(figsize=(max(8.0, 1.6 * len(bars) + 2.5), 4.8), layout="constrained")
    ax = fig.subplots()
    x = np.arange(len(bars))
    ax.bar(x, mb, color=[FORMAT_COLOURS.get(b[3], "tab:olive") for b in bars], edgecolor="black", linewidth=0.6)
    for xi, (_, total, values, _) in zip(x, bars, strict=True):
        text = f"{_mb(total)} MB" + (f"\n({_mb(values)} MB w/o scales)" if total - values > 5e-7 else "")
        ax.annotate(text, (xi, total), xytext=(0, 3), textcoords="offset points", ha="center", va="bottom", fontsize=8)
    ax.set_xticks(x, [_bar_label(b[0], b[3]) for b in bars], fontsize=8)
    log = mb.max() / max(mb.min(), 1e-12) > 50
    if log:
        ax.set_yscale("log")
        ax.set_ylim(mb.min() / 2, mb.max() * 6)
    else:
        ax.set_ylim(0, mb.max() * 1.25)
    ax.set_ylabel("bytes of one routed expert (MB = 10⁶ B" + (", log scale)" if log else ")"))
    suptitle(fig, "Figure 1(c): HBM bytes to load a single routed expert (as stored, block scales included)")
    formats = dict.fromkeys(b[3] for b in bars)
    swatches = [Patch(facecolor=FORMAT_COLOURS.get(f, "tab:olive"), edgecolor="black", label=f) for f in formats]
    fig.legend(handles=swatches, title="expert storage", fontsize=8, loc="outside lower center", ncols=len(formats))
    ax.grid(axis="y", alpha=0.3)
    caption = (
        "Figure 1(c): bytes of one routed expert as stored (MB = 1e6 B; quantized formats include their block "
        "scales, values alone in brackets), from conf/model facts via "
        "ecospec.analysis.weight_bytes.model_cost, for the "
        f"paper's {', '.join(PAPER_MODELS)} and the models in the records ({', '.join(recorded)})."
        + (f" No model facts for: {', '.join(missing)}." if missing else "")
    )
    return _Drawn(fig, caption, ok[ok["model"].isin([b[0] for b in bars])])


# Figure 4 ----------------------------------------------------------------------------------------------------


def load_figure(rows: pd.DataFrame, model: str) -> _Drawn | None:
    """Figure 4 for one model: expert load summed over all its ok records (every method's verify passes), drawn by
    `expert_load_figure`. Records whose load has another shape than the most common one are left out."""
    shapes = [_shape(load) for load in rows["expert_load"]]
    known = [s for s in shapes if s is not None]
    if not known:
        return None
    shape = Counter(known).most_common(1)[0][0]  # ties: the first seen
    with_load = rows[[s == shape for s in shapes]]
    total = np.zeros(shape, dtype=np.int64)
    for load in with_load["expert_load"]:  # one add per record: no records x layers x N temporary
        total += np.asarray(load)  # int32 or int64 as stored: added into the int64 total without a copy
    dropped = len(known) - len(with_load)
    methods = ", ".join(sorted(with_load["method"].dropna().unique()))
    title = f"Figure 4: {target_label(model)} — expert load of verify passes, {len(with_load)} records ({methods})"
    fig = expert_load_figure(total, wrap(title, 120))
    caption = (
        f"Figure 4 ({model}): expert-activation heat map (MoE layer x expert, tokens routed in verify passes) and "
        "layer-wise expert-load distribution, summed over all ok records of the model, every method included "
        f"({methods}): routing is the target's, and every verified token, accepted or not, loads its experts. "
        f"{len(with_load)} records, {shape[0]} MoE layers x {shape[1]} experts."
        + (f" {dropped} records with another load shape left out." if dropped else "")
    )
    return _Drawn(fig, caption, with_load)


# helpers -----------------------------------------------------------------------------------------------------


def save(fig: Figure, stem: Path) -> list[Path]:
    """PNG (DPI) and PDF through the Agg canvas, with no timestamps so reruns give the same PDF."""
    FigureCanvasAgg(fig)
    png, pdf = stem.with_suffix(".png"), stem.with_suffix(".pdf")
    # zlib level 3, not PIL's 6: a fraction of the encoding time for files a few percent larger
    fig.savefig(png, dpi=DPI, metadata={"Software": None}, pil_kwargs={"compress_level": 3})
    fig.set_layout_engine("none")  # keep the layout the PNG computed: the PDF need not solve it again
    fig.savefig(pdf, metadata={"CreationDate": None, "Producer": None, "Creator": None})
    fig.clear()
    return [png, pdf]


def panel_grid(n: int, width: float, height: float) -> tuple[Figure, list]:
    cols = min(n, 3)
    rows = -(-n // cols)
    fig = Figure(figsize=(width * cols, height * rows + 0.6), layout="constrained")
    axes = fig.subplots(rows, cols, squeeze=False).ravel().tolist()
    for ax in axes[n:]:
        ax.set_visible(False)
    return fig, axes[:n]


@cache
def target_label(name: str, short: bool = False) -> str:
    """'DeepSeek-V3.1' for a conf/model name whose target is an HF id; the name itself otherwise."""
    try:
        target = load_model_config(name).get("target")
    except Exception:  # no conf/model file, or one that does not parse: the label is just the name
        target = None
    if not target:
        return name
    pretty = str(target).rsplit("/", 1)[-1]
    return pretty if short else f"{pretty} ({name})"


def _bar_label(name: str, fmt: str) -> str:
    pretty = target_label(name, short=True)
    return f"{name} · {fmt}" if pretty == name else f"{pretty}\n{name} · {fmt}"


def _method_colour(method: str) -> str:
    if method in METHOD_COLOURS:
        return METHOD_COLOURS[method]
    cycle = matplotlib.colormaps["tab10"].colors
    return matplotlib.colors.to_hex(cycle[sum(map(ord, method)) % len(cycle)])


def _mode(values: pd.Series) -> float | None:
    values = values.dropna()
    return None if values.empty else float(values.mode().iloc[0])


def _shape(load) -> tuple[int, int] | None:
    """(MoE layers, N) of a stored expert load; None when the record has none (None, NaN, [])."""
    if not isinstance(load, list | tuple | np.ndarray) or len(load) == 0 or len(load[0]) == 0:
        return None
    return len(load), len(load[0])


def _datasets(rows: pd.DataFrame) -> str:
    names = sorted(rows["dataset"].dropna().astype(str).unique())
    return f"{len(names)} dataset{'s' if len(names) != 1 else ''}: " + ", ".join(names)


def num(x: float) -> str:
    """Three significant digits, trailing zeros kept (2.00, 0.711, 229)."""
    return f"{x:#.3g}".rstrip(".")


def _mb(x: float) -> str:
    return f"{x:.2f}" if x >= 1 else f"{x:.3g}"


def slug(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", str(name))


def suptitle(fig: Figure, text: str) -> None:
    """A figure title wrapped to the figure's width (about 9 characters per inch at the default 12 pt)."""
    fig.suptitle(wrap(text, int(fig.get_figwidth() * 9)))


def wrap(text: str, width: int) -> str:
    return "\n".join(textwrap.wrap(text, width))
