"""`make demo`'s table, reading sentence and figure, from the records of its cell (`experiment=demo`: EcoSpec with
the model's own baseline interleaved, AR beside both): per method α, E, the speedup over the faster AR with its
paired 95 % interval, the roofline model's speedup on one GPU with the whole step costed
(`analysis.weight_bytes.step_parts`: the verify pass, each draft pass, the predictor's), and the share of prompts whose
output equals AR's. run.py
writes them beside the cell's record (demo.md / .tex / .csv, demo.png) and prints the table, the sentence and where
they went, after the cell or at once when its records are kept."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from ecospec.analysis.bootstrap import bootstrap, speedup
from ecospec.analysis.latency import modeled_step
from ecospec.analysis.model_config import load_model_config
from ecospec.analysis.weight_bytes import model_cost
from ecospec.experiment.records import RESULT
from ecospec.methods import AR
from ecospec.report.compare import change, ratio_interval
from ecospec.report.figures import FigureInfo
from ecospec.report.frame import prepare
from ecospec.report.lineup import sweep
from ecospec.report.records import load_records, read_one
from ecospec.report.roofline import row_parts
from ecospec.report.write import Table, to_markdown, write_table

NAME = "demo"
OURS, BASE = sweep(NAME).pairs[0]  # the roles the demo reads against each other (conf/experiment/demo.yaml)
FIGURE = "demo.png"
FILE_NAME = re.compile(r"demo\.png")  # its figure in a report's figures folder (report.outputs)
AR_UNITS = [2, 3, 2, 3, 4, 5]  # AR against the faster AR: a unit's speedup columns with AR's in the method's place


@dataclass(frozen=True)
class Row:
    """One method's line of the table."""

    label: str
    role: str  # ar | baseline | ecospec | ... (report.tables.ROLES)
    alpha: float
    E: float
    speedup: float
    interval: tuple[float, float] | None
    modeled: float
    same: float  # share of prompts whose output equals AR's
    t_step_s: float


@dataclass(frozen=True)
class Demo:
    """The demo's numbers: AR's row, then each method's, and EcoSpec against the baseline on the same prompts."""

    rows: list[Row]
    pair: dict | None  # {estimate, low, high}, paired bootstrap over prompts (report.compare)
    prompts: int
    datasets: list[str]
    gamma: int
    max_new_tokens: int
    gpu: str
    clock: str
    ar_source: str
    used: pd.DataFrame  # the records behind the rows


def group(cell_dir: Path, frame: pd.DataFrame | None = None) -> tuple[dict, pd.DataFrame]:
    """The demo cell's record, and the frame rows of the cell and of the newest ok record of each method decoded
    beside it in the same sweep folder (their `interleaved.in` names the cell). `frame`: the records already read
    (`make tables`); without it, the cell's sweep folder is read."""
    main_path = Path(cell_dir) / RESULT
    main = read_one(main_path)
    sweep = main_path.resolve().parent.parent
    frame = load_records([sweep]).frame if frame is None else frame
    listed = (main.get("interleaved") or {}).get("methods") or []
    near = frame[(frame["cell"] == main["cell"]) | (frame["interleaved_in"] == main["cell"])]
    near = near[[Path(p).resolve().parent.parent == sweep for p in near["path"]]]
    cell = near[[Path(p).resolve() == main_path.resolve() for p in near["path"]]]
    beside = near[(near["status"] == "ok") & (near["interleaved_in"] == main["cell"]) & near["method"].isin(listed)]
    beside = beside.sort_values("finished", kind="stable").drop_duplicates("method", keep="last")
    return main, pd.concat([cell, beside])


def modeled(
    model: str, drafter: str | None, depth: int, predictor: bool, alpha: float, experts: float, gpu: str
) -> float:
    """The roofline model's speedup on `gpu` at this α and E, the whole step costed (`report.tables.row_parts`)."""
    return modeled_step(
        model_cost(load_model_config(model)), alpha, experts, gpu, parts=row_parts(model, drafter, depth, predictor)
    )["speedup"]


def ar_row(cell: pd.Series, summary: dict, gpu: str) -> Row:
    """AR's row from a cell's record (`summary`: its summary): our loop's AR against the faster AR, with its interval
    over the same prompts."""
    units = np.asarray(cell.intervals["units"]["speedup"])[:, AR_UNITS]
    iv = bootstrap([units], speedup, seed=int(cell.seed))
    experts = float(cell.ar_experts_per_layer)
    return Row(
        label="AR",
        role=AR,
        alpha=1.0,
        E=experts,
        speedup=summary["ar_ecospec_tokens_per_s"] / summary["ar_tokens_per_s"],
        interval=(iv.low, iv.high) if iv else None,
        modeled=modeled(cell.model, None, int(cell.depth), False, 1.0, experts, gpu),
        same=1.0,
        t_step_s=float(cell.ar_t_step_s),
    )


