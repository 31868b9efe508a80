"""The EcoSpec paper's tables from the records frame (`records.py`): one pure builder per table, frame in ->
DataFrame out, with the paper's value beside ours (a `paper` row under each `ours` row it has values for).

A table frame has label columns (Model, T, Method, ..., Source) and numeric columns named "<group> <metric>"
or "<metric>" (e.g. "GSM8K speedup", "Avg E", "t_verify_s"); `write.py` formats them, NaN shows as "—".
Which records feed a table: status ok, the held-out split where a model has it (the paper's protocol), the paper's
main settings (`MAIN`: each model's own γ, `model.gamma`, the paper's 4 unless experiment=gamma_protocol chose
another; depth 3, top-2, B=1) except
the axis the table sweeps, and each model's standard drafter and predictor checkpoints (conf/model; Table 5
takes the other drafter checkpoints, Table 9 every predictor checkpoint). When several records fit one cell
(reruns), the newest is taken. The "baseline" is the model's own SD baseline: confidence selection with
its drafter, labelled by the drafter (EAGLE-3, or MTP for DeepSeek), whatever the method was called.
"""

from __future__ import annotations

import functools
import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import numpy as np
import pandas as pd

from ecospec.analysis.cost import ModelCost, StepParts, fit_overhead, load_model_config, modeled_step, step_parts
from ecospec.analysis.hardware import HARDWARE, Hardware
from ecospec.drafters.registry import labels as drafter_labels
from ecospec.methods import methods
from ecospec.report.paper import paper_values

MAIN = {"gamma": "model", "depth": 3, "topk": 2, "batch_size": 1}  # the paper's defaults (§5.1); γ: each model's
PAPER_GAMMA = 4  # the γ the paper's rule chose for its models (App. C): a model without its own γ holds this
MODELS = {"qwen3": "Qwen3-235B-A22B", "gptoss": "GPT-OSS-120B", "deepseek": "DeepSeek-V3.1"}
DATASETS = {
    "gsm8k": "GSM8K",
    "humaneval": "HumanEval",
    "aime25": "AIME25",
    "math500": "MATH500",
    "amc": "AMC22-24",
    "mtbench": "MT-Bench",
    "mmstar": "MMStar",
}
DRAFTERS = drafter_labels()  # the model's own drafter as the tables print it (drafters.registry)
ROLES = {"ar": "AR", **{m.role: m.label for m in methods()}}  # in the tables' order (ecospec.methods)
SELECTOR_ROLES = {m.name: m.role for m in methods()}
SPD_ALPHA_E = ["speedup", "alpha", "E"]
LABELS = {
    "model": "Model",
    "temperature": "T",
    "label": "Method",
    "gamma": "γ",
    "drafter_path": "Drafter checkpoint",
    "predictor_checkpoint": "Predictor checkpoint",
}
# a table frame's row-label columns (with those of the overlap paper's tables, report/routing.py); the others hold
# values
LABEL_COLUMNS = {
    *LABELS.values(),
    "Source",
    "Data",
    "Setting",
    "B",
    "Budget",
    "Dataset",
    "Depth",
    "Layer",
    "Pairing",
    "Benchmarks",
}
GROUP = ("model", "temperature")  # rows set side by side: a model at one T (their averages take the same benchmarks)


def model_label(name: str) -> str:
    return MODELS.get(name, name)


def _rank(values: pd.Series, order) -> pd.Series:
    """Position in `order`, unknown values after it (then alphabetical by the caller's stable sort)."""
    pos = {v: i for i, v in enumerate(order)}
    return values.map(lambda v: pos.get(v, len(pos)))


# -- which records ------------------------------------------------------------------------------------------


def infer_defaults(frame: pd.DataFrame) -> dict[str, dict]:
    """Per model, from the records alone: the most common drafter path per drafter kind and predictor checkpoint,
    and the drafter ecospec cells use. `records.conf_defaults` (conf/model) takes precedence over these."""
    ok = frame[frame["status"] == "ok"]
    out: dict[str, dict] = {}
    for model, g in ok.groupby("model", sort=False):
        paths = g.dropna(subset=["drafter"]).groupby("drafter")["drafter_path"]
        pred = g["predictor_checkpoint"].dropna()
        eco = g.loc[g["selector"] != "confidence", "drafter"].dropna()
        out[model] = {
            "default_drafter": eco.mode().iloc[0] if len(eco) else None,
            "drafters": {k: (s.mode().iloc[0] if s.notna().any() else None) for k, s in paths},
            "predictor": pred.mode().iloc[0] if len(pred) else None,
            "gamma": int(g["model_gamma"].dropna().mode().iloc[0]) if g["model_gamma"].notna().any() else None,
        }
    return out


