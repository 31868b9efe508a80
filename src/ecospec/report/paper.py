"""The papers' table values, long format: the EcoSpec paper's (`paper/tableNN.csv`; `paper/README.md` says which are
partial) and the overlap paper's (`paper_overlap/tableNN.csv`, complete; `paper_overlap/README.md`)."""

from __future__ import annotations

from functools import cache
from importlib.resources import files

import pandas as pd

# the paper's metric names -> the report's column metrics (same units, except bytes stored as GB)
METRICS = {"experts_per_layer": "E", "hbm_bytes_per_verify": "hbm_gb"}


def _read(folder: str) -> pd.DataFrame:
    root = files("ecospec.report") / folder
    dtypes = {"table": int, "model": str, "method": str, "dataset": str, "setting": str, "metric": str}
    names = sorted(p.name for p in root.iterdir() if p.name.startswith("table") and p.name.endswith(".csv"))
    df = pd.concat([pd.read_csv(root / n, dtype=dtypes, keep_default_na=False) for n in names], ignore_index=True)
    for k in ("temperature", "gamma", "batch_size", "value"):
        df[k] = pd.to_numeric(df[k].replace("", None), errors="coerce").astype(float)
    return df


@cache
def _all() -> pd.DataFrame:
    df = _read("paper")
    df["metric"] = df["metric"].replace(METRICS)
    return df


@cache
def _overlap() -> pd.DataFrame:
    return _read("paper_overlap")


def paper_values(table: int | None = None) -> pd.DataFrame:
    """Columns table, model, method, dataset, temperature, gamma, batch_size, setting, metric, value, unit,
    row_label, col_label; empty strings / NaN where the paper's axis does not apply. A copy: callers may edit."""
    df = _all()
    return (df if table is None else df[df["table"] == table]).reset_index(drop=True)


def overlap_paper_values(table: int | None = None) -> pd.DataFrame:
    """The overlap paper's values, as `paper_values` (its own model names: mixtral, qwen3_30b, qwen3_235b, ...)."""
    df = _overlap()
    return (df if table is None else df[df["table"] == table]).reset_index(drop=True)
