"""The overlap paper's analyses as report tables: routing overlap (its Tables 2/13, 17-18, 19, 3/20), acceptance
vs routing (Tables 14-15, 16) and target efficiency (Tables 1, 10, 11), with the paper's values beside ours.

Routing data per model, each row saying which it used (`Data`): `routing_data.py`.
Statistics (`analysis.overlap`): overlap at step distance 1-4, its uniform (k/N) and independence baselines,
per-layer step-1 overlap, unique experts in 4-token windows (the paper's K = 3 drafts + root) and their IPF
predictions (`analysis.ipf`; uniform and skewed = measured per-expert loads; "—" where the measured overlaps are
infeasible for IPF). The acceptance tables: `routing_acceptance.py`; target efficiency: `target_efficiency.py`;
the paper's rows beside ours: `overlap_paper.py`; figures: `routing_figures.py`. `build_routing` builds them all.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import numpy as np
import pandas as pd

from ecospec.analysis.weight_bytes import ModelCost
from ecospec.report.frame import model_label, prepare, sweeps
from ecospec.report.overlap_paper import PAPER_DATA, beside_paper, paper_model, paper_rows
from ecospec.report.routing_acceptance import acceptance_table, heldout_table, traced_cells
from ecospec.report.routing_data import CORPUS, MAX_DISTANCE, RoutingData, collect, data_label
from ecospec.report.routing_figures import write_routing_figures
from ecospec.report.target_efficiency import te_paper_table, te_table
from ecospec.report.write import Table

TABLE_NAMES = (
    "overlap_te_paper",
    "overlap_te",
    "overlap_step1",
    "overlap_distance",
    "overlap_layers",
    "overlap_unique",
    "overlap_acceptance",
    "overlap_heldout",
)


# -- routing tables ----------------------------------------------------------------------------------------------


def _step1_row(stats) -> dict:
    return {
        "Uniform overlap": stats.uniform,
        "Independence overlap": stats.independence,
        "Empirical overlap": float(stats.overlap[0]),
        "Temporal overlap": stats.temporal,
        "Temporal share": 100 * stats.temporal_share,
        "Tokens n": stats.tokens,
    }


def step1_table(data: RoutingData) -> pd.DataFrame:
    """Tables 2/13: step-1 overlap, its uniform (= k/N) and independence baselines, temporal = empirical −
    independence and its share of the empirical overlap."""
    ours = pd.DataFrame(
        [
            {"Model": model_label(s.model), "Data": data_label(s), "Source": "ours", **_step1_row(s.stats.all)}
            for s in data.sources
        ]
    )
    metrics = {
        "overlap_uniform": "Uniform overlap",
        "overlap_independence": "Independence overlap",
        "overlap_d1": "Empirical overlap",
        "overlap_temporal": "Temporal overlap",
        "temporal_share": "Temporal share",
    }
    p13 = paper_rows(13, metrics, ["model"], lambda r: {"Model": paper_model(r), "Data": "paper Table 13"})
    p2 = paper_rows(2, metrics, ["model"], lambda r: {"Model": paper_model(r), "Data": "paper Table 2"})
    paper = pd.concat([p13, p2[~p2["Model"].isin(p13["Model"])]], ignore_index=True)
    return beside_paper(ours, paper, data.models(), ["Model", "Data", "Source"])


def _distance_row(overlap, independence, tokens) -> dict:
    row = {f"Step {d} overlap": float(overlap[d - 1]) for d in range(1, MAX_DISTANCE + 1)}
    return {**row, "Independence overlap": float(independence), "Tokens n": tokens}


def distance_table(data: RoutingData) -> pd.DataFrame:
    """Tables 17-18: overlap by step distance, pooled and per data slice, with the slices' mean, min and max."""
    rows = []
    for s in data.sources:
        base = {"Model": model_label(s.model), "Source": "ours"}
        a = s.stats.all
        rows.append({**base, "Data": data_label(s), **_distance_row(a.overlap, a.independence, a.tokens)})
        if s.data != CORPUS and len(s.stats.slices) > 1:
            for name, st in s.stats.slices.items():
                rows.append(
                    {**base, "Data": data_label(s, name), **_distance_row(st.overlap, st.independence, st.tokens)}
                )
            overlap, indep = s.stats.spread("overlap"), s.stats.spread("independence")
            for what in ("mean", "min", "max"):
                cells = _distance_row(getattr(overlap, what), getattr(indep, what), np.nan)
                rows.append({**base, "Data": data_label(s, f"slice {what}"), **cells})
    metrics = {f"overlap_d{d}": f"Step {d} overlap" for d in range(1, MAX_DISTANCE + 1)}
    metrics["overlap_independence"] = "Independence overlap"
    p17 = paper_rows(17, metrics, ["model"], lambda r: {"Model": paper_model(r), "Data": "paper Table 17"})
    p18 = paper_rows(
        18,
        metrics,
        ["model", "dataset", "setting"],
        lambda r: {
            "Model": paper_model(r),
            "Data": f"paper Table 18: {PAPER_DATA.get(r['dataset'], r['dataset'])}"
            + (f" {r['setting']}" if r["setting"] else ""),
        },
    )
    return beside_paper(
        pd.DataFrame(rows), pd.concat([p17, p18], ignore_index=True), data.models(), ["Model", "Data", "Source"]
    )


