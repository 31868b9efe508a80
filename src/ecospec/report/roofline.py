"""Modeled GPU numbers: the roofline model (`analysis.latency.modeled_step`, the whole step costed) at the records'
α and E on each GPU profile, per model × T × method (the Modeled table; the MoE-Spec table's modeled column), with
the per-pass overheads fitted from records measured on a GPU, and the table's inputs on their own,
`modeled_cells.json` (`write_summary`), from which `python -m ecospec.report.modeled` rebuilds the table.
"""

from __future__ import annotations

import functools
import warnings
from collections.abc import Mapping
from pathlib import Path

import numpy as np
import pandas as pd

from ecospec.analysis.hardware import HARDWARE, Hardware
from ecospec.analysis.latency import fit_overhead, modeled_step
from ecospec.analysis.model_config import load_model_config
from ecospec.analysis.weight_bytes import ModelCost, StepParts, step_parts
from ecospec.atomic import write_json
from ecospec.report.frame import LABELS, ROW_KEYS, at_main, model_label, newest, prepare
from ecospec.report.layout import common_benchmarks


def cells_modeled(frame, defaults=None) -> pd.DataFrame:
    df = prepare(frame, defaults)
    return newest(at_main(df[df["standard"]]), ["model", "temperature", "role", "drafter", "dataset"])


def fit_overheads(frame: pd.DataFrame, costs: Mapping[str, ModelCost]) -> dict[tuple[str, str], tuple[float, int]]:
    """(model, GPU profile) -> (fixed per-pass overhead in s, records it was fitted on), from the ok B=1 records
    measured on that GPU (`analysis.latency.fit_overhead`). The fit is a mean of t_verify − bytes / bandwidth, linear
    in t_verify and E, so it is taken once over each group's mean record, with the model's cost already counted."""
    ok = frame[
        (frame["status"] == "ok") & (frame["batch_size"] == 1) & frame["t_verify_s"].notna() & frame["E"].notna()
    ]
    out = {}
    for hw in HARDWARE.values():
        on_hw = ok[ok["hardware"].fillna("").map(hw.matches).to_numpy(dtype=bool)]
        for model, g in on_hw.groupby("model"):
            if model in costs:
                mean = {
                    "status": "ok",
                    "summary": {"t_verify_s": g["t_verify_s"].mean(), "experts_per_layer": g["E"].mean()},
                    "config": {"model": costs[model]},  # verify_hbm_bytes takes a ModelCost as well as a config
                    "env": {"hardware": g["hardware"].iloc[0]},
                }
                out[(model, hw.name)] = (fit_overhead([mean], hw), len(g))
    return out


def modeled(
    frame: pd.DataFrame,
    costs: Mapping[str, ModelCost],
    overheads: Mapping[tuple[str, str], tuple[float, int]] = None,
    defaults=None,
    profiles: Mapping[tuple[str, str], Hardware] | None = None,
) -> pd.DataFrame:
    """Per model × T × method: measured α and E (mean over the benchmarks present) and the roofline-modeled
    T_verify, T_draft + T_pred, T_step (ms) and speedup vs AR on each GPU profile (`modeled_rows`)."""
    return modeled_rows(modeled_cells(frame, costs, defaults), costs, overheads, profiles)


MODELED_CELLS = ["model", "temperature", "label", "Benchmarks", "alpha", "E", "drafter", "depth", "predictor"]


def modeled_cells(frame: pd.DataFrame, costs: Mapping[str, ModelCost], defaults=None) -> pd.DataFrame:
    """What the modeled numbers are computed from, per model × T × method (`MODELED_CELLS`): the records' α and E
    (mean over the benchmarks every row has), the drafter, the tree's depth and whether the method calls the
    predictor. `make tables` also writes it (modeled_cells.csv), so modeled.md can be rebuilt from it alone."""
    cells = cells_modeled(frame, defaults)
    cells = cells[cells["model"].isin(list(costs)) & cells["alpha"].gt(0) & cells["E"].notna()]
    cells = common_benchmarks(cells, ROW_KEYS)  # rows side by side average the same benchmarks, named
    cells = cells.assign(_pred=cells["predictor_checkpoint"].notna())
    agg = (
        cells.groupby(ROW_KEYS, sort=False)
        .agg(
            Benchmarks=("_benchmarks", "first"),
            alpha=("alpha", "mean"),
            E=("E", "mean"),
            drafter=("drafter", "first"),
            depth=("depth", "first"),
            predictor=("_pred", "any"),
        )
        .reset_index()
    )
    return agg[MODELED_CELLS]


def modeled_rows(
    agg: pd.DataFrame,
    costs: Mapping[str, ModelCost],
    overheads: Mapping[tuple[str, str], tuple[float, int]] = None,
    profiles: Mapping[tuple[str, str], Hardware] | None = None,
) -> pd.DataFrame:
    """`modeled_cells` rows with the roofline model's T_verify, T_draft + T_pred, T_step (ms) and speedup vs AR on
    each GPU profile (`analysis.latency.modeled_step`, the whole step costed; `profiles[(model, GPU)]`, fitted from the
    verify-latency benchmark, where given, else the datasheet bandwidth with the per-pass overhead fitted from that
    GPU's records or 0)."""
    agg = agg.copy()
    parts = [row_parts(*row) for row in zip(agg["model"], agg["drafter"], agg["depth"], agg["predictor"], strict=True)]
    for hw in HARDWARE:
        res = [
            gpu_step(costs, m, a, e, hw, overheads, profiles, pt)
            for m, a, e, pt in zip(agg["model"], agg["alpha"], agg["E"], parts, strict=True)
        ]
        agg[f"{hw} t_verify_ms"] = [r["t_verify_s"] * 1e3 for r in res]
        agg[f"{hw} t_draft_pred_ms"] = [(r["t_draft_s"] + r["t_pred_s"]) * 1e3 for r in res]
        agg[f"{hw} t_step_ms"] = [r["t_step_s"] * 1e3 for r in res]
        agg[f"{hw} speedup"] = [r["speedup"] for r in res]
    agg["model"] = agg["model"].map(model_label)
    return agg.drop(columns=["drafter", "depth", "predictor"]).rename(columns=LABELS)


