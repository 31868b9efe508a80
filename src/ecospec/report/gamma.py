"""The EcoSpec paper's γ protocol (Appendix C): sweep the verification budget for the model's baseline drafter and
EcoSpec on its benchmarks, and take the γ with the highest end-to-end speedup averaged over both methods and the
datasets. Ties go to the smaller γ (a smaller verify pass is the cheaper bet); a γ only EcoSpec ran at is never
chosen, so the budget is never picked on the method under test alone.

`experiment=gamma_protocol` runs the sweep (its sweeper extends the range by 2 while the best γ sits at the upper
end, up to 12: `extend_gammas`); `make tables` writes `gamma_protocol.md` from the records, with what the model
config holds (`model.gamma`, which the tables that hold γ fixed use) beside the choice: a configured γ within noise
of the best stays, since a rerun could as well choose it (`config_gamma`).
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import pandas as pd

from ecospec.analysis.bootstrap import bootstrap, speedup
from ecospec.report.compare import units
from ecospec.report.frame import DATASETS, ROLES, at_main, clock, model_label, newest, prepare, sweeps
from ecospec.report.lineup import sweep
from ecospec.report.write import Table

PROTOCOL = "gamma_protocol"  # the experiment that runs it (conf/experiment)
METHODS = sweep(PROTOCOL).roles  # prepare's roles: the model's own drafter with confidence selection, EcoSpec
OURS, BASE = sweep(PROTOCOL).pairs[0]  # the method under test and the baseline it is read against


def _units(cell: pd.Series) -> dict[str, list[float]] | None:
    """A cell's speedup columns per prompt (`experiment.intervals`), by unit key; None for records without them."""
    return units(cell, "speedup")


def _strata(cells: pd.DataFrame, gammas: tuple[int, ...], datasets) -> list[np.ndarray] | None:
    """One stratum per (method, dataset): the units both/all `gammas` cells decoded, their speedup columns side by
    side (6 per γ), paired by prompt (the same prompts at every γ; measured in different cells: weakly paired)."""
    out = []
    for role in METHODS:
        for d in datasets:
            per = []
            for g in gammas:
                hit = cells[(cells["role"] == role) & (cells["dataset"] == d) & (cells["gamma"] == g)]
                per.append(_units(hit.iloc[0]) if len(hit) else None)
            if any(u is None for u in per):
                return None
            keys = sorted(set.intersection(*(set(u) for u in per)))
            if len(keys) < 2:
                return None
            out.append(np.array([[x for u in per for x in u[k]] for k in keys]))
    return out


def _score_stat(k: int, j: int | None = None):
    """The protocol's score (the mean over methods and datasets of the speedup) from the k-th γ's 6 columns of each
    stratum, minus the j-th γ's when `j` is given."""

    def stat(sums):
        one = np.mean([speedup([s[:, 6 * k : 6 * k + 6]]) for s in sums], axis=0)
        return one if j is None else one - np.mean([speedup([s[:, 6 * j : 6 * j + 6]]) for s in sums], axis=0)

    return stat


def noise_aware(cells: pd.DataFrame, choice: pd.DataFrame, seed: int = 0) -> pd.DataFrame:
    """`choice` with each γ's score interval (score_low, score_high), the interval of score(γ) − score(best)
    (diff_low, diff_high) by a paired bootstrap over prompts within each method and dataset, `within_noise` where
    it holds 0, and `chosen_noise` on the smallest such γ: the choice a fluctuation cannot make. NaN / False where
    a cell has no per-prompt columns (records from before the intervals)."""
    out = choice.copy()
    for col in ("score_low", "score_high", "diff_low", "diff_high"):
        out[col] = np.nan
    out["within_noise"] = False
    out["chosen_noise"] = False
    for model, g in out.groupby("model", sort=False):
        mine = cells[cells["model"] == model]
        best = int(g.loc[g["chosen"], "gamma"].iloc[0])
        for i, r in g.iterrows():
            both = mine[mine["gamma"] == r["gamma"]].pivot_table(index="dataset", columns="role", values="speedup")
            datasets = sorted(both.dropna(subset=list(METHODS)).index)
            strata = _strata(mine, (int(r["gamma"]), best), datasets)
            if strata is None:
                continue
            score = bootstrap(strata, _score_stat(0), seed=seed)
            diff = bootstrap(strata, _score_stat(0, 1), seed=seed) if r["gamma"] != best else None
            out.loc[i, ["score_low", "score_high"]] = (score.low, score.high) if score else (np.nan, np.nan)
            lo, hi = (diff.low, diff.high) if diff else (0.0, 0.0) if r["gamma"] == best else (np.nan, np.nan)
            out.loc[i, ["diff_low", "diff_high"]] = (lo, hi)
            out.loc[i, "within_noise"] = bool(lo <= 0 <= hi)
        held = out[(out["model"] == model) & out["within_noise"]]
        if len(held) and out.loc[(out["model"] == model) & ~out["within_noise"], "diff_low"].notna().all():
            out.loc[held["gamma"].idxmin(), "chosen_noise"] = True
    return out


