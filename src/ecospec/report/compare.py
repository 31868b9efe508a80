"""Intervals in the tables: each cell's speedup with its 95 % interval (`experiment.intervals`), and method against
method, the ratio of two methods' estimates on the same prompts with a paired bootstrap interval, printed
`+4 % [−2, +9]` and marked within noise where the interval holds no change.

The two cells' per-prompt columns (`summary.intervals.units`) are joined on their prompts, so every resample
draws the same prompts for both methods and recomputes both estimates, each with its own denominator (a speedup
with its AR). A row that averages benchmarks resamples each benchmark on its own (a stratum) and divides the two
means, as the table's Avg. `paired`: the two cells were decoded in one run, prompt by prompt (`interleave`, the
shared `intervals.run`); `weakly paired`: the same prompts, measured in different jobs (a machine's load between
them is in the ratio); records from before the intervals have no per-prompt columns: no interval, said so.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd

from ecospec.analysis.bootstrap import bootstrap, ratio, speedup
from ecospec.report.frame import LABEL_COLUMNS, LABELS, model_label
from ecospec.report.layout import common_benchmarks

WIDTH = {"speedup": 6, "alpha": 2, "E": 2}  # columns per unit (analysis.bootstrap.SPEEDUP_COLUMNS; sum, count)
STAT = {"speedup": speedup, "alpha": ratio(0, 1), "E": ratio(0, 1)}
NO_INTERVAL = "no interval (records without per-prompt rows)"


def units(cell: pd.Series, metric: str) -> dict[str, list[float]] | None:
    """The cell's per-unit columns of `metric` by unit key, None for records without them."""
    iv = cell.get("intervals")
    u = iv.get("units") if isinstance(iv, dict) else None
    if not u or u.get(metric) is None:
        return None
    return dict(zip(u["keys"], u[metric], strict=True))


def run_of(cell: pd.Series) -> str | None:
    iv = cell.get("intervals")
    return iv.get("run") if isinstance(iv, dict) else None


def _strata(pairs: Sequence[tuple[pd.Series, pd.Series | None]], metric: str) -> list[np.ndarray] | None:
    """One stratum per benchmark: the units both cells decoded, a's columns then b's (b None: a's alone)."""
    out = []
    for a, b in pairs:
        ua = units(a, metric)
        ub = units(b, metric) if b is not None else ua
        if ua is None or ub is None:
            return None
        keys = sorted(set(ua) & set(ub))
        if len(keys) < 2:
            return None
        out.append(np.array([ua[k] + (ub[k] if b is not None else []) for k in keys], dtype=float))
    return out or None


def _mean_of(metric: str, part: int):
    """The mean over strata of `metric` computed from the `part`-th method's columns (0: a, 1: b)."""
    w = WIDTH[metric]
    return lambda sums: np.mean([STAT[metric]([s[:, part * w : (part + 1) * w]]) for s in sums], axis=0)


def mean_interval(cells: Sequence[pd.Series], metric: str, seed: int = 0) -> tuple[float, float] | None:
    """(low, high) of the mean over `cells` (one per benchmark) of their `metric`: a row's Avg; one cell: its own
    interval as the record holds it."""
    if len(cells) == 1:
        iv = (cells[0].get("intervals") or {}).get(metric) if isinstance(cells[0].get("intervals"), dict) else None
        return (iv["low"], iv["high"]) if iv else None
    strata = _strata([(c, None) for c in cells], metric)
    iv = bootstrap(strata, _mean_of(metric, 0), seed=seed) if strata else None
    return (iv.low, iv.high) if iv else None


def ratio_interval(pairs: Sequence[tuple[pd.Series, pd.Series]], metric: str, seed: int = 0) -> dict | None:
    """a against b over `pairs` (one (a cell, b cell) per benchmark): {estimate, low, high} of mean(a) / mean(b)
    on the prompts both decoded, or None (no per-prompt columns, fewer than 2 shared prompts)."""
    strata = _strata(pairs, metric)
    if strata is None:
        return None
    a, b = _mean_of(metric, 0), _mean_of(metric, 1)
    iv = bootstrap(strata, lambda sums: a(sums) / b(sums), seed=seed)
    return None if iv is None else {"estimate": iv.estimate, "low": iv.low, "high": iv.high}


def pairing(pairs: Sequence[tuple[pd.Series, pd.Series]]) -> str:
    """paired when every pair was decoded in one run, else weakly paired."""
    same = [run_of(a) is not None and run_of(a) == run_of(b) for a, b in pairs]
    return "paired" if same and all(same) else "weakly paired"


def change(est: float, low: float | None = None, high: float | None = None) -> str:
    """A ratio as a change with its interval, '+4 % [−2, +9]', and ' ≈' where the interval holds no change (within
    noise); '+4 %' without one."""
    sign = lambda x: f"{round(100 * (x - 1)):+d}".replace("-", "\u2212")  # noqa: E731
    if low is None or high is None:
        return f"{sign(est)} %"
    return f"{sign(est)} % [{sign(low)}, {sign(high)}]" + (" ≈" if low <= 1 <= high else "")


def cell_interval(cell: pd.Series, metric: str = "speedup") -> tuple[float, float] | None:
    """(low, high) of a cell's own interval of `metric` as its record holds it, or None."""
    iv = cell.intervals.get(metric) if isinstance(cell.intervals, dict) else None
    return (iv["low"], iv["high"]) if iv else None


def bracket(iv: tuple[float, float] | None) -> str:
    """An interval as the tables print it after its estimate, ' [1.21, 1.55]' ('' without one)."""
    return f" [{iv[0]:.2f}, {iv[1]:.2f}]" if iv else ""