def prepare(frame: pd.DataFrame, defaults: Mapping[str, dict] | None = None) -> pd.DataFrame:
    """The ok records with derived columns: role (ar, or the method's role: `ecospec.methods`), label (the
    method as the tables print it), paper_method (the paper CSVs' name for it), std_drafter / std_predictor (the
    model's standard drafter checkpoint / predictor checkpoint, or none used), standard (both), Dataset (its
    printed name), hbm_gb and sort ranks. Idempotent."""
    if "role" in frame.columns:
        return frame
    defaults = {**infer_defaults(frame), **(defaults or {})}
    heavy = ["expert_load", "experts_by_layer", "trace", "cell", "cell_id"]  # no table reads them; filters copy less
    df = frame.loc[frame["status"] == "ok", [c for c in frame.columns if c not in heavy]].copy()
    # the paper's protocol: evaluations on the held-out 20 % (data.split); a model's split=all records only count
    # when it has no held-out ones (e.g. records from before the split knob)
    if "split" in df.columns:
        held = set(df.loc[df["split"] == "heldout", "model"])
        df = df[(df["split"] == "heldout") | ~df["model"].isin(held)]
    df["role"] = df["selector"].map(SELECTOR_ROLES).where(df["drafter"].notna(), "ar")
    df = df[df["role"].notna()]
    d = pd.DataFrame(
        [(m, v.get("default_drafter"), v.get("predictor")) for m, v in defaults.items()],
        columns=["model", "_default_drafter", "_predictor"],
    )
    paths = pd.DataFrame(
        [(m, k, p) for m, v in defaults.items() for k, p in (v.get("drafters") or {}).items()],
        columns=["model", "drafter", "_path"],
    )
    df = df.merge(d, on="model", how="left").merge(paths, on=["model", "drafter"], how="left")
    own = pd.Series({m: v.get("gamma") for m, v in defaults.items()}, dtype=object)
    gamma = df["model"].map(own) if len(own) else pd.Series(None, index=df.index, dtype=object)
    if "model_gamma" in df:  # the record's own model.gamma where the defaults name none
        gamma = gamma.astype(object).where(gamma.notna(), df["model_gamma"])
    df["model_gamma"] = pd.to_numeric(gamma, errors="coerce").fillna(PAPER_GAMMA).astype(int)
    same_path = df["drafter_path"].fillna("").astype(str) == df["_path"].fillna("").astype(str)
    same_pred = df["predictor_checkpoint"].isna() | (
        df["predictor_checkpoint"].astype(str) == df["_predictor"].fillna("").astype(str)
    )
    # a GTO-trained head is Table 5's own drafter, never a model's standard one (even where its path is the default)
    df["std_drafter"] = (same_path | df["drafter"].isna()) & (df["drafter"] != "gto")
    df["std_predictor"] = same_pred
    # MoE-Spec's expert cap (lossy) makes a cell the MoE-Spec table's own, never a standard one
    budget = df["expert_budget"] if "expert_budget" in df else pd.Series(np.nan, index=df.index)
    df["budgeted"] = budget.notna()
    df["standard"] = df["std_drafter"] & df["std_predictor"] & ~df["budgeted"]
    drafter = df["drafter"].map(lambda k: DRAFTERS.get(k, k))
    base = df["role"] == "baseline"
    df["label"] = df["role"].map(ROLES).where(~base, drafter)
    other = ~base & (df["role"] != "ar") & df["drafter"].notna() & (df["drafter"] != df["_default_drafter"])
    df.loc[other, "label"] = df["label"] + " (" + drafter + ")"
    df["paper_method"] = df["role"].where(~base, df["drafter"])
    # beyond the paper: one expert buffer for the whole batch (B > 1); its own row, no paper value beside it
    shared = df["batch_buffer"].fillna("sequence").eq("batch") & df["role"].isin(["ecospec", "oracle"])
    df.loc[shared, "label"] = df["label"] + " (batch buffer)"
    df.loc[shared, "paper_method"] = df["role"] + "_batch_buffer"
    capped = df["budgeted"] & df["role"].isin(["baseline", "ecospec"])
    df.loc[capped, "label"] = df["role"].map({"baseline": "MoE-Spec", "ecospec": "EcoSpec + MoE-Spec"})
    df.loc[capped, "paper_method"] = df["role"].map({"baseline": "moespec", "ecospec": "ecospec_moespec"})
    policy = df["budget_policy"] if "budget_policy" in df else pd.Series(None, index=df.index, dtype=object)
    subst = capped & policy.eq("substitute")
    df.loc[subst, "label"] = df["label"] + " (substitute)"
    df["_model_rank"] = _rank(df["model"], MODELS)
    df["_role_rank"] = _rank(df["role"], ROLES)
    df["Dataset"] = df["dataset"].map(lambda k: DATASETS.get(k, k))
    df["hbm_gb"] = df["hbm_bytes_per_verify"] / 1e9
    df = df.drop(columns=["_default_drafter", "_predictor", "_path"])
    return df.sort_values(["_model_rank", "model", "temperature", "_role_rank", "label", "finished"], kind="stable")


def _newest(df: pd.DataFrame, keys: list[str]) -> pd.DataFrame:
    """One record per cell: the newest (df is sorted by finished within equal keys by `prepare`)."""
    return df.drop_duplicates(keys, keep="last")


def _at(df: pd.DataFrame, mix: bool = False, **settings) -> pd.DataFrame:
    """Rows at the main settings, with `settings` overriding them (None = any value). The `mix` cells (instances
    drawn from several benchmarks, Table 8's) are no benchmark of the other tables: only with `mix=True`."""
    want = {**MAIN, **settings}
    mask = np.ones(len(df), dtype=bool) if mix else (df["dataset"] != "mix").to_numpy(copy=True)
    for k, v in want.items():
        if k == "gamma" and v == "model":
            mask &= (df["gamma"] == df["model_gamma"]).to_numpy()
        elif v is not None:
            mask &= (df[k] == v).to_numpy()
    return df[mask]


# -- the table layout -----------------------------------------------------------------------------------------


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