@functools.cache
def row_parts(model: str, drafter, depth, predictor: bool) -> StepParts | None:
    """The draft passes (a tree's depth of them) and the predictor's pass of a row's method, in weight bytes, from
    conf/model `model` (`analysis.weight_bytes.step_parts`); None (drafting not costed, with a warning) where the shapes
    cannot be had offline."""
    if drafter is None or (isinstance(drafter, float) and np.isnan(drafter)):
        return StepParts()
    try:
        return step_parts(load_model_config(model), drafter, int(depth), bool(predictor))
    except (ValueError, KeyError, OSError, TypeError) as e:
        warnings.warn(f"model {model}: drafting and prediction not costed in the modeled numbers ({e})", stacklevel=2)
        return None


def gpu_step(
    costs, model: str, alpha: float, experts: float, hw, overheads=None, profiles=None, parts: StepParts | None = None
) -> dict:
    """`modeled_step` (the whole step: verify, each draft pass, the predictor's pass) on the verify-latency
    benchmark's fitted profile of (model, GPU) where there is one, else on the datasheet bandwidth with the per-pass
    overhead fitted from that GPU's SD records (or 0)."""
    if (model, hw) in (profiles or {}):
        return modeled_step(costs[model], alpha, experts, profiles[(model, hw)], parts=parts)
    overhead = (overheads or {}).get((model, hw), (None, 0))[0] or 0.0
    return modeled_step(costs[model], alpha, experts, hw, overhead_s=overhead, parts=parts)


def gammas_of(used: pd.DataFrame) -> str:
    return ", ".join(f"{model_label(m)} {int(g)}" for m, g in used.groupby("model")["gamma"].first().items())


def modeled_note(
    gammas: str,
    records: int,
    sweeps_text: str,
    overheads: Mapping[tuple[str, str], tuple[float, int]],
    profiles: Mapping = None,
) -> str:
    parts = []
    for hw in HARDWARE.values():
        bench = {m: p for (m, h), p in (profiles or {}).items() if h == hw.name}  # replaces bandwidth and overhead
        fitted = {m: v for (m, h), v in overheads.items() if h == hw.name and v[0] is not None and m not in bench}
        if fitted or bench:
            each = [
                f"{model_label(m)} {p.overhead_s * 1e3:.2f} ms at {p.hbm_bytes_per_s / 1e12:.2f} TB/s effective, "
                f"{p.source} scaled to full depth"
                for m, p in bench.items()
            ]
            each += [f"{model_label(m)} {o * 1e3:.2f} ms ({n} records)" for m, (o, n) in fitted.items()]
            parts.append(f"{hw.name}: fitted from records measured on it: {', '.join(each)}")
        else:
            parts.append(f"{hw.name}: none (no records measured on it)")
    return (
        f"*Modeled*, not measured: α and E are the records' (mean over the benchmarks named, the same for every row "
        f"of a model and T; each model at its own "
        f"γ: {gammas or 'none'}; B=1), each cell "
        "is T_verify (ms) / T_draft+pred (ms) / T_step (ms) / speedup vs AR from the roofline model "
        "(`analysis.latency.modeled_step`: "
        "verify weight bytes / peak HBM bandwidth + a fixed per-pass overhead; T_draft+pred: each draft pass (a "
        "tree's depth of them) and the expert predictor's pass of the methods that call it, each its weight bytes / "
        "bandwidth + the same overhead, `analysis.weight_bytes.step_parts`: the release's head and predictor "
        "for the tiny "
        "model, conf/model facts for the paper's, EAGLE-3 heads derived from the target's facts where their shape "
        "is not at hand; selection not modeled; T_step = T_verify + T_draft + T_pred). "
        f"Per-pass overhead: {'; '.join(parts)}. From {records} records (sweeps: {sweeps_text})."
    )


NAME = "modeled"  # the table's file stem
SUMMARY = "modeled_cells.json"
# the paper's Table 3 beside the model (`python -m ecospec.report.modeled --paper`)
PAPER_TABLE3 = "modeled_paper_table3"
TITLE = f"GPU latency and speedup on {', '.join(HARDWARE)} (roofline model: *modeled*, not measured)"


def write_summary(cells: pd.DataFrame, gammas: str, records: int, sweeps: str, out_dir: Path) -> Path:
    """The modeled table's inputs as `out_dir/modeled_cells.json`."""
    rows = [
        {k: (v.item() if hasattr(v, "item") else v) for k, v in r.items()}
        for r in cells[MODELED_CELLS].to_dict("records")
    ]
    path = Path(out_dir) / SUMMARY
    write_json(path, {"records": records, "sweeps": sweeps, "gammas": gammas, "rows": rows}, indent=1)
    return path
