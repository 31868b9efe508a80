"""The EcoSpec paper's Tables 1-13 from the records frame: per table, which cells feed it (`cellsNN`, from
`frame.prepare`) and one pure builder (`tableNN_...`), frame in -> DataFrame out, laid out by `layout.assemble` with
the paper's values beside ours and, where a table compares methods, intervals and ratio rows (`compare`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import numpy as np
import pandas as pd

from ecospec.analysis.weight_bytes import ModelCost
from ecospec.methods import AR
from ecospec.report.compare import with_intervals
from ecospec.report.frame import (
    DATASETS,
    DRAFTERS,
    MODELS,
    ROLES,
    ROW_KEYS,
    at_main,
    model_label,
    newest,
    prepare,
    rank,
)
from ecospec.report.layout import assemble
from ecospec.report.lineup import BASE_ROLE, sweep
from ecospec.report.paper import paper_values

SPD_ALPHA_E = ["speedup", "alpha", "E"]


def _paper(table: int, col: Callable[[pd.DataFrame], pd.Series] | None = None) -> pd.DataFrame:
    """Paper values as `assemble` wants them: model, paper_method, temperature, col, metric, value. A blank
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
PAPER_KEYS = ["model", "temperature", "paper_method"]
MAIN_TABLE = "table1"  # the experiment whose methods are every table's standard rows (conf/experiment)


def _roles(experiment: str) -> list[str]:
    """The roles a table shows: those of the methods its experiment runs (`lineup.sweep`)."""
    return list(sweep(experiment).roles)


def cells01(frame, defaults=None) -> pd.DataFrame:
    df = prepare(frame, defaults)
    df = at_main(df[df["standard"] & df["role"].isin(_roles(MAIN_TABLE))])
    return newest(df, ["model", "temperature", "role", "drafter", "dataset"])


def table01_main(frame: pd.DataFrame, defaults=None) -> pd.DataFrame:
    """Table 1: speedup / α / E per model × T × method (baseline, EcoSpec) × benchmark, and their average."""
    cells = cells01(frame, defaults)
    table = assemble(cells, ROW_KEYS, SPD_ALPHA_E, "Dataset", BENCHMARKS, True, _paper(1, _dataset_col), PAPER_KEYS)
    return with_intervals(table, cells, ROW_KEYS, SPD_ALPHA_E, True, sweep(MAIN_TABLE).pairs)


def _greedy(frame, defaults=None) -> pd.DataFrame:
    """AR, baseline and EcoSpec cells at T=0 (Tables 2-3)."""
    df = prepare(frame, defaults)
    df = at_main(df[df["standard"] & df["role"].isin([AR, *_roles(MAIN_TABLE)])], temperature=0.0)
    return newest(df, ["model", "role", "drafter", "dataset"])


cells02 = cells03 = _greedy


