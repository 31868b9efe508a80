"""`backend=vllm` records (vLLM's server and load generator): their own tables and the overlap paper's figure.

* `vllm_e2e`: per model × method × dataset × T × batch size: TPOT of AR and of the method (mean over requests and
  rounds), TPOT speedup, acceptance length α, requests, TP and the quantization the server reported.
* `vllm_curve`: the shape of each TPOT-speedup-vs-batch-size curve (peak batch size; concave = it rises to a peak
  inside the swept range and falls after it) beside the overlap paper's qualitative finding (Mixtral-8x7B concave,
  the fine-grained models peaked at or near batch size 1: its Figures 1, 6; the paper gives the curves as figures
  only, so no values are copied), and the batch-1 target efficiency: measured TE = speedup / α = T_AR / (T_verify +
  T_draft) (vLLM exposes no verify time, so drafting is inside; a lower bound on T_AR / T_verify), predicted TE from
  activated-expert bytes with the E our engine measured on the same model, dataset, γ and batch size (where it ran).
* `fig_vllm_tpot_speedup_<model>`: the curves (log2 batch axis).

The HF engine's tables leave these records out (they need E and phase times); these need nothing else.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path

import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from ecospec.analysis.weight_bytes import target_efficiency
from ecospec.report.figures import FigureInfo, remove_stale, save, slug
from ecospec.report.frame import model_label, sweeps
from ecospec.report.write import Table

FILE_NAME = re.compile(r"fig_vllm_tpot_speedup_.+\.(png|pdf)")
TABLE_NAMES = ["vllm_e2e", "vllm_curve"]
# the overlap paper's finding per model config (its Figures 1, 6): the shape, never values
PAPER_SHAPE = {
    "mixtral": "concave",
    "qwen3_30b": "peaks at or near B = 1",
    "qwen3": "peaks at or near B = 1",
    "gptoss": "peaks at or near B = 1",
}
PAPER_METHOD = {
    "mixtral": "EAGLE (yuhuili/EAGLE-mixtral-instruct-8x7B)",
    "qwen3_30b": "EAGLE-3",
    "qwen3": "EAGLE-3",
    "gptoss": "EAGLE-3",
}
KEYS = ["model", "method", "dataset", "temperature", "gamma"]


def cells(frame: pd.DataFrame) -> pd.DataFrame:
    """The ok vLLM records, the newest per cell setting (model, method, dataset, T, γ, B, TP)."""
    df = frame[(frame["backend"] == "vllm") & (frame["status"] == "ok") & frame["tpot_s"].gt(0)]
    df = df.sort_values("finished", kind="stable")
    return df.drop_duplicates([*KEYS, "batch_size", "backend_tp"], keep="last")


def e2e_table(df: pd.DataFrame) -> pd.DataFrame:
    rows = [
        {
            "Model": model_label(r.model),
            "Method": r.method,
            "Dataset": r.dataset,
            "T": r.temperature,
            "gamma": r.gamma,
            "B": r.batch_size,
            "TP": r.backend_tp,
            "Setting": r.hardware,
            "Quantization": r.quantization or "none",
            "AR TPOT ms": 1e3 * r.ar_tpot_s,
            "TPOT ms": 1e3 * r.tpot_s,
            "TPOT speedup": r.speedup,
            "alpha": r.alpha,
            "Requests": r.requests,
        }
        for r in df.sort_values([*KEYS, "batch_size"]).itertuples()
    ]
    return pd.DataFrame(rows)


def _shape(curve: pd.DataFrame) -> tuple[int, str]:
    """(peak batch size, concave or not) of one speedup curve sorted by batch size."""
    speed = curve["speedup"].to_numpy()
    peak = int(np.nanargmax(speed))
    concave = 0 < peak < len(speed) - 1 and speed[peak] > speed[0] and speed[peak] > speed[-1]
    return int(curve["batch_size"].iloc[peak]), ("concave" if concave else "not concave")


def curve_table(df: pd.DataFrame, hf: pd.DataFrame, costs: Mapping) -> pd.DataFrame:
    rows = []
    for key, g in df.groupby(KEYS, sort=True):
        g = g.sort_values("batch_size")
        peak, shape = _shape(g)
        model, method, dataset, temperature, gamma = key
        b1 = g[g["batch_size"] == 1]
        measured = float(b1["speedup"].iloc[0] / b1["alpha"].iloc[0]) if len(b1) else np.nan
        predicted = np.nan
        ours = hf[
            (hf["model"] == model)
            & (hf["dataset"] == dataset)
            & (hf["gamma"] == gamma)
            & (hf["batch_size"] == 1)
            & (hf["method"] == method)
            & (hf["status"] == "ok")
        ]
        cost = costs.get(model)
        if cost is not None and len(ours) and np.isfinite(ours["E"].iloc[-1]):
            predicted = target_efficiency(
                cost.expert_bytes, cost.dense_bytes / cost.moe_layers, cost.top_k, float(ours["E"].iloc[-1])
            )
        rows.append(
            {
                "Model": model_label(model),
                "Method": method,
                "Dataset": dataset,
                "T": temperature,
                "gamma": gamma,
                "Batch sizes": ", ".join(str(b) for b in g["batch_size"]),
                "Peak B": peak,
                "Shape": shape,
                "B=1 speedup": g["speedup"].iloc[0],
                "Peak speedup": g["speedup"].max(),
                "Paper's shape": PAPER_SHAPE.get(model, "—"),
                "Paper's method": PAPER_METHOD.get(model, "—"),
                "Measured te": measured,
                "Predicted te": predicted,
            }
        )
    return pd.DataFrame(rows)


def curve_figure(df: pd.DataFrame, model: str) -> Figure:
    fig = Figure(figsize=(6.4, 4.2), layout="constrained")
    ax = fig.subplots()
    for key, g in df[df["model"] == model].groupby(["method", "dataset", "temperature", "backend_tp"], sort=True):
        g = g.sort_values("batch_size")
        method, dataset, temperature, tp = key
        ax.plot(g["batch_size"], g["speedup"], marker="o", label=f"{method}, {dataset}, T={temperature:g}, TP {tp}")
    ax.axhline(1.0, color="grey", lw=0.8, ls=":")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("batch size (max concurrency)")
    ax.set_ylabel("TPOT speedup (AR TPOT / SD TPOT)")
    hardware = ", ".join(sorted({str(h) for h in df.loc[df["model"] == model, "hardware"]}))
    ax.set_title(f"{model_label(model)} in vLLM ({hardware})", fontsize=9)
    ax.legend(fontsize=7)
    return fig


def build_vllm(frame: pd.DataFrame, costs: Mapping, figures_dir: Path) -> tuple[list[Table], list[str], list]:
    """The vLLM tables and figures that have records, and the labels of those that have none."""
    df = cells(frame)
    figures_dir.mkdir(parents=True, exist_ok=True)
    if df.empty:
        remove_stale(figures_dir, [], FILE_NAME)
        return [], ["vLLM end-to-end (TPOT speedup vs batch size)"], []
    hf = frame[(frame["backend"] != "vllm") & (frame["engine"] == "eager")]  # the HF engine as the paper ran it
    note = (
        f"vLLM's server and load generator (`vllm bench serve`); TPOT = time per output token after the first, "
        f"mean over requests and rounds; speedup = AR TPOT / SD TPOT at the same concurrency B; α = vLLM's "
        f"acceptance length (bonus token counted). From {len(df)} records (sweeps: {sweeps(df)})."
    )
    curve = curve_table(df, hf, costs)
    tables = [
        Table(
            "vllm_e2e",
            "vLLM end-to-end",
            "TPOT speedup of SD over AR against batch size, in vLLM",
            note,
            e2e_table(df),
            False,
            df,
        ),
        Table(
            "vllm_curve",
            "vLLM curve shapes",
            "Shape of each TPOT-speedup curve beside the overlap paper's finding",
            note + " Measured TE = B=1 speedup / α (drafting included); predicted TE = (C_dense + k C_expert) / "
            "(C_dense + E C_expert) with our engine's E on the same model, dataset, γ and B = 1 (— where it has "
            "not run). The paper's shapes are qualitative (its Figures 1, 6).",
            curve,
            False,
            df,
        ),
    ]
    infos = []
    for model in sorted(df["model"].unique()):
        name = f"fig_vllm_tpot_speedup_{slug(model)}"
        files = save(curve_figure(df, model), figures_dir / name)
        rows = df[df["model"] == model]
        caption = f"TPOT speedup vs batch size, {model_label(model)}, in vLLM ({len(rows)} records)"
        infos.append(FigureInfo(name, files, caption, sorted(set(rows["experiment"].dropna())), len(rows)))
    remove_stale(figures_dir, infos, FILE_NAME)
    return tables, [], infos
