"""The EcoSpec paper's table values (`paper/tableNN.csv`, long format; `paper/README.md` says which are partial)."""

from __future__ import annotations

from functools import cache
from importlib.resources import files

import pandas as pd

# the paper's metric names -> the report's column metrics (same units, except bytes stored as GB)
METRICS = {"experts_per_layer": "E", "hbm_bytes_per_verify": "hbm_gb"}


@cache
def _all() -> pd.DataFrame:
    root = files("ecospec.report") / "paper"
    dtypes = {"table": int, "model": str, "method": str, "dataset": str, "setting": str, "metric": str}
    frames = [pd.read_csv(root / f"table{n:02d}.csv", dtype=dtypes, keep_default_na=False) for n in range(1, 14)]
    df = pd.concat(frames, ignore_index=True)
    for k in ("temperature", "gamma", "batch_size", "value"):
        df[k] = pd.to_numeric(df[k].replace("", None), errors="coerce").astype(float)
    df["metric"] = df["metric"].replace(METRICS)
    return df


def paper_values(table: int | None = None) -> pd.DataFrame:
    """Columns table, model, method, dataset, temperature, gamma, batch_size, setting, metric, value, unit,
    row_label, col_label; empty strings / NaN where the paper's axis does not apply. A copy: callers may edit."""
    df = _all()
    return (df if table is None else df[df["table"] == table]).reset_index(drop=True)
