"""The MoE-Spec comparison table: lossless EcoSpec against MoE-Spec's verify-time expert cap (lossy; engine.budget),
per expert budget the measured speedup, α and E, the roofline model's speedup at them, and quality against AR.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import pandas as pd

from ecospec.analysis.hardware import HARDWARE, Hardware
from ecospec.analysis.weight_bytes import ModelCost
from ecospec.report.frame import LABELS, at_main, model_label, newest, prepare
from ecospec.report.layout import common_benchmarks
from ecospec.report.lineup import sweep
from ecospec.report.roofline import gpu_step, row_parts

NAME = "moespec"  # the table's file stem and the experiment that runs its cells (conf/experiment)


def cells_moespec(frame, defaults=None) -> pd.DataFrame:
    """The MoE-Spec table's cells: budgeted baseline / EcoSpec cells (method moespec / ecospec_moespec) at the main
    settings, and the unbudgeted standard baseline and EcoSpec on the same (model, T, benchmark) as references."""
    df = prepare(frame, defaults)
    df = at_main(df[df["std_drafter"] & df["std_predictor"] & df["role"].isin(sweep(NAME).roles)])
    capped = df[df["budgeted"]]
    keys = capped[["model", "temperature", "dataset"]].drop_duplicates()
    ref = df[df["standard"]].merge(keys, on=["model", "temperature", "dataset"])
    out = pd.concat([ref, capped], ignore_index=True)
    return newest(out, ["model", "temperature", "role", "drafter", "dataset", "expert_budget", "budget_policy"])


MOESPEC_QUALITY = {
    0: ["budget_error_rate", "matches_ar", "first_divergence"],
    1: ["loglik_per_token", "ar_loglik_per_token", "matches_ar"],
}


def table_moespec(
    frame: pd.DataFrame,
    costs: Mapping[str, ModelCost] | None = None,
    overheads: Mapping[tuple[str, str], tuple[float, int]] | None = None,
    defaults=None,
    profiles: Mapping[tuple[str, str], Hardware] | None = None,
) -> pd.DataFrame:
    """Speedup against quality per expert budget: per model × T × method × budget, the measured speedup, α and E
    (mean over the benchmarks present), the roofline speedup on each GPU profile from that α and E
    (`modeled.gpu_step`, as the Modeled table), and quality vs AR: greedy (T = 0) the budget error rate, matches_ar
    and the mean first divergence; T > 0 the mean per-token log-likelihood under the unbudgeted target beside AR's.
    Unbudgeted rows (budget —) are lossless: error 0."""
    cells = cells_moespec(frame, defaults).copy()
    if cells.empty:
        return pd.DataFrame()
    cells["Budget"] = cells["expert_budget"].map(lambda b: "—" if pd.isna(b) else f"B={int(b)}")
    cells["_budget"] = cells["expert_budget"].fillna(np.inf)
    cells.loc[~cells["budgeted"] & (cells["temperature"] == 0), "budget_error_rate"] = 0.0
    cells = cells.sort_values(
        ["_model_rank", "model", "temperature", "_budget", "_role_rank", "label"],
        kind="stable",
        ascending=[True, True, True, False, True, True],
    )
    rows = ["model", "temperature", "label", "Budget"]
    metrics = ["speedup", "alpha", "E", *dict.fromkeys(MOESPEC_QUALITY[0] + MOESPEC_QUALITY[1])]
    metrics = [m for m in metrics if m in cells and cells[m].notna().any()]
    cells = common_benchmarks(cells, rows)
    agg = cells.groupby(rows, sort=False)[metrics].mean().reset_index()
    agg.insert(len(rows), "Benchmarks", cells.groupby(rows, sort=False)["_benchmarks"].first().to_numpy())
    first = (
        cells.assign(_pred=cells["predictor_checkpoint"].notna())
        .groupby(rows, sort=False)
        .agg(_drafter=("drafter", "first"), _depth=("depth", "first"), _pred=("_pred", "any"))
        .reset_index()
    )
    parts = [
        row_parts(m, d, p, q)
        for m, d, p, q in zip(agg["model"], first["_drafter"], first["_depth"], first["_pred"], strict=True)
    ]
    for hw in HARDWARE if costs else ():
        agg[f"modeled {hw} speedup"] = [
            gpu_step(costs, m, a, e, hw, overheads, profiles, pt)["speedup"]
            if m in costs and a > 0 and pd.notna(e)
            else np.nan
            for m, a, e, pt in zip(agg["model"], agg["alpha"], agg["E"], parts, strict=True)
        ]
    agg["model"] = agg["model"].map(model_label)
    agg = agg.rename(columns=LABELS).dropna(axis=1, how="all")
    agg.insert(4, "Source", "ours")
    return agg
