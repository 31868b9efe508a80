"""The overlap paper's acceptance-vs-routing tables (its Tables 14-15 and 16): the routing overlap of accepted and
first-rejected draft tokens by depth, and the held-out deconfounded summary, from the drafted tokens of every traced
SD record (`analysis.acceptance`), grouped by model, T and method.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from ecospec.analysis.acceptance import anchor_drop, compare_by_depth, held_out
from ecospec.analysis.stats import size_label
from ecospec.analysis.traces import DraftTokens
from ecospec.report.frame import model_label, prepare
from ecospec.report.overlap_paper import PAPER_DATA, PAPER_METHODS, beside_paper, paper_model, paper_rows
from ecospec.report.paper import overlap_paper_values
from ecospec.report.routing_data import RoutingData


def traced_cells(data: RoutingData, frame: pd.DataFrame, defaults=None) -> pd.DataFrame:
    """The traced records with the tables' method label (frame.prepare), in the tables' order."""
    if data.traced.empty:
        return data.traced
    df = prepare(frame, defaults)
    return df[df["path"].isin(list(data.tokens))]


def _group_tokens(data: RoutingData, rows: pd.DataFrame) -> DraftTokens:
    return DraftTokens.concat(data.tokens[p] for p in rows["path"])


def acceptance_table(data: RoutingData, frame: pd.DataFrame, defaults=None) -> pd.DataFrame:
    """Tables 14-15 (and Figure 9's anchor overlap): per model, T, method and draft depth, the consecutive
    overlap of accepted vs first-rejected tokens (Δ = accepted − rejected, Cohen's d, Welch's p, size), and their
    anchor overlap with the root."""
    rows = []
    labelled = traced_cells(data, frame, defaults)
    for (model, t, label), g in labelled.groupby(["model", "temperature", "label"], sort=False):
        for c in compare_by_depth(_group_tokens(data, g)):
            con, anc = c.consecutive, c.anchor
            rows.append(
                {
                    "Model": model_label(model),
                    "T": t,
                    "Method": label,
                    "Depth": c.depth,
                    "Source": "ours",
                    "Accepted overlap": c.overlap_accepted,
                    "1st-rejected overlap": c.overlap_first_rejected,
                    "Consecutive delta": con.delta if con else np.nan,
                    "Cohen d": con.cohen_d if con else np.nan,
                    "Welch p": con.p_value if con else np.nan,
                    "Size": con.size if con else None,
                    "Accepted n": c.n_accepted,
                    "1st-rejected n": c.n_first_rejected,
                    "Accepted anchor": c.anchor_accepted,
                    "1st-rejected anchor": c.anchor_first_rejected,
                    "Anchor delta": anc.delta if anc else np.nan,
                    "Anchor d": anc.cohen_d if anc else np.nan,
                }
            )
    metrics = {
        "overlap_accepted": "Accepted overlap",
        "overlap_first_rejected": "1st-rejected overlap",
        "n_first_rejected": "1st-rejected n",
    }

    def label(r):
        return {
            "Model": paper_model(r),
            "Method": PAPER_METHODS.get(r["method"], r["method"]),
            "Depth": int(r["setting"].split("=")[1]),
        }

    p14 = paper_rows(14, metrics, ["model", "setting"], label)
    p15 = paper_rows(
        15, {"delta": "Consecutive delta", "cohen_d": "Cohen d", "p_value": "Welch p"}, ["model", "setting"], label
    )
    paper = p14.merge(p15, on=["Model", "Method", "Depth", "Source"], how="outer")
    paper["Size"] = paper["Cohen d"].map(size_label)
    return beside_paper(
        pd.DataFrame(rows), paper, sorted(set(labelled["model"])), ["Model", "T", "Method", "Depth", "Source"]
    )


def heldout_table(data: RoutingData, frame: pd.DataFrame, defaults=None) -> pd.DataFrame:
    """Table 16: per model, T and method, the median across datasets (held-out slices) of Δ_j and of the anchor
    drop; "pooled" rows give the same over all the group's tokens."""
    rows = []
    labelled = traced_cells(data, frame, defaults)
    for (model, t, label), g in labelled.groupby(["model", "temperature", "label"], sort=False):
        by_slice = {ds: _group_tokens(data, rows_ds) for ds, rows_ds in g.groupby("dataset", sort=True)}
        summary = held_out(by_slice)
        base = {"Model": model_label(model), "T": t, "Method": label, "Source": "ours"}
        cells = {f"Depth {d} delta": v for d, v in summary.delta.items()}
        plural = "s" if summary.slices != 1 else ""
        rows.append(
            {
                **base,
                "Data": f"median over {summary.slices} dataset{plural}",
                **cells,
                "Anchor-drop delta": summary.anchor_drop,
            }
        )
        everything = DraftTokens.concat(by_slice.values())
        pooled_cells = {
            f"Depth {c.depth} delta": c.consecutive.delta
            for c in compare_by_depth(everything)
            if c.consecutive is not None
        }
        rows.append({**base, "Data": "pooled", **pooled_cells, "Anchor-drop delta": anchor_drop(everything)})
    ours = pd.DataFrame(rows)
    depth_cols = sorted((c for c in ours.columns if c.startswith("Depth ")), key=lambda c: int(c.split()[1]))
    ours = ours[
        [c for c in ours.columns if c not in depth_cols and c != "Anchor-drop delta"]
        + depth_cols
        + (["Anchor-drop delta"] if "Anchor-drop delta" in ours else [])
    ]
    p = overlap_paper_values(16)
    depth = "Depth " + p["setting"].str.removeprefix("depth=") + " delta"
    p = p.assign(metric=np.where(p["metric"] == "delta_median", depth, "Anchor-drop delta"))
    paper = _paper_frame(
        p,
        lambda r: {
            "Model": paper_model(r),
            "Method": PAPER_METHODS.get(r["method"]),
            "Data": f"paper: median over {PAPER_DATA.get(r['dataset'])} slices",
        },
    )
    return beside_paper(ours, paper, sorted(set(labelled["model"])), ["Model", "T", "Method", "Data", "Source"])


def _paper_frame(p: pd.DataFrame, label) -> pd.DataFrame:
    """Long paper values whose `metric` is already our column name, one row per (model, method, dataset)."""
    out = []
    for _, g in p.groupby(["model", "method", "dataset"], sort=False):
        out.append({**label(g.iloc[0]), "Source": "paper", **dict(zip(g["metric"], g["value"], strict=True))})
    return pd.DataFrame(out)