def layers_table(data: RoutingData) -> pd.DataFrame:
    """Table 19: step-1 overlap of every MoE layer against that layer's independence baseline."""
    rows = []
    for s in data.sources:
        a = s.stats.all
        for layer, (ov, ind) in enumerate(zip(a.layer_overlap, a.layer_independence, strict=True)):
            rows.append(
                {
                    "Model": model_label(s.model),
                    "Data": data_label(s),
                    "Layer": layer,
                    "Source": "ours",
                    "Step 1 overlap": float(ov),
                    "Independence overlap": float(ind),
                    "Empirical/independence ratio": float(ov / ind) if ind > 0 else np.nan,
                }
            )
    paper = paper_rows(
        19,
        {"layer_overlap": "Step 1 overlap", "layer_independence": "Independence overlap"},
        ["model", "setting"],
        lambda r: {"Model": paper_model(r), "Data": "paper Table 19", "Layer": int(r["setting"].split("=")[1])},
    )
    paper["Empirical/independence ratio"] = paper["Step 1 overlap"] / paper["Independence overlap"]
    return beside_paper(pd.DataFrame(rows), paper, data.models(), ["Model", "Data", "Layer", "Source"])


def _err(pred: float, emp: float) -> float:
    return 100 * (pred - emp) / emp if emp > 0 else np.nan


def unique_table(data: RoutingData) -> pd.DataFrame:
    """Tables 3/20: unique experts per MoE layer in a 4-token window (uniform, independence, empirical, empirical
    / k) and the IPF predictions from the measured overlaps at distance 1-3, with their errors vs empirical."""
    rows = []
    for s in data.sources:
        a = s.stats.all
        rows.append(
            {
                "Model": model_label(s.model),
                "Data": data_label(s),
                "Source": "ours",
                "top_k": a.k,
                "num_experts": a.n_experts,
                "Uniform experts": a.unique_uniform,
                "Independence experts": a.unique_independence,
                "Empirical experts": a.unique_empirical,
                "Empirical/k ratio": a.unique_ratio,
                "Uniform-IPF experts": s.ipf_uniform,
                "Uniform-IPF err": _err(s.ipf_uniform, a.unique_empirical),
                "Skewed-IPF experts": s.ipf_skewed,
                "Skewed-IPF err": _err(s.ipf_skewed, a.unique_empirical),
            }
        )
    metrics = {
        "top_k": "top_k",
        "num_experts": "num_experts",
        "unique_uniform": "Uniform experts",
        "unique_independence": "Independence experts",
        "unique_empirical": "Empirical experts",
        "unique_ratio": "Empirical/k ratio",
        "unique_ipf_uniform": "Uniform-IPF experts",
        "ipf_uniform_err": "Uniform-IPF err",
        "unique_ipf_skewed": "Skewed-IPF experts",
        "ipf_skewed_err": "Skewed-IPF err",
    }
    p20 = paper_rows(20, metrics, ["model"], lambda r: {"Model": paper_model(r), "Data": "paper Table 20"})
    p3 = paper_rows(3, metrics, ["model"], lambda r: {"Model": paper_model(r), "Data": "paper Table 3"})
    paper = pd.concat([p20, p3[~p3["Model"].isin(p20["Model"])]], ignore_index=True)
    return beside_paper(pd.DataFrame(rows), paper, data.models(), ["Model", "Data", "Source"])


