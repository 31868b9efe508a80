"""Laying a table out: cells in, one row per method (or other row key) out, a column per group and metric, the
paper's value beside ours (a `paper` row under each `ours` row it has values for).

A table frame has label columns (Model, T, Method, ..., Source; `frame.LABEL_COLUMNS`) and numeric columns named
"<group> <metric>" or "<metric>" (e.g. "GSM8K speedup", "Avg E", "t_verify_s"); `write.py` formats them, NaN shows
as "—".
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from ecospec.report.frame import GROUP, LABELS, model_label


def common_benchmarks(cells: pd.DataFrame, rows: list[str]) -> pd.DataFrame:
    """`cells` on the benchmarks every row of its model (and T) has, with `_benchmarks` naming them: rows set side
    by side that average benchmarks average the same ones."""
    if "Dataset" not in cells or cells.empty:
        return cells.assign(_benchmarks=None)
    group = [r for r in rows if r in GROUP] or ["model"]
    keep, names = [], {}
    for key, g in cells.groupby(group, sort=False, dropna=False):
        sets = [set(h["Dataset"]) for _, h in g.groupby(rows, sort=False, dropna=False)]
        common = set.intersection(*sets)
        key = key if isinstance(key, tuple) else (key,)
        names[key] = ", ".join(d for d in dict.fromkeys(g["Dataset"]) if d in common)
        keep.append(g[g["Dataset"].isin(common)])
    out = pd.concat(keep) if keep else cells.iloc[:0]
    out = out.loc[[i for i in cells.index if i in out.index]]
    bench = [names[tuple(k)] for k in out[group].itertuples(index=False, name=None)]
    return out.assign(_benchmarks=bench)


def assemble(
    cells: pd.DataFrame,
    rows: list[str],
    metrics: list[str],
    col: str | None = None,
    groups: list[str] = (),
    avg: bool = False,
    paper: pd.DataFrame | None = None,
    on: list[str] = (),
    first: list[str] = (),
) -> pd.DataFrame:
    """`cells` as one row per `rows` key (in order of first appearance) with columns "<group> <metric>" for each
    value of the `col` column (ordered as in `groups`, others as they come), or "<metric>" (the mean over the row's
    cells) without `col`; `first`: row means put first; `avg`: "Avg <metric>", the mean over the groups present
    in the row. Then a `paper` row under each row the paper has values for: `paper` is long (`on` columns + col,
    metric, value) and is matched to the rows on `on`. Columns with no value at all are dropped."""
    index = cells.drop_duplicates(rows).set_index(rows).index
    bench = None
    if col is None and "Dataset" in cells:  # a mean over benchmarks: the ones every row beside it has, named
        cells = common_benchmarks(cells, rows)
        bench = cells.groupby(rows, sort=False)["_benchmarks"].first()
    g = cells.groupby(rows, sort=False)
    ours = g[list(first)].mean() if first else pd.DataFrame(index=index)
    if col is None:
        ours = ours.join(g[metrics].mean())
        names = list(metrics)
    else:
        wide = cells.groupby([*rows, col], sort=False)[metrics].mean().unstack(col)
        present = list(dict.fromkeys(cells[col]))
        order = list(present)
        for x in present:
            for m in metrics:
                ours[f"{x} {m}"] = wide[(m, x)]
        if avg:  # over the benchmarks every row of its model and T has
            shared = common_benchmarks(cells, rows) if col == "Dataset" else cells.assign(_benchmarks=None)
            if col == "Dataset":
                bench = shared.groupby(rows, sort=False)["_benchmarks"].first()
            mean = shared.groupby(rows, sort=False)[metrics].mean()
            for m in metrics:
                ours[f"Avg {m}"] = mean[m].reindex(ours.index)
            order.append("Avg")
    ours = ours.reindex(index)
    pw = None
    if paper is not None and len(paper):
        keys = cells.drop_duplicates(rows)[list(dict.fromkeys([*rows, *on]))]
        p = keys.merge(paper[paper["metric"].isin(metrics)], on=list(on))
        if len(p):
            p["name"] = p["metric"] if col is None else p["col"] + " " + p["metric"]
            pw = p.pivot_table(index=rows, columns="name", values="value", aggfunc="first").reindex(index)
            if col is not None:
                order += [x for x in dict.fromkeys(p["col"]) if x not in order]
    have = set(ours.columns) | (set(pw.columns) if pw is not None else set())
    if col is not None:  # every metric of a group that has any; `groups` order, others before Avg
        rank = {x: i for i, x in enumerate(x for x in groups if x != "Avg")}
        order = sorted(order, key=lambda x: len(rank) + (x == "Avg") if x not in rank else rank[x])
        names = [f"{x} {m}" for x in order if any(f"{x} {m}" in have for m in metrics) for m in metrics]
    cols = [c for c in first if c in have] + [c for c in names if col is not None or c in have]
    ours = ours.reindex(columns=cols)
    parts = [ours.assign(Source="ours", _row=np.arange(len(ours)), _src=0)]
    if pw is not None:
        pw = pw.reindex(columns=cols)
        has = pw.notna().any(axis=1).to_numpy()
        parts.append(pw[has].assign(Source="paper", _row=np.arange(len(pw))[has], _src=1))
    out = pd.concat(parts).sort_values(["_row", "_src"], kind="stable").drop(columns=["_row", "_src"])
    out = out.reset_index()
    empty = {c for c in cols if out[c].isna().all()}
    if col is not None:  # a group stays whole if any of its columns has a value (a cell prints all its metrics)
        for x in order:
            group = {f"{x} {m}" for m in metrics}
            if not group & set(cols) <= empty:
                empty -= group
    out = out.drop(columns=sorted(empty))
    if "model" in out:
        out["model"] = out["model"].map(model_label)
    out = out.rename(columns=LABELS)
    label_cols = [LABELS.get(r, r) for r in rows] + ["Source"]
    if bench is not None:  # which benchmarks each of our rows averages (paper rows: the paper's own; Avg columns)
        out["Benchmarks"] = pd.Series(np.nan, index=out.index, dtype=object)
        mine = (out["Source"] == "ours").to_numpy()
        out.loc[mine, "Benchmarks"] = bench.reindex(index).to_numpy()
        label_cols.append("Benchmarks")
    return out[label_cols + [c for c in out.columns if c not in label_cols]].reset_index(drop=True)
