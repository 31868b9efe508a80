"""The MoE methods against batch size (`experiment=batch_methods`): per engine and temperature, each method's TPOT
and speedup over the same engine's AR at each batch size B (AR decoding each batch right after the method's, in
the same job), the batch size where each stops paying, α and per-position acceptance; a figure of TPOT and speedup
against B per method (the overlap paper's figure, measured); then the issue's goals, checked.

    python -m ecospec.report.batch_methods --records experiments/batch_methods --out reports/tiny

The speedup is Spec-Bench's: tokens per second over the whole generation, prefill included, on the run's clock,
with its paired interval. TPOT is vLLM's (the overlap paper's): the time per output token after the first, the
prefill left out (`experiment.metrics.tpot`), for our engines and vLLM alike; the AR row is the mean over the
methods' jobs, and the figure's speedup is the TPOT ratio.
A method stops paying at the first B whose speedup's interval lies below 1 (its estimate where it has none).
"""

from __future__ import annotations

import re
from pathlib import Path

import pandas as pd

from ecospec.methods import AR
from ecospec.report import moe_methods_page
from ecospec.report.compare import bracket, cell_interval
from ecospec.report.figures import save
from ecospec.report.lineup import adaptive, baseline, chain, lineup
from ecospec.report.records import mean_positions
from ecospec.report.write import Page

NAME = "batch_methods"
TITLE = "The MoE methods against batch size"
FIGURE = "fig_batch_methods"  # figure stem: FIGURE_<engine>_T<temperature>
FILE_NAME = re.compile(rf"{FIGURE}_.+\.(png|pdf)")
FLOOR = moe_methods_page.FLOOR  # the adaptive methods' goal against AR, here at every batch size
ENGINES = ("eager", "compiled", "vllm")  # vllm: vLLM-CPU's EAGLE-3 (a chain) on the same checkpoint


def _runs(frame: pd.DataFrame) -> pd.DataFrame:
    """Our engine's ok records of adaptive methods (`MethodSpec.adaptive`) at batch sizes above 1."""
    ok = frame[(frame["status"] == "ok") & (frame["backend"] != "vllm") & (frame["batch_size"].fillna(1) > 1)]
    return ok[adaptive(ok)]


def ran(frame: pd.DataFrame) -> bool:
    """Whether `frame` holds an experiment this page shows: an adaptive method at batch sizes above 1."""
    return not _runs(frame).empty


def from_frame(frame: pd.DataFrame) -> pd.DataFrame:
    """The newest ok record of each (engine, temperature, method, batch size) in `frame` of the newest experiment
    that ran an adaptive method at batch sizes above 1; its vLLM cells as engine "vllm", the model's drafter with
    confidence selection there being vLLM's chain (our chain's row)."""
    ours = _runs(frame).sort_values("finished")
    if ours.empty:
        raise ValueError("no ok records of adaptive methods at B > 1 (run python run.py -m experiment=batch_methods)")
    ok = frame[(frame["status"] == "ok") & (frame["experiment"] == ours["experiment"].iloc[-1])]
    f = ok[ok["backend"] != "vllm"]
    entries = lineup(f)
    tree, path = baseline(entries), chain(entries)
    v = ok[(ok["backend"] == "vllm") & (ok["method"] == tree)].assign(
        engine="vllm", method=path, selector=entries[path].spec.name if path else None
    )
    f = pd.concat([f, v]) if len(v) else f
    f = f.assign(tpot_ms=1e3 * f["tpot_s"], ar_tpot_ms=1e3 * f["ar_tpot_s"])
    f = f.sort_values("finished").drop_duplicates(["engine", "temperature", "method", "batch_size"], keep="last")
    return f.reset_index(drop=True)


def _num(v: float, digits: int) -> str:
    return "—" if pd.isna(v) else f"{v:.{digits}f}"


def stops_paying(g: pd.DataFrame) -> int | None:
    """The first batch size of one method's cells `g` whose speedup lies below 1 (its interval's top, else its
    estimate); None where it pays, or ties, at every batch size measured."""
    for _, r in g.sort_values("batch_size").iterrows():
        iv = cell_interval(r)
        if (iv[1] if iv else r.speedup) < 1.0:
            return int(r.batch_size)
    return None


