"""The records frame (`records.py`) made ready for the tables: which records feed a table and the vocabulary the
tables print (models, benchmarks, methods, label columns).

Which records feed a table: status ok, the held-out split where a model has it (the paper's protocol), the paper's
main settings (`MAIN`: each model's own γ, `model.gamma`, the paper's 4 unless experiment=gamma_protocol chose
another; depth 3, top-2, B=1) except the axis the table sweeps, and each model's standard drafter and predictor
checkpoints (conf/model; Table 5 takes the other drafter checkpoints, Table 9 every predictor checkpoint). When
several records fit one cell (reruns), the newest is taken. The "baseline" is the model's own SD baseline:
confidence selection with its drafter, labelled by the drafter (EAGLE-3, or MTP for DeepSeek), whatever the method
was called.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import pandas as pd

from ecospec.drafters.registry import kinds as drafter_kinds
from ecospec.drafters.registry import labels as drafter_labels
from ecospec.methods import AR, methods
from ecospec.report.lineup import BASE_ROLE, budgeted

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
BUFFERED_ROLES = [m.role for m in methods() if m.buffered]  # a batch may share their expert buffer
VARIANT_DRAFTERS = [k.name for k in drafter_kinds() if not k.standard]  # never a model's standard drafter
BUDGET = "MoE-Spec"  # the expert cap's name (engine.budget): a budgeted method's label
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
ROW_KEYS = ["model", "temperature", "label"]  # a method's row of a table
GROUP = ("model", "temperature")  # rows set side by side: a model at one T (their averages take the same benchmarks)


def model_label(name: str) -> str:
    return MODELS.get(name, name)


def rank(values: pd.Series, order) -> pd.Series:
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
    df["role"] = df["selector"].map(SELECTOR_ROLES).where(df["drafter"].notna(), AR)
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
    df["std_drafter"] = (same_path | df["drafter"].isna()) & ~df["drafter"].isin(VARIANT_DRAFTERS)
    df["std_predictor"] = same_pred
    # MoE-Spec's expert cap (lossy) makes a cell the MoE-Spec table's own, never a standard one
    budget = df["expert_budget"] if "expert_budget" in df else pd.Series(np.nan, index=df.index)
    df["budgeted"] = budget.notna()
    df["standard"] = df["std_drafter"] & df["std_predictor"] & ~df["budgeted"]
    drafter = df["drafter"].map(lambda k: DRAFTERS.get(k, k))
    base = df["role"] == BASE_ROLE
    df["label"] = df["role"].map(ROLES).where(~base, drafter)
    other = ~base & (df["role"] != AR) & df["drafter"].notna() & (df["drafter"] != df["_default_drafter"])
    df.loc[other, "label"] = df["label"] + " (" + drafter + ")"
    df["paper_method"] = df["role"].where(~base, df["drafter"])
    # beyond the paper: one expert buffer for the whole batch (B > 1); its own row, no paper value beside it
    shared = df["batch_buffer"].fillna("sequence").eq("batch") & df["role"].isin(BUFFERED_ROLES)
    df.loc[shared, "label"] = df["label"] + " (batch buffer)"
    df.loc[shared, "paper_method"] = df["role"] + "_batch_buffer"
    capped_as = budgeted()  # role -> the budgeted method of that role, as the paper's CSVs name it
    capped = df["budgeted"] & df["role"].isin(list(capped_as))
    df.loc[capped, "label"] = np.where(base[capped], BUDGET, df.loc[capped, "role"].map(ROLES) + " + " + BUDGET)
    df.loc[capped, "paper_method"] = df["role"].map(capped_as)
    policy = df["budget_policy"] if "budget_policy" in df else pd.Series(None, index=df.index, dtype=object)
    subst = capped & policy.eq("substitute")
    df.loc[subst, "label"] = df["label"] + " (substitute)"
    df["_model_rank"] = rank(df["model"], MODELS)
    df["_role_rank"] = rank(df["role"], ROLES)
    df["Dataset"] = df["dataset"].map(lambda k: DATASETS.get(k, k))
    df["hbm_gb"] = df["hbm_bytes_per_verify"] / 1e9
    df = df.drop(columns=["_default_drafter", "_predictor", "_path"])
    return df.sort_values(["_model_rank", "model", "temperature", "_role_rank", "label", "finished"], kind="stable")


def newest(df: pd.DataFrame, keys: list[str]) -> pd.DataFrame:
    """One record per cell: the newest (df is sorted by finished within equal keys by `prepare`)."""
    return df.drop_duplicates(keys, keep="last")


def at_main(df: pd.DataFrame, mix: bool = False, **settings) -> pd.DataFrame:
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


# -- what a set of records is ---------------------------------------------------------------------------------


def sweeps(used: pd.DataFrame) -> str:
    """`table1 (84), tiny_repro (28)`: the experiments a set of records came from, with counts."""
    counts = used["experiment"].fillna("?").value_counts(sort=False).sort_index()
    return ", ".join(f"{name} ({n})" for name, n in counts.items()) or "none"


def clock(used: pd.DataFrame) -> str:
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
