"""Figure 1(a) from the verify-latency benchmark (`ecospec.bench.verify_latency`), beside the one drawn from SD
records (`figures.verify_latency_figure`), and the fitted GPU profiles the modeled table uses.

Input: the benchmark's point records (`*` + `ecospec.bench.RECORD_SUFFIX`) under the report's record directories.
Per (model, device, scale, layers, storage): milliseconds per decoder layer against E, one colour per experts
implementation (AR at E = k as a star), the per-layer least-squares line of each (`analysis.latency.fit_latency`:
ms per expert-layer + fixed ms per layer) and the roofline of the bytes read at the GPU's HBM peak. Reads records
only, never models.
"""

from __future__ import annotations

import json
import os
import re
import warnings
from collections.abc import Iterable, Mapping
from pathlib import Path

import matplotlib
import numpy as np
import pandas as pd

from ecospec.analysis.hardware import HARDWARE, Hardware
from ecospec.analysis.latency import fit_latency
from ecospec.analysis.weight_bytes import ModelCost
from ecospec.bench import KIND, RECORD_SUFFIX
from ecospec.report.figures import FigureInfo, num, panel_grid, remove_stale, save, suptitle, target_label, wrap

NAME = "fig1a_verify_latency_bench"
FILE_NAME = re.compile(rf"{NAME}\.(png|pdf)")
COLUMNS = (
    "experiment",
    "run",
    "path",
    "finished",
    "kind",
    "status",
    "model",
    "layers",
    "impl",
    "gamma",
    "E",
    "top_k",
    "num_experts",
    "scale",
    "storage",
    "t_pass_s",
    "t_layer_s",
    "bytes",
    "expert_bytes",
    "dense_layer_bytes",
    "gbps",
    "hbm_peak_bytes_per_s",
    "bw_fraction",
    "hardware",
    "device",
)
GROUP = ["model", "hardware", "scale", "layers", "storage"]  # one panel, and one fit per implementation in it
GAMMA_MARKERS = ("o", "s", "^", "D", "v", "P", "X")
IMPL_COLOURS = {"eager": "tab:blue", "grouped_mm": "tab:orange", "batched_mm": "tab:green"}


def find_files(dirs: Iterable[str | Path]) -> list[Path]:
    """Every benchmark point record under the directories (or the files themselves), sorted."""
    out: set[str] = set()
    for d in map(str, dirs):
        if os.path.isfile(d):
            if d.endswith(RECORD_SUFFIX):
                out.add(d)
            continue
        for root, _, files in os.walk(d):
            out.update(os.path.join(root, f) for f in files if f.endswith(RECORD_SUFFIX))
    return [Path(p) for p in sorted(out)]


def load_bench(dirs: Iterable[str | Path], since: str | pd.Timestamp | None = None) -> pd.DataFrame:
    """The point records as a frame (COLUMNS), the newest per point; an unreadable file is skipped with a warning.
    `since` keeps records finished at or after it."""
    rows = []
    for path in find_files(dirs):
        try:
            rec = json.loads(path.read_text())
            if not isinstance(rec, dict) or rec.get("kind") != KIND or "t_pass_s" not in rec:
                raise ValueError(f"not a {KIND} record")
        except (OSError, ValueError) as e:
            warnings.warn(f"skipping benchmark record {path}: {e}", stacklevel=2)
            continue
        row = {k: rec.get(k) for k in COLUMNS}
        row.update(path=str(path), run=path.parent.name, experiment=path.parent.parent.name)
        rows.append(row)
    df = pd.DataFrame(rows, columns=list(COLUMNS))
    df["finished"] = pd.to_datetime(df["finished"], utc=True, errors="coerce", format="ISO8601")
    if since is not None:
        ts = pd.Timestamp(since)
        df = df[df["finished"] >= (ts.tz_localize("UTC") if ts.tzinfo is None else ts.tz_convert("UTC"))]
    df = df[df["status"].fillna("ok") == "ok"]
    df = df.sort_values("finished", kind="stable").drop_duplicates([*GROUP, "impl", "gamma", "E"], keep="last")
    return df.reset_index(drop=True)


def _colour(impl: str) -> str:
    if impl in IMPL_COLOURS:
        return IMPL_COLOURS[impl]
    cycle = matplotlib.colormaps["tab10"].colors
    return matplotlib.colors.to_hex(cycle[3 + sum(map(ord, impl)) % (len(cycle) - 3)])


def _fits(group: pd.DataFrame) -> dict:
    """impl -> LatencyFit (or None with fewer than two E values) of one panel's records."""
    return {impl: fit_latency(sub.to_dict("records")) for impl, sub in group.groupby("impl", sort=True)}