def method_row(cell: pd.Series, gpu: str) -> Row:
    iv = cell.intervals.get("speedup")
    predictor = pd.notna(cell.predictor_checkpoint)  # the method calls the expert predictor
    return Row(
        label=cell.label,
        role=cell.role,
        alpha=float(cell.alpha),
        E=float(cell.E),
        speedup=float(cell.speedup),
        interval=(iv["low"], iv["high"]) if iv else None,
        modeled=modeled(cell.model, cell.drafter, int(cell.depth), predictor, cell.alpha, cell.E, gpu),
        same=float(cell.matches_ar),
        t_step_s=float(cell.t_step_s),
    )


def build(cell_dir: Path, gpu: str, records: pd.DataFrame | None = None) -> Demo:
    """The demo's numbers from the records of the cell in `cell_dir` and of the methods interleaved in it
    (`records`: the frame they are already in, `group`)."""
    main, rows = group(cell_dir, records)  # the cell's own row first
    frame = prepare(rows)  # role, label; rows in the tables' order (AR, baseline, EcoSpec)
    cell = frame[frame["path"] == rows["path"].iloc[0]].iloc[0]
    rows = [ar_row(cell, main["summary"], gpu), *(method_row(c, gpu) for _, c in frame.iterrows())]
    by_role = {c.role: c for _, c in frame.iterrows()}
    pair = None
    if OURS in by_role and BASE in by_role:
        pair = ratio_interval([(by_role[OURS], by_role[BASE])], "speedup", seed=int(cell.seed))
    dataset = main["config"]["dataset"]
    return Demo(
        rows=rows,
        pair=pair,
        prompts=len(cell.intervals["units"]["keys"]),
        datasets=list(dataset.get("members") or [dataset["name"]]),
        gamma=int(cell.gamma),
        max_new_tokens=int(cell.max_new_tokens),
        gpu=gpu,
        clock=cell.clock,
        ar_source=cell.ar_source,
        used=frame,
    )


def clock_words(clock: str) -> str:
    return "CPU time of the decoding thread" if clock == "thread_cpu" else "wall clock"


def table(demo: Demo) -> Table:
    """The demo's table: one row per method, its speedup with the interval beside it."""
    speed, model = "CPU speedup", f"modeled {demo.gpu} speedup"
    frame = pd.DataFrame(
        {
            "Method": [r.label for r in demo.rows],
            "alpha": [r.alpha for r in demo.rows],
            "E experts": [r.E for r in demo.rows],  # two decimals, as the demo always printed E
            speed: [r.speedup for r in demo.rows],
            f"{speed}_lo": [r.interval[0] if r.interval else np.nan for r in demo.rows],
            f"{speed}_hi": [r.interval[1] if r.interval else np.nan for r in demo.rows],
            model: [r.modeled for r in demo.rows],
            "same as AR share": [100 * r.same for r in demo.rows],
        }
    )
    ar = "transformers' generate" if demo.ar_source == "hf_generate" else "our AR loop"
    note = (
        f"{demo.prompts} held-out prompts ({', '.join(demo.datasets)}) x {demo.max_new_tokens} tokens, greedy, "
        f"γ = {demo.gamma}; speedup vs the faster AR ({ar}), {clock_words(demo.clock)}, with its 95 % interval (paired "
        f"bootstrap over prompts); α: tokens per step; E: unique experts per MoE layer per verify pass; modeled: "
        f"roofline weight bytes on one {demo.gpu} (the verify pass, each draft pass and the predictor's), not measured."
    )
    title = "EcoSpec beside the model's own baseline and AR, interleaved prompt by prompt"
    return Table(NAME, "Demo", title, note, frame, False, demo.used)