def group_tables(sub: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame, dict]:
    """One (engine, temperature): the speedup table, the TPOT table and the facts the goals read."""
    sizes = sorted(int(b) for b in sub["batch_size"].unique())
    entries = lineup(sub)
    speed, tpot, facts = [], [], {"speedup": {}, "exact": {}, "tpot": {}, "entries": entries}
    ar = sub.groupby("batch_size")["ar_tpot_ms"].mean()
    facts["tpot"][AR] = {int(b): float(t) for b, t in ar.items()}
    tpot.append(["AR", *(_num(ar[b], 2) if b in ar else "—" for b in sizes), "", ""])
    for m in entries:
        g = sub[sub["method"] == m].set_index("batch_size")
        if g.empty:
            continue
        cells = {b: (float(g.loc[b].speedup), cell_interval(g.loc[b])) for b in sizes if b in g.index}
        facts["speedup"][m] = cells
        facts["exact"][m] = {b: g.loc[b].matches_ar for b in cells}
        facts["tpot"][m] = {b: float(g.loc[b].tpot_ms) for b in cells}
        stop = stops_paying(g.reset_index())
        pos = "/".join(f"{a:.2f}" for a in mean_positions(g["acceptance_by_position"]))
        speed.append(
            [entries[m].label, *(f"{cells[b][0]:.2f}×{bracket(cells[b][1])}" if b in cells else "—" for b in sizes)]
            + ["pays at every B" if stop is None else f"B = {stop}", f"{g.alpha.mean():.2f}", pos]
        )
        tpot.append(
            [entries[m].label, *(_num(g.loc[b].tpot_ms, 2) if b in g.index else "—" for b in sizes)]
            + [_num(g.E.mean(), 1), _num(g.mean_block.mean(), 2)]
        )
    bs = [f"B = {b}" for b in sizes]
    speed_t = pd.DataFrame(speed, columns=["Method", *bs, "stops paying", "α", "acceptance by position"])
    tpot_t = pd.DataFrame(tpot, columns=["TPOT ms", *bs, "E", "mean block"])
    return speed_t, tpot_t, facts


def goals(facts: dict) -> list[str]:
    """The issue's goals, each with what the run measured."""
    out = []
    for (engine, t), f in sorted(facts.items()):
        if engine == "vllm":
            continue
        label = {m: e.label for m, e in f["entries"].items()}
        adapting = [m for m, e in f["entries"].items() if e.adaptive]
        if t == 0:
            wrong = [f"{label[m]} B = {b}" for m, by in f["exact"].items() for b, x in by.items() if x != 1]
            out.append(
                f"- {engine}, T = 0: every method token-exact against AR at every batch size: "
                + ("yes" if not wrong else "NO: " + ", ".join(wrong))
                + "."
            )
        low = [
            f"{label[m]} B = {b} {s:.2f}×"
            for m in adapting
            for b, (s, _) in f["speedup"].get(m, {}).items()
            if s < FLOOR
        ]
        out.append(
            f"- {engine}, T = {t:g}: each adaptive method ≥ {FLOOR:.2f}× AR at every batch size: "
            + ("yes" if not low else "no: " + ", ".join(low))
            + "."
        )
        sizes = sorted({b for by in f["speedup"].values() for b in by})
        missed = []
        for b in sizes:
            static = {m: by[b] for m, by in f["speedup"].items() if m not in adapting and b in by}
            them = {m: by[b] for m, by in f["speedup"].items() if m in adapting and b in by}
            if not static or not them:
                continue
            best = max(static, key=lambda m: static[m][0])
            top = max(them, key=lambda m: (them[m][1] or (them[m][0],) * 2)[1])
            reach = (them[top][1] or (them[top][0],) * 2)[1]
            if reach < static[best][0]:
                rival = f"{label[best]} {static[best][0]:.2f}×"
                missed.append(f"B = {b} ({label[top]} up to {reach:.2f}× against {rival})")
        out.append(
            f"- {engine}, T = {t:g}: an adaptive method at least as fast as the best static method, within its "
            "interval, at every batch size: " + ("yes" if not missed else "no at " + "; ".join(missed)) + "."
        )
    out += _against_vllm(facts)
    return out