def last_per_dataset(cells: pd.DataFrame, records: list[dict]) -> dict[str, dict]:
    """The last of `cells` on each Dataset (as its dict in `records`, by position), in order of first appearance:
    a benchmark's newest cell."""
    return {d: records[i] for d, i in zip(cells["Dataset"], cells.index, strict=True) if pd.notna(d)}


def _place_ratios(out: pd.DataFrame, keys: list[str], within: list[str], extra: list[tuple]) -> pd.DataFrame:
    """`out` with each ratio row after the last row of its group (its methods and the paper's)."""
    out_keys = list(out[keys].itertuples(index=False, name=None))
    after: dict = {}
    for key, row in extra:
        k = tuple(model_label(v) if r == "model" else v for r, v in zip(within, key, strict=True))
        at = [i for i, ok in zip(out.index, out_keys, strict=True) if ok == k]
        after.setdefault(max(at) if at else out.index.max(), []).append(row)
    order, added = [], len(out)
    for p, i in enumerate(out.index):
        order.append(p)
        order += range(added, added + len(after.get(i, ())))
        added += len(after.get(i, ()))
    rows = [row for i in out.index for row in after.get(i, ())]
    return pd.concat([out, pd.DataFrame(rows)], ignore_index=True).iloc[order].reset_index(drop=True)


def with_intervals(
    table: pd.DataFrame,
    cells: pd.DataFrame,
    rows: list[str],
    metrics: list[str],
    avg: bool,
    versus: tuple[tuple[str, str], ...] = (),
) -> pd.DataFrame:
    """A `layout.assemble` table (one column group per Dataset) with each of our rows' speedups bounded by their 95 %
    interval ("<group> speedup_lo" / "_hi"; Avg: the bootstrap of the mean over the row's benchmarks) and, per
    model and T (and the other row keys but the method), a ratio row for each (a, b) pair of roles in `versus`:
    a's estimate over b's on the prompts both decoded, per benchmark and for the Avg, with a paired bootstrap
    interval on each metric that has per-prompt columns (`report.compare`), Source "ratio", Pairing said."""
    if table.empty or "intervals" not in cells:
        return table
    out = table.copy()
    cells = cells.reset_index(drop=True)
    records = cells.to_dict("records")  # a row as a dict: a Series per row costs more than its bootstrap
    shared = common_benchmarks(cells, rows) if avg else cells
    shared_keys = list(shared[rows].itertuples(index=False, name=None))
    ours = out.index[out["Source"] == "ours"]
    bounds: dict[str, list] = {}
    if "speedup" in metrics:
        for i, (key, g) in zip(ours, cells.groupby(rows, sort=False, dropna=False), strict=True):
            key = key if isinstance(key, tuple) else (key,)
            parts = list(last_per_dataset(g, records).items())
            common = shared[[k == key for k in shared_keys]]
            if avg and len(common):
                parts.append(("Avg", list(last_per_dataset(common, records).values())))
            for d, c in parts:
                iv = mean_interval(c if isinstance(c, list) else [c], "speedup")
                lo, hi = iv if iv else (np.nan, np.nan)
                bounds.setdefault(f"{d} speedup_lo", [np.nan] * len(out))[i] = lo
                bounds.setdefault(f"{d} speedup_hi", [np.nan] * len(out))[i] = hi
    extra = []
    within = [r for r in rows if r != "label"]
    for key, g in cells.groupby(within, sort=False, dropna=False):
        key = key if isinstance(key, tuple) else (key,)
        for a_role, b_role in versus:
            a, b = g[g["role"] == a_role], g[g["role"] == b_role]
            a_last, b_last = last_per_dataset(a, records), last_per_dataset(b, records)
            datasets = [d for d in a_last if d in b_last]
            if not datasets:
                continue
            pairs = [(a_last[d], b_last[d]) for d in datasets]
            row = {LABELS.get(r, r): (model_label(v) if r == "model" else v) for r, v in zip(within, key, strict=True)}
            row.update({"Method": f"{a['label'].iloc[0]} vs {b['label'].iloc[0]}", "Source": "ratio"})
            if "Benchmarks" in out:
                row["Benchmarks"] = ", ".join(datasets)
            found = False
            groups = [(d, [p]) for d, p in zip(datasets, pairs, strict=True)] + ([("Avg", pairs)] if avg else [])
            for m in (m for m in metrics if m in STAT):
                for d, ps in groups:
                    iv = ratio_interval(ps, m)
                    found |= iv is not None
                    if iv is None:  # the point ratio of the cells' own values (no interval)
                        est = np.mean([x[m] for x, _ in ps]) / np.mean([y[m] for _, y in ps])
                        iv = {"estimate": est, "low": np.nan, "high": np.nan}
                    row[f"{d} {m}"], row[f"{d} {m}_lo"], row[f"{d} {m}_hi"] = iv["estimate"], iv["low"], iv["high"]
            row["Pairing"] = pairing(pairs) if found else NO_INTERVAL
            extra.append((key, row))
    for col, values in bounds.items():
        out[col] = values
    if extra:
        out = _place_ratios(out, [LABELS.get(r, r) for r in within], within, extra)
    out = out.drop(columns=[c for c in out.columns if c.endswith(("_lo", "_hi")) and out[c].isna().all()])
    values = [c for c in out.columns if c not in LABEL_COLUMNS]
    base = [c for c in values if not c.endswith(("_lo", "_hi"))]
    ordered = [x for c in base for x in (c, f"{c}_lo", f"{c}_hi") if x in out.columns]
    labels = [c for c in out.columns if c in LABEL_COLUMNS]
    return out[labels + ordered]
