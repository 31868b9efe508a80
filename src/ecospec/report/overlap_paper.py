"""The overlap paper's rows beside ours in the routing, acceptance and target-efficiency tables: its model, method
and data names, its tables as rows (`overlap_paper_values`), and ours with the paper's rows of the same model after
them.
"""

from __future__ import annotations

from collections.abc import Mapping

import pandas as pd

from ecospec.report.frame import model_label
from ecospec.report.paper import overlap_paper_values

# conf/model name -> the overlap paper's model name (report/paper_overlap/README.md)
PAPER_MODELS = {"qwen3": "qwen3_235b", "qwen3_30b": "qwen3_30b", "mixtral": "mixtral", "gptoss": "gptoss_120b"}
PAPER_LABELS = {
    "mixtral": "Mixtral-8x7B",
    "qwen2_57b": "Qwen2-57B",
    "glm47_flash": "GLM-4.7-Flash",
    "qwen3_30b": "Qwen3-30B",
    "qwen3_235b": "Qwen3-235B",
    "kimi_k25": "Kimi-K2.5",
    "qwen35_35b": "Qwen3.5-35B",
    "gptoss_120b": "GPT-OSS-120B",
    "qwen3_next_80b": "Qwen3-Next-80B",
}
PAPER_METHODS = {"eagle": "EAGLE", "eagle3": "EAGLE-3", "mtp": "MTP", "draft_model": "Separate draft"}
PAPER_DATA = {"mtbench": "MT-Bench", "specbench": "Spec-Bench", "aya": "Aya"}


def paper_rows(table: int, metrics: Mapping[str, str], rows: list[str], label) -> pd.DataFrame:
    """The overlap paper's Table `table` as rows (Source "paper"): `metrics` maps its metric names to our
    columns, `rows` are the long-format columns that make a row, `label(first long row)` gives its label cells."""
    p = overlap_paper_values(table)
    p = p[p["metric"].isin(list(metrics))]
    out = []
    for _, g in p.groupby(rows, sort=False):
        cells = {metrics[m]: v for m, v in zip(g["metric"], g["value"], strict=True)}
        out.append({**label(g.iloc[0]), "Source": "paper", **cells})
    return pd.DataFrame(out)


def paper_model(p) -> str:
    return PAPER_LABELS.get(p["model"], p["model"])


def beside_paper(ours: pd.DataFrame, paper: pd.DataFrame, models: list[str], labels: list[str]) -> pd.DataFrame:
    """Our rows, each model followed by the paper's rows of the same model; then the paper's other models."""
    same = {model_label(m): PAPER_LABELS[PAPER_MODELS[m]] for m in models if m in PAPER_MODELS}
    parts = []
    shown = set()
    for m in dict.fromkeys(ours["Model"]) if len(ours) else []:
        parts.append(ours[ours["Model"] == m])
        if m in same and len(paper):
            parts.append(paper[paper["Model"] == same[m]])
            shown.add(same[m])
    if len(paper):
        parts.append(paper[~paper["Model"].isin(shown)])
    out = pd.concat([p for p in parts if len(p)], ignore_index=True) if parts else pd.DataFrame()
    values = [c for c in out.columns if c not in labels]
    return out[[c for c in labels if c in out.columns] + values]