def protocol_cells(frame: pd.DataFrame, defaults: Mapping[str, dict] | None = None) -> pd.DataFrame:
    """Greedy baseline and EcoSpec cells at every γ (other settings at the main ones), the newest per cell."""
    df = prepare(frame, defaults)
    df = df[df["standard"] & df["role"].isin(METHODS) & df["backend"].fillna("hf").eq("hf")]
    df = at_main(df, gamma=None, temperature=0.0)
    return newest(df, ["model", "role", "dataset", "gamma"])


def choose(cells: pd.DataFrame) -> pd.DataFrame:
    """Per model: every γ with both methods' mean speedup over the datasets both ran, their average (the protocol's
    score), and `chosen` on the best (ties: the smaller γ). Columns: model, gamma, baseline, ecospec, score,
    datasets, chosen, upper_end (the chosen γ is the largest swept: the sweep should go on)."""
    rows = []
    for (model, gamma), g in cells.groupby(["model", "gamma"], sort=True):
        by = g.pivot_table(index="dataset", columns="role", values="speedup", aggfunc="mean")
        if not set(METHODS) <= set(by.columns):
            continue  # one method only at this γ: no protocol score (never chosen on EcoSpec alone)
        both = by.dropna(subset=list(METHODS))
        if both.empty:
            continue
        means = {m: float(both[m].mean()) for m in METHODS}
        rows.append(
            {
                "model": model,
                "gamma": int(gamma),
                **means,
                "score": sum(means.values()) / len(means),
                "datasets": len(both),
            }
        )
    out = pd.DataFrame(rows, columns=["model", "gamma", *METHODS, "score", "datasets"])
    out["chosen"] = False
    out["upper_end"] = False
    for _, g in out.groupby("model", sort=False):
        best = g.sort_values(["score", "gamma"], ascending=[False, True], kind="stable").index[0]
        out.loc[best, "chosen"] = True
        out.loc[best, "upper_end"] = bool(out.loc[best, "gamma"] == g["gamma"].max())
    return out


def _table(cells: pd.DataFrame, choice: pd.DataFrame) -> pd.DataFrame:
    """One row per model × γ: speedup per method and dataset, each method's mean, the protocol's score, the choice
    (the paper's and the noise-aware one), from the protocol's cells and their choice."""
    wide = cells.pivot_table(index=["model", "gamma"], columns=["role", "dataset"], values="speedup", aggfunc="mean")
    rows = []
    for r in choice.itertuples():
        row = {"Model": model_label(r.model), "γ": r.gamma}
        for role in METHODS:
            label = _baseline_label(cells, r.model) if role == BASE else ROLES[role]
            for d in [k for k in DATASETS if (role, k) in wide.columns] + [
                k for k in sorted({c[1] for c in wide.columns}) if k not in DATASETS
            ]:
                if (role, d) in wide.columns:
                    row[f"{label} {DATASETS.get(d, d)} speedup"] = wide.loc[(r.model, r.gamma), (role, d)]
            row[f"{label} mean speedup"] = getattr(r, role)
        row["Score speedup"] = r.score
        best = choice.loc[(choice["model"] == r.model) & choice["chosen"], "score"].iloc[0]
        row["Score 95 % interval"] = f"[{r.score_low:.2f}, {r.score_high:.2f}]" if pd.notna(r.score_low) else "—"
        row["Score − best [95 %]"] = (
            f"{r.score - best:+.2f} [{r.diff_low:+.2f}, {r.diff_high:+.2f}]" if pd.notna(r.diff_low) else "—"
        )
        # EcoSpec against the baseline at this γ (means over the datasets both ran): speedup, α and E ratios
        at = cells[(cells["model"] == r.model) & (cells["gamma"] == r.gamma)]
        means = at.groupby("role")[["alpha", "E"]].mean()
        row[f"{ROLES[OURS]} / {BASE} speedup"] = getattr(r, OURS) / getattr(r, BASE)
        row["α ratio"] = means.loc[OURS, "alpha"] / means.loc[BASE, "alpha"]
        row["E ratio"] = means.loc[OURS, "E"] / means.loc[BASE, "E"]
        row["Chosen"] = " ".join(
            x for x, on in (("◀ best mean (the paper's rule)", r.chosen), ("◀ noise-aware", r.chosen_noise)) if on
        )
        rows.append(row)
    return pd.DataFrame(rows)


