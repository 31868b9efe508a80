"""The engine-by-method table (`experiment=engines`): EAGLE-3 and EcoSpec under the eager and the compiled engine,
averaged over the benchmarks both engines ran, with each speedup's interval and, per engine, EcoSpec against EAGLE-3
with a paired interval (`report.compare`): does the cost-aware gain grow or vanish when the per-forward overhead
goes?

    python -m ecospec.report.engines --records experiments/engines --out reports/tiny     # writes engines.md

`make tables` writes the same page wherever its records hold compiled cells; the
paper's tables take the eager cells only (the regime the paper measured).

Columns: speedup (over the same engine's AR, interleaved in the job) with its interval, α, acceptance by position
(averaged over the benchmarks), E, T_verify (ms per
verify pass), T_draft / T_AR (the draft tree's time over an AR step of the same engine), T_pred / T_verify (the
expert predictor's time over the verify pass), then each benchmark's speedup.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from ecospec.report.compare import bracket, cell_interval, change, mean_interval, ratio_interval
from ecospec.report.lineup import label_of, spec_of, sweep
from ecospec.report.records import mean_positions
from ecospec.report.write import Page

NAME = "engines"
# its methods, as conf/experiment/engines.yaml runs them, in the tables' order, as the pages print them
METHODS = {m: label_of(m) for m in sorted(sweep(NAME).methods, key=lambda m: spec_of(m).order)}
OURS, REFERENCE = sweep(NAME).method_pairs[0]  # the row that reads one against the other
TITLE = "EAGLE-3 and EcoSpec under the eager and the compiled engine"


def from_frame(frame: pd.DataFrame) -> pd.DataFrame:
    """The table's cells from the records frame (report.records): our engine's ok cells of METHODS in the newest
    experiment that ran compiled cells (`make tables` reads every experiment; the table compares one run's
    engines), the newest record of each engine, method and benchmark."""
    f = frame[(frame["status"] == "ok") & (frame["backend"] != "vllm") & frame["method"].isin(list(METHODS))]
    compiled = f[f["engine"] == "compiled"].sort_values("finished")
    if compiled.empty:
        raise ValueError(f"no compiled ok records of {', '.join(METHODS)} (run python run.py -m experiment=engines)")
    f = f[f["experiment"] == compiled["experiment"].iloc[-1]].sort_values("finished")
    f = f.drop_duplicates(["engine", "method", "dataset"], keep="last")
    return pd.DataFrame(
        {
            "engine": f["engine"],
            "method": f["method"],
            "dataset": f["dataset"],
            "speedup": f["speedup"],
            "alpha": f["alpha"],
            "positions": f["acceptance_by_position"],
            "E": f["E"],
            "t_verify_ms": 1e3 * f["t_verify_s"],
            "draft_over_ar": f["t_draft_s"] / f["ar_t_step_s"],
            "pred_over_verify": f["t_pred_s"] / f["t_verify_s"],
            "intervals": f["intervals"],
            "compile_s": f["compile_s"],
            "experiment": f["experiment"],
            "finished": f["finished"],
        }
    ).reset_index(drop=True)


def page(df: pd.DataFrame) -> Page:
    """The table and its note (see the module docstring), from `from_frame`'s cells."""
    per = df.groupby(["engine", "method"])["dataset"].apply(set)
    common = sorted(set.intersection(*per.tolist()))
    df = df[df["dataset"].isin(common)]
    head = [
        "Engine",
        "Method",
        "Speedup",
        "α",
        "acceptance by position",
        "E",
        "T_verify ms",
        "T_draft / T_AR",
        "T_pred / T_verify",
        *common,
    ]
    rows = []
    by = {k: g.set_index("dataset").loc[common] for k, g in df.groupby(["engine", "method"])}
    for engine in ("eager", "compiled"):
        for method, label in METHODS.items():
            g = by.get((engine, method))
            if g is None:
                continue
            iv = mean_interval([r for _, r in g.iterrows()], "speedup")
            per_bench = [f"{r.speedup:.2f}×{bracket(cell_interval(r))}" for _, r in g.iterrows()]
            pos = "/".join(f"{a:.2f}" for a in mean_positions(g.positions))
            rows.append(
                [
                    engine,
                    label,
                    f"{g.speedup.mean():.2f}×{bracket(iv)}",
                    f"{g.alpha.mean():.2f}",
                    pos,
                    f"{g.E.mean():.1f}",
                    f"{g.t_verify_ms.mean():.2f}",
                    f"{g.draft_over_ar.mean():.0%}",
                    f"{g.pred_over_verify.mean():.0%}",
                    *per_bench,
                ]
            )
        a, b = by.get((engine, OURS)), by.get((engine, REFERENCE))
        if a is not None and b is not None:
            pairs = [(a.loc[d], b.loc[d]) for d in common]
            out = []
            for metric in ("speedup", "alpha", "E"):
                r = ratio_interval(pairs, metric)
                est = r["estimate"] if r else a[metric].mean() / b[metric].mean()
                out.append(change(est, r and r["low"], r and r["high"]))
            bench = [change(a.loc[d].speedup / b.loc[d].speedup) for d in common]
            versus = f"{METHODS[OURS]} vs {METHODS[REFERENCE]}"
            rows.append([engine, versus, out[0], out[1], "", out[2], "", "", "", *bench])
    compile_s = df.groupby("engine")["compile_s"].apply(lambda x: [v for v in x if v is not None and not np.isnan(v)])
    blocks = [pd.DataFrame(rows, columns=head)]
    if "compiled" in compile_s and compile_s["compiled"]:
        c = compile_s["compiled"]
        blocks.append(
            f"Compiled cells' warm-up (env.compile_s, outside every timing): {min(c):.1f}-{max(c):.1f} s per cell."
        )
    return Page(NAME, "Engines", TITLE, blocks, df)