def table02_hbm(frame: pd.DataFrame, defaults=None) -> pd.DataFrame:
    """Table 2: estimated HBM bytes per verify pass (GB) and E, T=0, mean over the benchmarks present."""
    return assemble(
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
    return assemble(cells, ["model", "label"], metrics, paper=_paper(3), on=["model", "paper_method"])


def _paired(frame, defaults, experiment: str) -> pd.DataFrame:
    """Standard cells of the roles `experiment` runs (the ablation or the oracle, and EcoSpec), at each (model, T,
    benchmark) where every one of them ran."""
    roles = _roles(experiment)
    df = prepare(frame, defaults)
    df = at_main(df[df["standard"] & df["role"].isin(roles)])
    df = newest(df, ["model", "temperature", "role", "drafter", "dataset"])
    every = df.groupby(["model", "temperature", "dataset"])["role"].transform("nunique") == len(roles)
    return df[every]


def cells04(frame, defaults=None) -> pd.DataFrame:
    return _paired(frame, defaults, "table4")


def table04_ablation(frame: pd.DataFrame, defaults=None) -> pd.DataFrame:
    """Table 4: the static global-cost variant vs EcoSpec's marginal cost: speedup / α / E per benchmark."""
    cells = cells04(frame, defaults)
    table = assemble(cells, ROW_KEYS, SPD_ALPHA_E, "Dataset", BENCHMARKS, False, _paper(4, _dataset_col), PAPER_KEYS)
    return with_intervals(table, cells, ROW_KEYS, SPD_ALPHA_E, False, sweep("table4").pairs)


def cells05(frame, defaults=None) -> pd.DataFrame:
    """Table 5's cells: the GTO-trained head (drafter `gto`), and any other non-standard drafter checkpoint, alone
    (confidence) and with EcoSpec, beside the model's own baseline and EcoSpec where those ran too."""
    df = prepare(frame, defaults)
    other = ~df["std_drafter"]
    df = at_main(df[df["std_predictor"] & ~df["budgeted"] & df["role"].isin(_roles("table5"))])
    have = df[other.reindex(df.index, fill_value=False)]
    keys = have[["model", "temperature", "dataset"]].drop_duplicates()
    base = df[df["standard"]].merge(keys, on=["model", "temperature", "dataset"])
    out = pd.concat([base, have], ignore_index=True)
    return newest(out, ["model", "temperature", "drafter", "drafter_path", "role", "dataset"])


def table05_drafters(frame: pd.DataFrame, defaults=None) -> pd.DataFrame:
    """Table 5: the GTO-trained head (and other drafter checkpoints) alone and with EcoSpec, beside the model's own
    baseline and EcoSpec: speedup / α per benchmark."""
    cells = cells05(frame, defaults).copy()
    drafter = cells["drafter"].map(lambda k: DRAFTERS.get(k, k))
    own = cells["standard"]
    base = cells["role"] == BASE_ROLE
    cells["label"] = cells["label"].where(own | base, drafter + " + " + cells["role"].map(ROLES))
    cells["_rank"] = (~own).astype(int) * 2 + (~base).astype(int)
    cells = cells.sort_values(["_model_rank", "model", "temperature", "_rank"], kind="stable")
    rows = ["model", "temperature", "label"]
    # the paper's Table 5 methods are gto and gto_ecospec (its text states no cell of it: report/paper/README.md)
    mine = cells["drafter"].where(base, cells["drafter"] + "_" + cells["role"])
    cells["paper_method"] = cells["paper_method"].where(own, mine)
    paper = _paper(5, _dataset_col)
    return assemble(cells, rows, ["speedup", "alpha"], "Dataset", BENCHMARKS, True, paper, PAPER_KEYS)


def _swept(frame, defaults, axis: str, experiment: str) -> pd.DataFrame:
    """Standard cells of the roles `experiment` runs with `axis` free, of the (model, T) that have more than one
    value of it."""
    df = prepare(frame, defaults)
    df = at_main(df[df["standard"] & df["role"].isin(_roles(experiment))], **{axis: None})
    df = newest(df, ["model", "temperature", "role", "drafter", "dataset", "batch_buffer", axis])
    return df[df.groupby(["model", "temperature"])[axis].transform("nunique") > 1]


def cells06(frame, defaults=None) -> pd.DataFrame:
    return _swept(frame, defaults, "batch_size", "table6_7")


def table06_07_batch(frame: pd.DataFrame, defaults=None) -> pd.DataFrame:
    """Tables 6-7: speedup / E by batch size B, each the mean over the benchmarks present."""
    cells = cells06(frame, defaults).sort_values("batch_size", kind="stable").copy()
    cells = cells.sort_values(["_model_rank", "model", "temperature", "_role_rank", "label"], kind="stable")
    cells["B"] = _b(cells["batch_size"])
    paper = pd.concat([_paper(6), _paper(7)], ignore_index=True)
    paper = paper[paper["dataset"] == "avg"].assign(col=lambda p: _b(p["batch_size"]))
    groups = sorted(set(cells["B"]) | set(paper["col"]), key=lambda b: int(b[2:]))
    return assemble(cells, ROW_KEYS, ["speedup", "E"], "B", groups, False, paper, PAPER_KEYS)


def cells08(frame, defaults=None) -> pd.DataFrame:
    """Table 8's cells: per model its `mix` cells (the paper's instances drawn from the seven benchmarks) where it
    has any, else every benchmark's, at every batch size."""
    df = prepare(frame, defaults)
    df = at_main(df[df["standard"] & df["role"].isin(_roles("table8"))], mix=True, batch_size=None)
    mixed = set(df.loc[df["dataset"] == "mix", "model"])
    df = df[(df["dataset"] == "mix") | ~df["model"].isin(mixed)]
    return newest(df, ["model", "temperature", "role", "drafter", "dataset", "batch_buffer", "batch_size"])


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
    table = assemble(agg, ROW_KEYS, ["rho", "speedup"], "B", groups, False, paper, PAPER_KEYS)
    return table.drop(columns=["Largest B speedup"], errors="ignore")


def cells09(frame, defaults=None) -> pd.DataFrame:
    df = prepare(frame, defaults)
    df = at_main(df[df["std_drafter"] & ~df["budgeted"] & df["role"].isin(_roles("table9"))])
    df = newest(df, ["model", "temperature", "predictor_checkpoint", "dataset"])
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
    return assemble(cells, rows, SPD_ALPHA_E, "Dataset", BENCHMARKS, False, paper, rows, first=["accuracy"])


def cells10(frame, defaults=None) -> pd.DataFrame:
    return _paired(frame, defaults, "table10")


def table10_oracle(frame: pd.DataFrame, defaults=None) -> pd.DataFrame:
    """Table 10: EcoSpec's rule with oracle expert sets vs the learned predictor: α / T_verify / E."""
    cells = cells10(frame, defaults)
    metrics = ["alpha", "t_verify_s", "E"]
    table = assemble(cells, ROW_KEYS, metrics, "Dataset", BENCHMARKS, False, _paper(10, _dataset_col), PAPER_KEYS)
    return with_intervals(table, cells, ROW_KEYS, metrics, False, sweep("table10").pairs)


def cells11(frame, defaults=None) -> pd.DataFrame:
    return _swept(frame, defaults, "gamma", "table11_12")


def table11_12_gamma(frame: pd.DataFrame, defaults=None) -> pd.DataFrame:
    """Tables 11-12: speedup / α / E per verification budget γ and benchmark, and their average."""
    cells = cells11(frame, defaults).sort_values(
        ["_model_rank", "model", "temperature", "_role_rank", "label", "gamma"], kind="stable"
    )
    paper = pd.concat([_paper(11, _dataset_col), _paper(12, _dataset_col)], ignore_index=True)
    rows = [*ROW_KEYS, "gamma"]
    table = assemble(cells, rows, SPD_ALPHA_E, "Dataset", BENCHMARKS, True, paper, [*PAPER_KEYS, "gamma"])
    return with_intervals(table, cells, rows, SPD_ALPHA_E, True, sweep("table11_12").pairs)


def cells13(frame, defaults=None) -> pd.DataFrame:
    """The newest ok record of each model (where its config, hence the architecture, was read)."""
    ok = frame[frame["status"] == "ok"]
    return ok.sort_values("finished", kind="stable").drop_duplicates("model", keep="last")


def table13_models(costs: Mapping[str, ModelCost]) -> pd.DataFrame:
    """Table 13: architecture of each model, counted exactly from its HF config (`analysis.weight_bytes.model_cost`)."""
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
    cells = cells.sort_values("model").sort_values("model", key=lambda s: rank(s, MODELS), kind="stable")
    metrics = ["layers", "moe_layers", "num_experts", "top_k", "expert_params_m", "total_params_b", "active_params_b"]
    table = assemble(cells, ["model"], metrics, paper=_paper(13), on=["model"])
    table["storage"] = table["Model"].map(dict(zip(cells["model"].map(model_label), cells["storage"], strict=True)))
    table.loc[table["Source"] != "ours", "storage"] = None
    return table