def _baseline_label(cells: pd.DataFrame, model: str) -> str:
    labels = cells.loc[(cells["model"] == model) & (cells["role"] == BASE), "label"].dropna()
    return labels.mode().iloc[0] if len(labels) else "Baseline"


def chosen_gammas(frame: pd.DataFrame, defaults: Mapping[str, dict] | None = None) -> dict[str, tuple[int, bool]]:
    """model -> (the protocol's γ, whether it sits at the upper end of the sweep) from the records in `frame`."""
    return _chosen(choose(protocol_cells(frame, defaults)))


def _chosen(choice: pd.DataFrame) -> dict[str, tuple[int, bool]]:
    return {r.model: (int(r.gamma), bool(r.upper_end)) for r in choice[choice["chosen"]].itertuples()}


def extend_gammas(swept: list[int], chosen: Mapping[str, tuple[int, bool]], by: int = 2, upto: int = 12) -> list[int]:
    """The γ values to add to a sweep whose best γ sits at its upper end (for any model): the next `by`, at most
    `upto`; none when every model's best is inside the range."""
    top = max(swept)
    if not any(at_end for _, at_end in chosen.values()) or top >= upto:
        return []
    return list(range(top + 1, min(top + by, upto) + 1))


TABLE_NAME = PROTOCOL


def config_gamma(model: str, held: int, best: int, choice: pd.DataFrame) -> str:
    """What the model's config holds beside the rule's choice, and why they may differ: a configured γ within noise
    of the best (its score − best interval holds 0) stays, since a rerun could as well have chosen it; one outside
    it, or never swept, should become the choice."""
    where = f"conf/model/{model}.yaml holds γ = {held} (the γ the tables that hold γ fixed use)"
    if held == best:
        return f"{where}: the rule's choice."
    mine = choice[choice["model"] == model]
    row = mine[mine["gamma"] == held]
    if row.empty:
        return f"{where}, not swept here: put the rule's γ = {best} there."
    r = row.iloc[0]
    if pd.isna(r["diff_low"]):
        return f"{where}; without intervals here the paper's rule alone decides: put γ = {best} there."
    if not r["within_noise"]:
        return f"{where}, outside noise of the best here: put the rule's γ = {best} there."
    diff = r["score"] - mine.loc[mine["chosen"], "score"].iloc[0]
    return (
        f"{where}, not the rule's {best}: γ = {held} is within noise of the best here (score − best {diff:+.2f} "
        f"[{r['diff_low']:+.2f}, {r['diff_high']:+.2f}]), so a rerun of the sweep could as well choose it, and the "
        "config keeps it rather than follow the noise (its comment names the runs it rests on)."
    )


def build_gamma(frame: pd.DataFrame, defaults: Mapping[str, dict] | None = None) -> tuple[list[Table], list[str]]:
    """The protocol's table (and `Table` list for the writer), or its label among the missing ones."""
    used = protocol_cells(frame, defaults)
    if used.empty:
        return [], ["γ protocol"]
    choice = noise_aware(used, choose(used))  # the bootstrap once, for the table and the note
    table = _table(used, choice)
    if table.empty:
        return [], ["γ protocol"]
    chosen = _chosen(choice)
    aware = {r.model: int(r.gamma) for r in choice[choice["chosen_noise"]].itertuples()}
    held = used.groupby("model")["model_gamma"].agg(lambda s: int(s.mode().iloc[0]))
    said = " ".join(
        f"{model_label(m)}: the rule's γ = {g}"
        + (" (the largest swept: extend the sweep)" if end else "")
        + (f", noise-aware γ = {aware[m]}" if m in aware else ", noise-aware: none (records without intervals)")
        + f". {config_gamma(m, int(held[m]), g, choice)}"
        for m, (g, end) in chosen.items()
    )
    note = (
        "The EcoSpec paper's rule (App. C): per γ, each method's speedup vs AR averaged over the datasets both methods "
        "ran (T = 0, standard drafter and predictor); Score = the mean of the two methods' means; the chosen γ has the "
        "highest score (ties: the smaller γ; never chosen on EcoSpec alone). Beside it the noise-aware choice: the "
        "smallest γ whose score − the best score has a 95 % interval that holds 0 (paired bootstrap over prompts "
        "within each method and dataset, the cells' own per-prompt columns; weakly paired: each γ is its own cell); "
        f"the sweep's extension follows the best mean. Chosen: {said} From {len(used)} records "
        f"(sweeps: {sweeps(used)}).{clock(used)}"
    )
    return [
        Table(
            TABLE_NAME, "γ protocol", "Choosing the verification budget γ (the paper's rule)", note, table, False, used
        )
    ], []