def bench_figure(frame: pd.DataFrame):
    """(Figure, caption, rows drawn) of the benchmark's Figure 1(a), or None without records."""
    if frame is None or frame.empty:
        return None
    panels = list(frame.groupby(GROUP, sort=True, dropna=False))
    fig, axes = panel_grid(len(panels), width=5.6, height=4.6)
    suptitle(
        fig,
        "Figure 1(a): verify-pass latency per decoder layer vs unique experts E (measured, "
        "real-shape MoE layers, random weights, routing forced to E experts)",
    )
    notes = []
    for ax, ((model, hardware, scale, layers, storage), g) in zip(axes, panels, strict=False):
        gammas = sorted(int(x) for x in g["gamma"].unique() if x > 1)
        markers = {gm: GAMMA_MARKERS[i % len(GAMMA_MARKERS)] for i, gm in enumerate(gammas)}
        fits = _fits(g)
        parts = []
        for impl, sub in g.groupby("impl", sort=True):
            colour = _colour(impl)
            for gamma, pts in sub.groupby("gamma"):
                ax.scatter(
                    pts["E"],
                    pts["t_layer_s"] * 1e3,
                    color=colour,
                    zorder=3,
                    edgecolors="none",
                    marker="*" if gamma == 1 else markers[int(gamma)],
                    s=90 if gamma == 1 else 32,
                    alpha=0.9,
                )
            fit = fits[impl]
            best = sub["bw_fraction"].max()
            of_peak = f", up to {best:.0%} of HBM peak" if pd.notna(best) else ""
            if fit is None:
                text = f"{impl}: one E value, no fit{of_peak}"
            else:
                xs = np.array([sub["E"].min(), sub["E"].max()], dtype=float)
                ax.plot(xs, (fit.slope_s * xs + fit.intercept_s) * 1e3, color=colour, linewidth=1.6)
                text = (
                    f"{impl}: {num(fit.slope_s * 1e3)} ms/expert-layer + {num(fit.intercept_s * 1e3)} ms/layer, "
                    f"R² {fit.r2:.3f}{of_peak}"
                )
            parts.append(text)
            label = text.replace(" ms/layer, ", " ms/layer\n", 1)  # two lines keep the legend inside the panel
            ax.plot([], [], color=colour, marker="o", linestyle="none" if fit is None else "-", label=label)
        peak = g["hbm_peak_bytes_per_s"].dropna()
        if len(peak):
            bw = float(peak.iloc[0])
            xs = np.array([g["E"].min(), g["E"].max()], dtype=float)
            eb, db = float(g["expert_bytes"].iloc[0]), float(g["dense_layer_bytes"].iloc[0])
            ax.plot(
                xs,
                (xs * eb + db) / bw * 1e3,
                color="black",
                linestyle="--",
                linewidth=1.2,
                label=f"roofline: bytes / {bw / 1e12:.3g} TB/s",
            )
        for gm in gammas:
            ax.scatter([], [], color="gray", marker=markers[gm], label=f"γ = {gm}")
        ax.scatter([], [], color="gray", marker="*", s=90, label="AR (γ = 1, E = k)")
        clock = "CPU wall clock" if str(g["device"].iloc[0]).startswith("cpu") else "GPU, CUDA events"
        ax.set_title(
            wrap(
                f"{target_label(model)} — {hardware}; {layers} layer{'s' if layers != 1 else ''}, "
                f"scale {scale:g}, {storage} ({clock})",
                64,
            ),
            fontsize=9,
        )
        ax.set_xlabel("unique experts per MoE layer in the pass (E)")
        ax.set_ylabel("ms per decoder layer (median pass ÷ layers)")
        ax.set_ylim(bottom=0)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7, loc="upper left", framealpha=0.85)
        where = f"{model} on {hardware} (scale {scale:g}, {layers} layer{'s' if layers != 1 else ''}, {storage})"
        notes.append(f"{where}: " + "; ".join(parts))
    caption = (
        "Figure 1(a), benchmark: median verify-pass time per decoder layer against E, the unique experts each layer "
        "is routed to (forced), from `python -m ecospec.bench.verify_latency` (real-shape layers of each model's "
        "transformers class with random weights, γ tokens over a 64-token KV prefix by default), one colour per "
        "experts implementation, markers by γ, AR at E = k; lines: least squares per implementation (ms per "
        "expert-layer + fixed ms per layer); dashed: the bytes read (E experts + the layer's dense weights) at the "
        "GPU's HBM peak. Fits: " + "; ".join(notes) + "."
    )
    return fig, caption, frame


def write_bench_figure(frame: pd.DataFrame, out_dir: Path) -> list[FigureInfo]:
    """The figure's PNG and PDF in `out_dir` when benchmark records exist; its old files removed otherwise."""
    out_dir = Path(out_dir)
    drawn = bench_figure(frame)
    if drawn is None:
        remove_stale(out_dir, [], FILE_NAME)
        return []
    out_dir.mkdir(parents=True, exist_ok=True)
    fig, caption, rows = drawn
    experiments = sorted(rows["experiment"].dropna().astype(str).unique())
    return [FigureInfo(NAME, save(fig, out_dir / NAME), caption, experiments, len(rows))]


def latency_profiles(frame: pd.DataFrame, costs: Mapping[str, ModelCost]) -> dict[tuple[str, str], Hardware]:
    """(model, GPU profile name) -> that profile fitted from the model's real-shape (scale 1) benchmark records on
    that GPU (`LatencyFit.profile`: the measured layers scaled to the model's full depth), with the fastest
    implementation (lowest fitted time per layer at the median E measured). Models without a cost entry, and fits
    with a slope <= 0, are left out."""
    out: dict[tuple[str, str], Hardware] = {}
    if frame is None or frame.empty:
        return out
    real = frame[frame["scale"] == 1]
    for hw in HARDWARE.values():
        on = real[real["hardware"].fillna("").map(hw.matches).to_numpy(dtype=bool)]
        for model, g in on.groupby("model"):
            if model not in costs:
                continue
            mid = float(g["E"].median())
            fits = [fit_latency(sub.to_dict("records")) for _, sub in g.groupby(["impl", "layers", "storage"])]
            fits = [f for f in fits if f is not None and f.slope_s > 0]
            if fits:
                best = min(fits, key=lambda f: f.t_layer(mid))
                out[(model, hw.name)] = best.profile(hw, costs[model])
    return out
