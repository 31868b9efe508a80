"""The list of the EcoSpec paper's tables (`SPECS`: which cells, which builder, how to print it) and `build_tables`,
which builds every one that has cells, with Table 13, the modeled GPU numbers and the MoE-Spec comparison.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

import pandas as pd

from ecospec.analysis.hardware import Hardware
from ecospec.analysis.weight_bytes import ModelCost
from ecospec.report.frame import clock, prepare, sweeps
from ecospec.report.moespec import NAME as MOESPEC
from ecospec.report.moespec import cells_moespec, table_moespec
from ecospec.report.paper_tables import (
    cells01,
    cells02,
    cells03,
    cells04,
    cells05,
    cells06,
    cells08,
    cells09,
    cells10,
    cells11,
    cells13,
    table01_main,
    table02_hbm,
    table03_latency,
    table04_ablation,
    table05_drafters,
    table06_07_batch,
    table08_rho,
    table09_predictor,
    table10_oracle,
    table11_12_gamma,
    table13_models,
)
from ecospec.report.roofline import NAME as MODELED
from ecospec.report.roofline import TITLE as MODELED_TITLE
from ecospec.report.roofline import cells_modeled, gammas_of, modeled, modeled_note
from ecospec.report.write import Table

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
        "E and the estimated weight bytes one verify pass reads (GB = 1e9 B, "
        "`analysis.weight_bytes.verify_hbm_bytes`), "
        "T=0, mean over the benchmarks named (the same for every row of a model). GPT-OSS: the paper counts every "
        "weight at 4 bits, we count the "
        "checkpoint's formats (bf16 attention and lm_head; see analysis/weight_bytes.py).",
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
TABLE13 = "table13_models"
NAMES = (*(s.name for s in SPECS), TABLE13, MODELED, MOESPEC)  # every table build_tables may write


def _note(spec_note: str, label: str, used: pd.DataFrame, out: pd.DataFrame, timed: bool, paper: str = "") -> str:
    note = f"{spec_note} From {len(used)} records (sweeps: {sweeps(used)})."
    if "Source" in out and (out["Source"] == "paper").any():
        note += paper or (
            f" paper rows: the EcoSpec paper's {label}, only the cells its text states (— elsewhere; "
            "src/ecospec/report/paper/README.md)."
        )
    return note + (clock(used) if timed else "")


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
            "Counted exactly from each model's HF config (`analysis.weight_bytes.model_cost`); active = the "
            "dense part (both "
            "embedding tables) + top-k routed experts per MoE layer, so above the releases' own convention."
        )
        note = _note(note, "Table 13", used, out, timed=False)
        tables.append(Table(TABLE13, "Table 13", "Model architectures", note, out, False, used))
    else:
        missing.append("Table 13")
    out = modeled(df, costs, overheads, defaults, profiles) if costs else None
    if out is not None and len(out):
        used = cells_modeled(df, defaults)
        used = used[used["model"].isin(list(costs))]
        note = modeled_note(gammas_of(used), len(used), sweeps(used), overheads or {}, profiles or {})
        tables.append(Table(MODELED, "Modeled", MODELED_TITLE, note, out, True, used))
    else:
        missing.append("Modeled")
    out = table_moespec(df, costs, overheads, defaults, profiles)
    if len(out):
        used = cells_moespec(df, defaults)
        note = (
            "Lossless EcoSpec against MoE-Spec's verify-time expert cap (lossy; engine.budget): per budget B (top-B "
            "experts per MoE layer by summed router score over the pass's tokens; — = no cap), measured speedup vs "
            "AR / α / E, mean over the benchmarks present; `modeled <GPU> speedup`: the roofline model "
            "(`analysis.latency.modeled_step`: verify, drafting and prediction costed) at that α and E, on the "
            "same GPU "
            "profiles as the Modeled table. Quality "
            "vs AR, from replaying each committed sequence "
            "once through the uncapped target (not timed): greedy, budget_error_rate = share of committed tokens "
            "the uncapped target would not have produced there, matches_ar = share of prompts identical to AR, "
            "first_divergence = mean first differing position (a prompt that never diverges counts its length); "
            "T > 0, the mean per-token log-likelihood of the committed tokens under the uncapped target beside AR's."
        )
        tables.append(
            Table(
                MOESPEC,
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