def reading(demo: Demo) -> str:
    """One sentence that reads the table as it is: how much EcoSpec saves in experts, and how its lead over the
    baseline on this CPU splits into acceptance (α) and step time (speedup ∝ α / step time)."""
    by_role = {r.role: r for r in demo.rows}
    if BASE not in by_role or OURS not in by_role:
        shown = sweep(NAME).method_pairs[0][1]
        return f"(no sentence: it reads EcoSpec against the model's own baseline, interleave=[{shown}])"
    e, c = by_role[BASE], by_role[OURS]
    fewer = 1 - c.E / e.E
    longer = c.t_step_s / e.t_step_s - 1  # > 0: EcoSpec's steps take longer (each also runs the expert predictor)
    where = f"on this CPU ({'CPU time' if demo.clock == 'thread_cpu' else 'wall clock'}, 95 % interval)"
    if demo.pair:
        p = demo.pair
        noise = ", within noise" if p["low"] <= 1 <= p["high"] else ""
        versus = f"is {change(p['estimate'], p['low'], p['high']).removesuffix(' ≈')} against it {where}{noise}"
    else:
        versus = f"is {change(c.speedup / e.speedup)} against it on this CPU (no interval: fewer than 2 prompts)"
    steps = f"{100 * abs(longer):.0f} % {'longer' if longer > 0 else 'shorter'}"
    return (
        f"EcoSpec verifies {100 * fewer:.0f} % fewer experts per layer than {e.label} (E {c.E:.1f} vs {e.E:.1f}) "
        f"and {versus}: its acceptance is {change(c.alpha / e.alpha)} (α {c.alpha:.2f} vs {e.alpha:.2f}) and its "
        f"steps take {steps} (each also runs the expert predictor); on one {demo.gpu}, where weight bytes set a "
        f"pass's time, the roofline model gives it {change(c.modeled / e.modeled)} (modeled, not measured)."
    )


def write_figure(demo: Demo, path: Path) -> Path:
    """E per method, and the measured speedup (with its interval) beside the modeled one."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = [r.label for r in demo.rows]
    colors = ["#9e9e9e", "#4c72b0", "#dd8452"]
    fig, (ax_e, ax_s) = plt.subplots(1, 2, figsize=(8, 3.2))
    ax_e.bar(labels, [r.E for r in demo.rows], color=colors)
    ax_e.set_title("E: experts per MoE layer per pass")
    x = range(len(labels))
    w = 0.38
    measured = [r.speedup for r in demo.rows]
    bands = [r.interval or (r.speedup, r.speedup) for r in demo.rows]
    err = [[r.speedup - lo for r, (lo, _) in zip(demo.rows, bands, strict=True)]]
    err.append([hi - r.speedup for r, (_, hi) in zip(demo.rows, bands, strict=True)])
    ax_s.bar(
        [i - w / 2 for i in x],
        measured,
        w,
        color=colors,
        label="CPU (measured, 95 % interval)",
        yerr=err,
        capsize=3,
        error_kw={"lw": 0.8},
    )
    ax_s.bar(
        [i + w / 2 for i in x],
        [r.modeled for r in demo.rows],
        w,
        color=colors,
        alpha=0.45,
        hatch="//",
        label=f"{demo.gpu} (modeled)",
    )
    ax_s.set_xticks(list(x), labels)
    ax_s.axhline(1.0, color="black", lw=0.6)
    ax_s.set_title("speedup vs AR")
    ax_s.legend(fontsize=7, loc="upper left")
    title = f"embedded default, γ = {demo.gamma}, {demo.prompts} prompts x {demo.max_new_tokens} tokens"
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=130)
    plt.close(fig)
    return path


def write_demo(cell_dir: str | Path, gpu: str) -> str:
    """The demo's table (md, tex, csv) and figure beside the cell's record; what run.py prints: the table, the
    sentence, and where the files went."""
    cell_dir = Path(cell_dir)
    demo = build(cell_dir, gpu)
    t = table(demo)
    paths = write_table(t, cell_dir)
    figure = write_figure(demo, cell_dir / FIGURE)
    return f"{to_markdown(t)}\n{reading(demo)}\ntable: {paths[0]} (.tex, .csv beside it)\nfigure: {figure}"


def for_report(frame: pd.DataFrame, out_dir: Path) -> tuple[list[Table], list[FigureInfo]]:
    """`make tables`' demo page: the table of the newest demo cell among the records (the cell itself, not a method
    decoded beside it), and its figure under `out_dir`; nothing without one."""
    mains = frame[(frame["status"] == "ok") & frame["demo_gpu"].notna() & frame["interleaved_in"].isna()]
    if mains.empty:
        return [], []
    cell = mains.sort_values("finished", kind="stable").iloc[-1]
    demo = build(Path(cell.path).parent, cell.demo_gpu, frame)
    figure = write_figure(demo, Path(out_dir) / FIGURE)
    used = demo.used
    caption = "The demo: EcoSpec, its baseline and AR side by side (make demo)."
    return [table(demo)], [FigureInfo(NAME, [figure], caption, sorted(set(used["experiment"])), len(used))]