# -- the list of tables ------------------------------------------------------------------------------------------


def _records(used: pd.DataFrame) -> pd.DataFrame:
    return used if len(used) else pd.DataFrame({"experiment": [], "finished": []})


def _note(text: str, used: pd.DataFrame, paper: str) -> str:
    return f"{text} From {len(used)} records (sweeps: {sweeps(used)}). paper rows: {paper}"


def build_routing_tables(
    frame: pd.DataFrame,
    data: RoutingData,
    costs: Mapping[str, ModelCost] | None = None,
    defaults=None,
) -> tuple[list[Table], list[str]]:
    """The overlap paper's tables that have data, and the labels of those that have none."""
    tables, missing = [], []
    frame = prepare(frame, defaults)  # once: the builders below take the prepared frame as it is
    te_paper = te_paper_table()
    tables.append(
        Table(
            "overlap_te_paper",
            "Overlap Tables 1, 11",
            "The overlap paper's predicted TE from its own inputs",
            "TE = (C_dense + k C_expert) / (C_dense + unique C_expert) per GPU and layer (Table 1; its C_dense is one "
            "layer's attention weights), and Table 11's corrections TE = 1 / ((1 - MoE share) x non-MoE scale + MoE "
            "share x MoE scale), applied cumulatively; the rounded inputs printed in the paper give its TE to "
            "0.001. Nothing here is measured by us.",
            te_paper,
            False,
            _records(pd.DataFrame()),
        )
    )
    te, used = te_table(frame, costs or {}, defaults)
    if len(te) and (te["Source"] == "ours").any():
        tables.append(
            Table(
                "overlap_te",
                "Overlap Tables 1, 10",
                "Target efficiency: measured vs predicted by activated-expert bytes",
                _note(
                    "Measured TE = T_step(AR) / T_verify(SD) at the same batch size B (the record's ar_t_step_s / "
                    "t_verify_s); predicted TE = bytes of an AR pass / bytes of the verify pass = "
                    "(C_dense + k C_expert) / (C_dense + E C_expert) with the measured E (at B > 1 AR's measured E "
                    "instead of k), C_expert = "
                    "one routed expert's stored bytes and C_dense = every non-expert byte a pass reads per MoE layer "
                    "(analysis.weight_bytes: attention, dense and shared MLPs, norms, routers, lm_head; the "
                    "paper's C_dense is "
                    "attention only); gap = measured - predicted. gamma = 4 (K = 3), standard drafter.",
                    used,
                    "the overlap paper's Tables 1 and 10 (its models, H100; E = its unique_sd). Times of tiny "
                    "models are CPU wall clock.",
                ),
                te,
                False,
                used,
            )
        )
    else:
        missing.append("Overlap Tables 1, 10")
    if data.sources:
        used = pd.concat([s.used for s in data.sources]).drop_duplicates("path")
        src = (
            "Data says where the routes come from: the committed sequences of traced SD records (pooled; "
            "datasets are the slices) or the tiny model's build traces (corpus windows)."
        )
        for name, label, title, text, build, paper in (
            (
                "overlap_step1",
                "Overlap Tables 2, 13",
                "Step-1 expert overlap decomposition",
                "Overlap = mean over MoE layers of the experts tokens t and t+1 share / k; uniform = k/N; "
                "independence = sum of squared per-token expert probabilities / k; temporal = empirical - "
                "independence; share = temporal / empirical.",
                step1_table,
                "Table 13 (and Kimi-K2.5 from Table 2).",
            ),
            (
                "overlap_distance",
                "Overlap Tables 17, 18",
                "Overlap by step distance, pooled and across data slices",
                "Overlap of tokens d = 1..4 apart with the independence baseline; per dataset and the slices' mean / "
                "min / max (Table 18's spread).",
                distance_table,
                "Table 17; Table 18 (Qwen3-30B; its Verify ratio column is not computed here).",
            ),
            (
                "overlap_layers",
                "Overlap Table 19",
                "Per-layer step-1 overlap vs independence",
                "Step-1 overlap of each MoE layer, its independence baseline and their ratio.",
                layers_table,
                "Table 19's representative layers.",
            ),
            (
                "overlap_unique",
                "Overlap Tables 3, 20",
                "Unique experts in a 4-token window and the IPF prediction",
                "Unique experts per MoE layer over 4 consecutive tokens (K = 3 drafts + root): uniform N(1-(1-k/N)^4), "
                "independence, empirical, empirical / k; maximum-entropy IPF predictions from the overlaps at "
                "distance 1-3 with uniform or the measured (skewed) expert loads; err = (IPF - empirical) / "
                "empirical.",
                unique_table,
                "Table 20 (and Kimi-K2.5 from Table 3).",
            ),
        ):
            tables.append(Table(name, label, title, _note(f"{text} {src}", used, paper), build(data), False, used))
    else:
        missing += ["Overlap Tables 2, 13", "Overlap Tables 17, 18", "Overlap Table 19", "Overlap Tables 3, 20"]
    if data.tokens:
        used = traced_cells(data, frame, defaults)
        tables.append(
            Table(
                "overlap_acceptance",
                "Overlap Tables 14, 15",
                "Accepted vs first-rejected draft tokens: routing overlap",
                _note(
                    "Per draft depth (deconfounded): consecutive overlap (token vs its parent) of accepted tokens and "
                    "of first-rejected ones (not accepted, parent accepted or the root); delta = accepted - rejected "
                    "(negative: rejected tokens overlap more), Cohen's d (pooled SD), Welch's two-sided p, Cohen's "
                    "size label; anchor = overlap with the root (depth 0 -> j, Figure 9). From the traced verify "
                    "passes.",
                    used,
                    "the overlap paper's Tables 14 and 15 (Size derived from its d).",
                ),
                acceptance_table(data, frame, defaults),
                False,
                used,
            )
        )
        tables.append(
            Table(
                "overlap_heldout",
                "Overlap Table 16",
                "Held-out deconfounded routing summary",
                _note(
                    "Median across datasets (the held-out slices) of each depth's delta (accepted - first-rejected "
                    "consecutive overlap) and of the anchor drop (mean consecutive - anchor overlap of the compared "
                    "tokens at depth >= 2; analysis/acceptance.py); 'pooled' = the same over all the row's tokens.",
                    used,
                    "the overlap paper's Table 16 (medians over its Spec-Bench and Aya slices).",
                ),
                heldout_table(data, frame, defaults),
                False,
                used,
            )
        )
    else:
        missing += ["Overlap Tables 14, 15", "Overlap Table 16"]
    return tables, missing


def build_routing(
    frame: pd.DataFrame,
    model_configs: Mapping[str, Mapping],
    costs: Mapping[str, ModelCost] | None,
    figures_dir: Path,
    defaults=None,
) -> tuple[list[Table], list[str], list]:
    """Tables and figures of the overlap paper's analyses (figures drawn here, in the calling process)."""
    data = collect(frame, model_configs)
    tables, missing = build_routing_tables(frame, data, costs, defaults)
    figures = write_routing_figures(data, figures_dir)
    return tables, missing, figures