def _assemble(
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


def with_intervals(
    table: pd.DataFrame,
    cells: pd.DataFrame,
    rows: list[str],
    metrics: list[str],
    avg: bool,
    versus: tuple[tuple[str, str], ...] = (),
) -> pd.DataFrame:
    """An `_assemble` table (one column group per Dataset) with each of our rows' speedups bounded by their 95 %
    interval ("<group> speedup_lo" / "_hi"; Avg: the bootstrap of the mean over the row's benchmarks) and, per
    model and T (and the other row keys but the method), a ratio row for each (a, b) pair of roles in `versus`:
    a's estimate over b's on the prompts both decoded, per benchmark and for the Avg, with a paired bootstrap
    interval on each metric that has per-prompt columns (`report.compare`), Source "ratio", Pairing said."""
    from ecospec.report.compare import NO_INTERVAL, STAT, mean_interval, pairing, ratio_interval

    if table.empty or "intervals" not in cells:
        return table
    out = table.copy()
    shared = common_benchmarks(cells, rows) if avg else cells
    ours = out.index[out["Source"] == "ours"]
    bounds: dict[str, list] = {}
    if "speedup" in metrics:
        for i, (key, g) in zip(ours, cells.groupby(rows, sort=False, dropna=False), strict=True):
            parts = [(d, h.iloc[-1]) for d, h in g.groupby("Dataset", sort=False)]
            common = shared[shared[rows].apply(tuple, axis=1) == (key if isinstance(key, tuple) else (key,))]
            if avg and len(common):
                parts.append(("Avg", [h.iloc[-1] for _, h in common.groupby("Dataset", sort=False)]))
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
            datasets = [d for d in dict.fromkeys(a["Dataset"]) if d in set(b["Dataset"])]
            if not datasets:
                continue
            pairs = [(a[a["Dataset"] == d].iloc[-1], b[b["Dataset"] == d].iloc[-1]) for d in datasets]
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
        keys = [LABELS.get(r, r) for r in within]
        placed = []
        for key, row in extra:  # after the last row of its group (its methods and the paper's)
            k = tuple(model_label(v) if r == "model" else v for r, v in zip(within, key, strict=True))
            mask = out[keys].apply(tuple, axis=1) == k
            placed.append((out.index[mask].max() if mask.any() else out.index.max(), row))
        pieces = []
        for i in out.index:
            pieces.append(out.loc[[i]])
            pieces += [pd.DataFrame([row]) for at, row in placed if at == i]
        out = pd.concat(pieces, ignore_index=True)
    out = out.drop(columns=[c for c in out.columns if c.endswith(("_lo", "_hi")) and out[c].isna().all()])
    values = [c for c in out.columns if c not in LABEL_COLUMNS]
    base = [c for c in values if not c.endswith(("_lo", "_hi"))]
    ordered = [x for c in base for x in (c, f"{c}_lo", f"{c}_hi") if x in out.columns]
    labels = [c for c in out.columns if c in LABEL_COLUMNS]
    return out[labels + ordered]


def _paper(table: int, col: Callable[[pd.DataFrame], pd.Series] | None = None) -> pd.DataFrame:
    """Paper values as `_assemble` wants them: model, paper_method, temperature, col, metric, value. A blank
    temperature (the text does not say) is matched to T=0, the paper's main setting."""
    p = paper_values(table).rename(columns={"method": "paper_method"})
    p["temperature"] = p["temperature"].fillna(0.0)
    p["col"] = col(p) if col is not None else ""
    return p


def _dataset_col(p: pd.DataFrame) -> pd.Series:
    return p["dataset"].map(lambda d: "Avg" if d == "avg" else DATASETS.get(d, d))


def _b(values: pd.Series) -> pd.Series:
    return "B=" + values.fillna(0).astype(int).astype(str)


BENCHMARKS = [*DATASETS.values(), "Avg"]
ROW_KEYS = ["model", "temperature", "label"]
PAPER_KEYS = ["model", "temperature", "paper_method"]


# -- the tables ------------------------------------------------------------------------------------------------


def cells01(frame, defaults=None) -> pd.DataFrame:
    df = prepare(frame, defaults)
    df = _at(df[df["standard"] & df["role"].isin(["baseline", "ecospec"])])
    return _newest(df, ["model", "temperature", "role", "drafter", "dataset"])


def table01_main(frame: pd.DataFrame, defaults=None) -> pd.DataFrame:
    """Table 1: speedup / α / E per model × T × method (baseline, EcoSpec) × benchmark, and their average."""
    cells = cells01(frame, defaults)
    table = _assemble(cells, ROW_KEYS, SPD_ALPHA_E, "Dataset", BENCHMARKS, True, _paper(1, _dataset_col), PAPER_KEYS)
    return with_intervals(table, cells, ROW_KEYS, SPD_ALPHA_E, True, (("ecospec", "baseline"),))


def _greedy(frame, defaults=None) -> pd.DataFrame:
    """AR, baseline and EcoSpec cells at T=0 (Tables 2-3)."""
    df = prepare(frame, defaults)
    df = _at(df[df["standard"] & df["role"].isin(["ar", "baseline", "ecospec"])], temperature=0.0)
    return _newest(df, ["model", "role", "drafter", "dataset"])


cells02 = cells03 = _greedy


def table02_hbm(frame: pd.DataFrame, defaults=None) -> pd.DataFrame:
    """Table 2: estimated HBM bytes per verify pass (GB) and E, T=0, mean over the benchmarks present."""
    return _assemble(
        _greedy(frame, defaults), ["model", "label"], ["E", "hbm_gb"], paper=_paper(2), on=["model", "paper_method"]
    )


def table03_latency(frame: pd.DataFrame, defaults=None) -> pd.DataFrame:
    """Table 3: per-step latency breakdown, α and speedup, T=0, mean over the benchmarks present; and the cost
    regime (docs/design.md): T_draft / T_AR (AR's time per token) and T_pred / T_verify."""
    cells = _greedy(frame, defaults).copy()
    cells["draft_over_ar"] = cells["t_draft_s"] / cells["ar_t_step_s"]
    cells["pred_over_verify"] = cells["t_pred_s"] / cells["t_verify_s"]
    metrics = [
        "E",
        "t_pred_s",
        "t_draft_s",
        "t_verify_s",
        "t_step_s",
        "draft_over_ar",
        "pred_over_verify",
        "alpha",
        "speedup",
    ]
    return _assemble(cells, ["model", "label"], metrics, paper=_paper(3), on=["model", "paper_method"])


def _paired(frame, defaults, role: str) -> pd.DataFrame:
    """Standard cells of `role`, and EcoSpec's at each (model, T, benchmark) that has a `role` cell."""
    df = prepare(frame, defaults)
    df = _at(df[df["standard"] & df["role"].isin([role, "ecospec"])])
    df = _newest(df, ["model", "temperature", "role", "drafter", "dataset"])
    have = df.loc[df["role"] == role, ["model", "temperature", "dataset"]].drop_duplicates()
    keep = pd.MultiIndex.from_frame(df[["model", "temperature", "dataset"]]).isin(pd.MultiIndex.from_frame(have))
    return df[keep]


def cells04(frame, defaults=None) -> pd.DataFrame:
    return _paired(frame, defaults, "global_cost")


def table04_ablation(frame: pd.DataFrame, defaults=None) -> pd.DataFrame:
    """Table 4: the static global-cost variant vs EcoSpec's marginal cost: speedup / α / E per benchmark."""
    cells = cells04(frame, defaults)
    table = _assemble(cells, ROW_KEYS, SPD_ALPHA_E, "Dataset", BENCHMARKS, False, _paper(4, _dataset_col), PAPER_KEYS)
    return with_intervals(table, cells, ROW_KEYS, SPD_ALPHA_E, False, (("ecospec", "global_cost"),))


def cells05(frame, defaults=None) -> pd.DataFrame:
    """Table 5's cells: the GTO-trained head (drafter `gto`), and any other non-standard drafter checkpoint, alone
    (confidence) and with EcoSpec, beside the model's own baseline and EcoSpec where those ran too."""
    df = prepare(frame, defaults)
    other = (df["drafter"] == "gto") | ~df["std_drafter"]
    df = _at(df[df["std_predictor"] & ~df["budgeted"] & df["role"].isin(["baseline", "ecospec"])])
    have = df[other.reindex(df.index, fill_value=False)]
    keys = have[["model", "temperature", "dataset"]].drop_duplicates()
    base = df[df["standard"]].merge(keys, on=["model", "temperature", "dataset"])
    out = pd.concat([base, have], ignore_index=True)
    return _newest(out, ["model", "temperature", "drafter", "drafter_path", "role", "dataset"])


def table05_drafters(frame: pd.DataFrame, defaults=None) -> pd.DataFrame:
    """Table 5: the GTO-trained head (and other drafter checkpoints) alone and with EcoSpec, beside the model's own
    baseline and EcoSpec: speedup / α per benchmark."""
    cells = cells05(frame, defaults).copy()
    drafter = cells["drafter"].map(lambda k: DRAFTERS.get(k, k))
    own = cells["standard"]
    cells["label"] = cells["label"].where(own | (cells["role"] == "baseline"), drafter + " + EcoSpec")
    cells["_rank"] = (~own).astype(int) * 2 + (cells["role"] == "ecospec").astype(int)
    cells = cells.sort_values(["_model_rank", "model", "temperature", "_rank"], kind="stable")
    rows = ["model", "temperature", "label"]
    # the paper's Table 5 methods are gto and gto_ecospec (its text states no cell of it: report/paper/README.md)
    mine = cells["drafter"].where(cells["role"] == "baseline", cells["drafter"] + "_ecospec")
    cells["paper_method"] = cells["paper_method"].where(own, mine)
    paper = _paper(5, _dataset_col)
    return _assemble(cells, rows, ["speedup", "alpha"], "Dataset", BENCHMARKS, True, paper, PAPER_KEYS)


def _swept(frame, defaults, axis: str) -> pd.DataFrame:
    """Standard baseline and EcoSpec cells with `axis` free, of the (model, T) that have more than one value of it."""
    df = prepare(frame, defaults)
    df = _at(df[df["standard"] & df["role"].isin(["baseline", "ecospec"])], **{axis: None})
    df = _newest(df, ["model", "temperature", "role", "drafter", "dataset", "batch_buffer", axis])
    return df[df.groupby(["model", "temperature"])[axis].transform("nunique") > 1]


def cells06(frame, defaults=None) -> pd.DataFrame:
    return _swept(frame, defaults, "batch_size")


def table06_07_batch(frame: pd.DataFrame, defaults=None) -> pd.DataFrame:
    """Tables 6-7: speedup / E by batch size B, each the mean over the benchmarks present."""
    cells = cells06(frame, defaults).sort_values("batch_size", kind="stable").copy()
    cells = cells.sort_values(["_model_rank", "model", "temperature", "_role_rank", "label"], kind="stable")
    cells["B"] = _b(cells["batch_size"])
    paper = pd.concat([_paper(6), _paper(7)], ignore_index=True)
    paper = paper[paper["dataset"] == "avg"].assign(col=lambda p: _b(p["batch_size"]))
    groups = sorted(set(cells["B"]) | set(paper["col"]), key=lambda b: int(b[2:]))
    return _assemble(cells, ROW_KEYS, ["speedup", "E"], "B", groups, False, paper, PAPER_KEYS)


def cells08(frame, defaults=None) -> pd.DataFrame:
    """Table 8's cells: per model its `mix` cells (the paper's instances drawn from the seven benchmarks) where it
    has any, else every benchmark's, at every batch size."""
    df = prepare(frame, defaults)
    df = _at(df[df["standard"] & df["role"].isin(["baseline", "ecospec"])], mix=True, batch_size=None)
    mixed = set(df.loc[df["dataset"] == "mix", "model"])
    df = df[(df["dataset"] == "mix") | ~df["model"].isin(mixed)]
    return _newest(df, ["model", "temperature", "role", "drafter", "dataset", "batch_buffer", "batch_size"])


def table08_rho(frame: pd.DataFrame, defaults=None) -> pd.DataFrame:
    """Table 8: ρ = T_AR / T_verify (mean AR step time over mean verify time, over the benchmarks present) and
    speedup by batch size B, and ρ at the row's largest B."""
    cells = cells08(frame, defaults)
    keys = [*ROW_KEYS, "paper_method"]
    agg = (
        cells.groupby([*keys, "batch_size"], sort=False)
        .agg(ar=("ar_t_step_s", "mean"), verify=("t_verify_s", "mean"), speedup=("speedup", "mean"))
        .reset_index()
        .sort_values("batch_size", kind="stable")
    )
    agg["rho"] = agg["ar"] / agg["verify"]
    agg["B"] = _b(agg["batch_size"])
    if agg["batch_size"].nunique() > 1:
        agg = pd.concat([agg, agg.drop_duplicates(keys, keep="last").assign(B="Largest B", speedup=np.nan)])
    agg = cells.drop_duplicates(ROW_KEYS)[ROW_KEYS].merge(agg, on=ROW_KEYS)
    paper = _paper(8)
    paper["col"] = _b(paper["batch_size"]).where(paper["setting"] != "largest_bs", "Largest B")
    groups = sorted(set(agg["B"]) - {"Largest B"}, key=lambda b: int(b[2:])) + ["Largest B"]
    table = _assemble(agg, ROW_KEYS, ["rho", "speedup"], "B", groups, False, paper, PAPER_KEYS)
    return table.drop(columns=["Largest B speedup"], errors="ignore")


def cells09(frame, defaults=None) -> pd.DataFrame:
    df = prepare(frame, defaults)
    df = _at(df[df["std_drafter"] & ~df["budgeted"] & (df["role"] == "ecospec")])
    df = _newest(df, ["model", "temperature", "predictor_checkpoint", "dataset"])
    return df[df.groupby("model")["predictor_checkpoint"].transform("nunique") > 1]


def table09_predictor(frame: pd.DataFrame, defaults=None) -> pd.DataFrame:
    """Table 9: EcoSpec with each predictor checkpoint, in order of its top-k accuracy: speedup / α / E."""
    cells = cells09(frame, defaults).copy()
    cells["accuracy"] = cells.groupby(["model", "predictor_checkpoint"])["predictor_accuracy"].transform("mean")
    cells = cells.sort_values(
        ["_model_rank", "model", "temperature", "accuracy", "predictor_checkpoint"], kind="stable", na_position="last"
    )
    paper = _paper(9, _dataset_col).assign(predictor_checkpoint=lambda p: p["setting"])
    rows = ["model", "temperature", "predictor_checkpoint"]
    return _assemble(cells, rows, SPD_ALPHA_E, "Dataset", BENCHMARKS, False, paper, rows, first=["accuracy"])


def cells10(frame, defaults=None) -> pd.DataFrame:
    return _paired(frame, defaults, "oracle")


def table10_oracle(frame: pd.DataFrame, defaults=None) -> pd.DataFrame:
    """Table 10: EcoSpec's rule with oracle expert sets vs the learned predictor: α / T_verify / E."""
    cells = cells10(frame, defaults)
    metrics = ["alpha", "t_verify_s", "E"]
    table = _assemble(cells, ROW_KEYS, metrics, "Dataset", BENCHMARKS, False, _paper(10, _dataset_col), PAPER_KEYS)
    return with_intervals(table, cells, ROW_KEYS, metrics, False, (("oracle", "ecospec"),))


def cells11(frame, defaults=None) -> pd.DataFrame:
    return _swept(frame, defaults, "gamma")


def table11_12_gamma(frame: pd.DataFrame, defaults=None) -> pd.DataFrame:
    """Tables 11-12: speedup / α / E per verification budget γ and benchmark, and their average."""
    cells = cells11(frame, defaults).sort_values(
        ["_model_rank", "model", "temperature", "_role_rank", "label", "gamma"], kind="stable"
    )
    paper = pd.concat([_paper(11, _dataset_col), _paper(12, _dataset_col)], ignore_index=True)
    rows = [*ROW_KEYS, "gamma"]
    table = _assemble(cells, rows, SPD_ALPHA_E, "Dataset", BENCHMARKS, True, paper, [*PAPER_KEYS, "gamma"])
    return with_intervals(table, cells, rows, SPD_ALPHA_E, True, (("ecospec", "baseline"),))


def cells13(frame, defaults=None) -> pd.DataFrame:
    """The newest ok record of each model (where its config, hence the architecture, was read)."""
    ok = frame[frame["status"] == "ok"]
    return ok.sort_values("finished", kind="stable").drop_duplicates("model", keep="last")


def table13_models(costs: Mapping[str, ModelCost]) -> pd.DataFrame:
    """Table 13: architecture of each model, counted exactly from its HF config (`analysis.cost.model_cost`)."""
    cells = pd.DataFrame(
        [
            {
                "model": name,
                "layers": c.num_layers,
                "moe_layers": c.moe_layers,
                "num_experts": c.num_experts,
                "top_k": c.top_k,
                "expert_params_m": c.expert_params / 1e6,
                "total_params_b": c.total_params / 1e9,
                "active_params_b": c.active_params / 1e9,
                "storage": f"experts {c.storage['experts']}, dense {c.storage['dense']}",
            }
            for name, c in costs.items()
        ],
        columns=[
            "model",
            "layers",
            "moe_layers",
            "num_experts",
            "top_k",
            "expert_params_m",
            "total_params_b",
            "active_params_b",
            "storage",
        ],
    )
    cells = cells.sort_values("model").sort_values("model", key=lambda s: _rank(s, MODELS), kind="stable")
    metrics = ["layers", "moe_layers", "num_experts", "top_k", "expert_params_m", "total_params_b", "active_params_b"]
    table = _assemble(cells, ["model"], metrics, paper=_paper(13), on=["model"])
    table["storage"] = table["Model"].map(dict(zip(cells["model"].map(model_label), cells["storage"], strict=True)))
    table.loc[table["Source"] != "ours", "storage"] = None
    return table


# -- modeled GPU numbers -----------------------------------------------------------------------------------------


def cells_modeled(frame, defaults=None) -> pd.DataFrame:
    df = prepare(frame, defaults)
    return _newest(_at(df[df["standard"]]), ["model", "temperature", "role", "drafter", "dataset"])


def fit_overheads(frame: pd.DataFrame, costs: Mapping[str, ModelCost]) -> dict[tuple[str, str], tuple[float, int]]:
    """(model, GPU profile) -> (fixed per-pass overhead in s, records it was fitted on), from the ok B=1 records
    measured on that GPU (`analysis.cost.fit_overhead`). The fit is a mean of t_verify − bytes / bandwidth, linear
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
    each GPU profile (`analysis.cost.modeled_step`, the whole step costed; `profiles[(model, GPU)]`, fitted from the
    verify-latency benchmark, where given, else the datasheet bandwidth with the per-pass overhead fitted from that
    GPU's records or 0)."""
    agg = agg.copy()
    parts = [row_parts(*row) for row in zip(agg["model"], agg["drafter"], agg["depth"], agg["predictor"], strict=True)]
    for hw in HARDWARE:
        res = [
            _modeled_step(costs, m, a, e, hw, overheads, profiles, pt)
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
    conf/model `model` (`analysis.cost.step_parts`); None (drafting not costed, with a warning) where the shapes
    cannot be had offline."""
    if drafter is None or (isinstance(drafter, float) and np.isnan(drafter)):
        return StepParts()
    try:
        return step_parts(load_model_config(model), drafter, int(depth), bool(predictor))
    except (ValueError, KeyError, OSError, TypeError) as e:
        warnings.warn(f"model {model}: drafting and prediction not costed in the modeled numbers ({e})", stacklevel=2)
        return None


def _modeled_step(
    costs, model: str, alpha: float, experts: float, hw, overheads=None, profiles=None, parts: StepParts | None = None
) -> dict:
    """`modeled_step` (the whole step: verify, each draft pass, the predictor's pass) on the verify-latency
    benchmark's fitted profile of (model, GPU) where there is one, else on the datasheet bandwidth with the per-pass
    overhead fitted from that GPU's SD records (or 0)."""
    if (model, hw) in (profiles or {}):
        return modeled_step(costs[model], alpha, experts, profiles[(model, hw)], parts=parts)
    overhead = (overheads or {}).get((model, hw), (None, 0))[0] or 0.0
    return modeled_step(costs[model], alpha, experts, hw, overhead_s=overhead, parts=parts)


def cells_moespec(frame, defaults=None) -> pd.DataFrame:
    """The MoE-Spec table's cells: budgeted baseline / EcoSpec cells (method moespec / ecospec_moespec) at the main
    settings, and the unbudgeted standard baseline and EcoSpec on the same (model, T, benchmark) as references."""
    df = prepare(frame, defaults)
    df = _at(df[df["std_drafter"] & df["std_predictor"] & df["role"].isin(["baseline", "ecospec"])])
    capped = df[df["budgeted"]]
    keys = capped[["model", "temperature", "dataset"]].drop_duplicates()
    ref = df[df["standard"]].merge(keys, on=["model", "temperature", "dataset"])
    out = pd.concat([ref, capped], ignore_index=True)
    return _newest(out, ["model", "temperature", "role", "drafter", "dataset", "expert_budget", "budget_policy"])


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
    (`_modeled_step`, as the Modeled table), and quality vs AR: greedy (T = 0) the budget error rate, matches_ar
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
            _modeled_step(costs, m, a, e, hw, overheads, profiles, pt)["speedup"]
            if m in costs and a > 0 and pd.notna(e)
            else np.nan
            for m, a, e, pt in zip(agg["model"], agg["alpha"], agg["E"], parts, strict=True)
        ]
    agg["model"] = agg["model"].map(model_label)
    agg = agg.rename(columns=LABELS).dropna(axis=1, how="all")
    agg.insert(4, "Source", "ours")
    return agg


# -- the list of tables ------------------------------------------------------------------------------------------


@dataclass
class Table:
    """A built table: its frame, how to print it and the records it came from."""

    name: str  # file stem
    label: str  # "Table 1"
    title: str
    note: str
    frame: pd.DataFrame
    combine: bool  # print each group's metrics in one cell, "a / b / c"
    used: pd.DataFrame  # the records behind the cells


RATIO_NOTE = (
    " Ratio rows (Source ratio): the first method against the second on the prompts both decoded, a / b − 1 per "
    "metric with its 95 % paired-bootstrap interval over prompts (report/compare.py); ≈: within noise (the interval "
    "holds no change); Pairing: paired = decoded in one run, prompt by prompt (interleave=...), weakly paired = the "
    "same prompts in different jobs; records without per-prompt rows: no interval (said in Pairing)."
)


@dataclass(frozen=True)
class Spec:
    name: str
    label: str
    title: str
    note: str
    cells: Callable
    build: Callable
    combine: bool = False
    timed: bool = True  # shows wall-clock times or speedups (CPU caveat)


SPECS = [
    Spec(
        "table01_main",
        "Table 1",
        "Main results: speedup / α / E per model, benchmark and temperature",
        "Each cell: speedup vs AR [95 % interval] / α (tokens per step) / E (unique experts per MoE layer per verify "
        "pass); Avg = mean over the benchmarks every row of its model and T has (Benchmarks); baseline = the model's "
        "own drafter with confidence selection." + RATIO_NOTE,
        cells01,
        table01_main,
        combine=True,
    ),
    Spec(
        "table02_hbm",
        "Table 2",
        "Estimated HBM bytes read per verify pass",
        "E and the estimated weight bytes one verify pass reads (GB = 1e9 B, `analysis.cost.verify_hbm_bytes`), "
        "T=0, mean over the benchmarks named (the same for every row of a model). GPT-OSS: the paper counts every "
        "weight at 4 bits, we count the "
        "checkpoint's formats (bf16 attention and lm_head; see analysis/cost.py).",
        cells02,
        table02_hbm,
        timed=False,
    ),
    Spec(
        "table03_latency",
        "Table 3",
        "Latency breakdown per SD step",
        "Seconds per step (AR: per token) of predictor, drafting, verification and the whole step, E, α and "
        "speedup vs AR; T=0, mean over the benchmarks named (the same for every row of a model). The cost regime: "
        "T_draft / T_AR (AR's time per "
        "token) and T_pred / T_verify (the paper: one-layer head vs 94 target layers; predictor ~0.5 %).",
        cells03,
        table03_latency,
    ),
    Spec(
        "table04_ablation",
        "Table 4",
        "Ablation: static global cost vs EcoSpec's marginal cost",
        "Each cell: speedup [95 % interval] / α / E, on the benchmarks that have a global-cost record." + RATIO_NOTE,
        cells04,
        table04_ablation,
        combine=True,
    ),
    Spec(
        "table05_drafters",
        "Table 5",
        "GTO-trained heads alone and with EcoSpec",
        "Each cell: speedup / α; GTO = the model's EAGLE-3 head trained further with Group Tree Optimization "
        "(drafters/gto_train.py), with confidence selection and with EcoSpec, beside the model's own EAGLE-3 and "
        "EcoSpec on the same benchmarks.",
        cells05,
        table05_drafters,
        combine=True,
    ),
    Spec(
        "table06_07_batch",
        "Tables 6-7",
        "Batch-size scaling",
        "Each cell: speedup vs batched AR at the same B (the same batches) / E (unique experts per MoE layer over "
        "the whole batched verify pass, all sequences), mean over the benchmarks present; models with more than one "
        "B. EcoSpec (batch buffer): one expert buffer for the whole batch (beyond the paper).",
        cells06,
        table06_07_batch,
        combine=True,
    ),
    Spec(
        "table08_rho",
        "Table 8",
        "Verification cost by batch size: ρ = T_AR / T_verify",
        "Each cell: ρ (mean batched-AR step time / mean verify-pass time at the same B) / speedup vs batched AR; "
        "Largest B: ρ at the row's largest batch size. On the `mix` instances (drawn with a fixed seed from the "
        "benchmarks, as the paper's 100) where a model has them, else over the benchmarks present.",
        cells08,
        table08_rho,
        combine=True,
    ),
    Spec(
        "table09_predictor",
        "Table 9",
        "EcoSpec by predictor checkpoint (ordered by accuracy)",
        "Top-k routing accuracy of the checkpoint, then per benchmark: speedup / α / E; models with more than one "
        "checkpoint.",
        cells09,
        table09_predictor,
        combine=True,
    ),
    Spec(
        "table10_oracle",
        "Table 10",
        "Oracle expert sets vs the learned predictor",
        "Each cell: α / T_verify (s) / E under EcoSpec's selection rule; the oracle's router look-ups are not "
        "timed; on the benchmarks that have an oracle record." + RATIO_NOTE,
        cells10,
        table10_oracle,
        combine=True,
    ),
    Spec(
        "table11_12_gamma",
        "Tables 11-12",
        "Verification budget γ",
        "Each cell: speedup [95 % interval] / α / E; Avg = mean over the benchmarks every row of its model and T has "
        "(Benchmarks); models with more than one γ." + RATIO_NOTE,
        cells11,
        table11_12_gamma,
        combine=True,
    ),
]


def sweeps(used: pd.DataFrame) -> str:
    """`table1 (84), tiny_repro (28)`: the experiments a set of records came from, with counts."""
    counts = used["experiment"].fillna("?").value_counts(sort=False).sort_index()
    return ", ".join(f"{name} ({n})" for name, n in counts.items()) or "none"


def _clock(used: pd.DataFrame) -> str:
    """What the timings ran on, with a caveat for the models timed on a CPU."""
    cpu = used["device"].fillna("").str.startswith("cpu").to_numpy()
    names = lambda rows, col: ", ".join(sorted(map(str, rows[col].dropna().unique())))  # noqa: E731
    out = ""
    if cpu.any():
        models = names(used[cpu].assign(m=used.loc[cpu, "model"].map(model_label)), "m")
        clocks = used.loc[cpu, "clock"] if "clock" in used else pd.Series("wall", index=used.index[cpu])
        kinds = {"thread_cpu": "the decoding thread's CPU time"}
        said = " and ".join(sorted({kinds.get(c, "CPU wall clock") for c in clocks.fillna("wall")}))
        out += (
            f" Times and speedups of {models} are {said} ({names(used[cpu], 'hardware')}), not GPU numbers "
            "(modeled GPU numbers: modeled.md)."
        )
    if (~cpu).any() and names(used[~cpu], "hardware"):
        out += f" {'Others m' if cpu.any() else 'M'}easured on {names(used[~cpu], 'hardware')}."
    return out


def _note(spec_note: str, label: str, used: pd.DataFrame, out: pd.DataFrame, timed: bool, paper: str = "") -> str:
    note = f"{spec_note} From {len(used)} records (sweeps: {sweeps(used)})."
    if "Source" in out and (out["Source"] == "paper").any():
        note += paper or (
            f" paper rows: the EcoSpec paper's {label}, only the cells its text states (— elsewhere; "
            "src/ecospec/report/paper/README.md)."
        )
    return note + (_clock(used) if timed else "")


def build_tables(
    frame: pd.DataFrame,
    defaults: Mapping[str, dict] | None = None,
    costs: Mapping[str, ModelCost] | None = None,
    overheads: Mapping[tuple[str, str], tuple[float, int]] | None = None,
    profiles: Mapping[tuple[str, str], Hardware] | None = None,
) -> tuple[list[Table], list[str]]:
    """Every table that has cells in `frame`, and the labels of those that have none."""
    df = prepare(frame, defaults)
    tables, missing = [], []
    for s in SPECS:
        used = s.cells(df, defaults)
        out = s.build(df, defaults) if len(used) else None
        if out is None or out.empty:
            missing.append(s.label)
            continue
        paper = " paper rows: the EcoSpec paper's Table 3 (complete)." if s.name == "table03_latency" else ""
        tables.append(
            Table(s.name, s.label, s.title, _note(s.note, s.label, used, out, s.timed, paper), out, s.combine, used)
        )
    costs = dict(costs or {})
    if costs:
        used = cells13(frame)
        used = used[used["model"].isin(list(costs))]
        out = table13_models(costs)
        note = (
            "Counted exactly from each model's HF config (`analysis.cost.model_cost`); active = the dense part (both "
            "embedding tables) + top-k routed experts per MoE layer, so above the releases' own convention."
        )
        note = _note(note, "Table 13", used, out, timed=False)
        tables.append(Table("table13_models", "Table 13", "Model architectures", note, out, False, used))
    else:
        missing.append("Table 13")
    out = modeled(df, costs, overheads, defaults, profiles) if costs else None
    if out is not None and len(out):
        used = cells_modeled(df, defaults)
        used = used[used["model"].isin(list(costs))]
        title = f"GPU latency and speedup on {', '.join(HARDWARE)} (roofline model: *modeled*, not measured)"
        note = modeled_note(gammas_of(used), len(used), sweeps(used), overheads or {}, profiles or {})
        tables.append(Table("modeled", "Modeled", title, note, out, True, used))
    else:
        missing.append("Modeled")
    out = table_moespec(df, costs, overheads, defaults, profiles)
    if len(out):
        used = cells_moespec(df, defaults)
        note = (
            "Lossless EcoSpec against MoE-Spec's verify-time expert cap (lossy; engine.budget): per budget B (top-B "
            "experts per MoE layer by summed router score over the pass's tokens; — = no cap), measured speedup vs "
            "AR / α / E, mean over the benchmarks present; `modeled <GPU> speedup`: the roofline model "
            "(`analysis.cost.modeled_step`: verify, drafting and prediction costed) at that α and E, on the same GPU "
            "profiles as the Modeled table. Quality "
            "vs AR, from replaying each committed sequence "
            "once through the uncapped target (not timed): greedy, budget_error_rate = share of committed tokens "
            "the uncapped target would not have produced there, matches_ar = share of prompts identical to AR, "
            "first_divergence = mean first differing position (a prompt that never diverges counts its length); "
            "T > 0, the mean per-token log-likelihood of the committed tokens under the uncapped target beside AR's."
        )
        tables.append(
            Table(
                "moespec",
                "MoE-Spec",
                "Speedup against quality: EcoSpec and MoE-Spec's expert budget",
                _note(note, "MoE-Spec", used, out, timed=True),
                out,
                False,
                used,
            )
        )
    else:
        missing.append("MoE-Spec")
    return tables, missing


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
        "(`analysis.cost.modeled_step`: "
        "verify weight bytes / peak HBM bandwidth + a fixed per-pass overhead; T_draft+pred: each draft pass (a "
        "tree's depth of them) and the expert predictor's pass of the methods that call it, each its weight bytes / "
        "bandwidth + the same overhead, `analysis.cost.step_parts`: the release's head and predictor for the tiny "
        "model, conf/model facts for the paper's, EAGLE-3 heads derived from the target's facts where their shape "
        "is not at hand; selection not modeled; T_step = T_verify + T_draft + T_pred). "
        f"Per-pass overhead: {'; '.join(parts)}. From {records} records (sweeps: {sweeps_text})."
    )