PEER_BATCH = 8  # the batch size at which the issue compares the compiled engine with vLLM-CPU


def _against_vllm(facts: dict) -> list[str]:
    """The compiled engine's TPOT at `PEER_BATCH` against vLLM-CPU's, for AR and the chain (T = 0)."""
    ours, theirs = facts.get(("compiled", 0.0)), facts.get(("vllm", 0.0))
    if not ours or not theirs:
        return []
    parts = []
    for m, label in ((AR, "AR"), (chain(ours["entries"]), "the chain")):
        a, b = ours["tpot"].get(m, {}).get(PEER_BATCH), theirs["tpot"].get(m, {}).get(PEER_BATCH)
        if a is None or b is None:
            return [f"- compiled, B = {PEER_BATCH}: TPOT against vLLM-CPU's: not both measured."]
        parts.append(f"{label} {a:.2f} ms against {b:.2f} ms ({'yes' if a <= b else 'no'})")
    return [f"- compiled, T = 0, B = {PEER_BATCH}: TPOT at most vLLM-CPU's: " + "; ".join(parts) + "."]


def figure(sub: pd.DataFrame, title: str):
    """TPOT and speedup against batch size (log2 axis), one line per method, AR's TPOT dashed."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(10, 4), layout="constrained")
    tp, sp = fig.subplots(1, 2)
    ar = sub.groupby("batch_size")["ar_tpot_ms"].mean()
    tp.plot(ar.index, ar.values, "k--", label="AR")
    for m, e in lineup(sub).items():
        g = sub[sub["method"] == m].sort_values("batch_size")
        tp.plot(g["batch_size"], g["tpot_ms"], "o-", label=e.label)
        sp.plot(g["batch_size"], g["ar_tpot_ms"] / g["tpot_ms"], "o-", label=e.label)
    sp.axhline(1.0, color="k", lw=0.8)
    for ax, y in ((tp, "TPOT (ms per token after the first)"), (sp, "TPOT speedup over AR")):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("batch size B")
        ax.set_ylabel(y)
    tp.legend(fontsize=7)
    fig.suptitle(title)
    return fig


def write_figures(figures: dict, figures_dir: Path) -> list[Path]:
    """`page`'s figures saved under `figures_dir` (PNG and PDF each); the files written."""
    figures_dir.mkdir(parents=True, exist_ok=True)
    return [p for stem, fig in figures.items() for p in save(fig, figures_dir / stem)]


def page(df: pd.DataFrame) -> tuple[Page, dict]:
    """The whole page (module docstring) from `from_frame`'s cells, and its figures by stem (figure objects)."""
    blocks: list = []
    facts, figures = {}, {}
    for engine in ENGINES:
        for t in sorted(df.loc[df["engine"] == engine, "temperature"].unique()):
            sub = df[(df["engine"] == engine) & (df["temperature"] == t)]
            speed, tpot, facts[(engine, float(t))] = group_tables(sub)
            n = int(sub["num_prompts"].max())
            stem = f"{FIGURE}_{engine}_T{t:g}"
            blocks += [
                f"## {engine} engine, T = {t:g} ({n} prompts, {int(sub['max_new_tokens'].max())} tokens each)",
                "Speedup over AR at the same batch size [interval]:",
                speed,
                "TPOT (ms per output token after the first, mean over sequences: vLLM's measure, prefill left out):",
                tpot,
            ]
            if sub["batch_size"].nunique() > 1:
                figures[stem] = figure(sub, f"{engine} engine, T = {t:g}")
                blocks.append(f"![TPOT and speedup against batch size](figures/{stem}.png)")
    blocks += ["## Goals", "\n".join(goals(facts))]
    return Page(NAME, "Batch methods", TITLE, blocks, df), figures
