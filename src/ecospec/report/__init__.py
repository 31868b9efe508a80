"""Tables and figures from result records (`make tables`): the EcoSpec paper's Tables 1-13 with the paper's
values beside ours, modeled GPU numbers, the MoE-Spec comparison (table and `pareto.py`'s figure), the overlap
paper's routing, acceptance and target-efficiency tables (`routing.py`), the figures, and an index `README.md` of
what came from which sweeps.

`report/` reads result files only, never models (docs/design.md "Data flows one way").
"""

from __future__ import annotations

import multiprocessing as mp
import pickle
from collections.abc import Iterable
from datetime import UTC, datetime
from pathlib import Path

from ecospec.report.fig1a import latency_profiles, load_bench, write_bench_figure
from ecospec.report.gamma import TABLE_NAME as GAMMA_TABLE
from ecospec.report.gamma import build_gamma
from ecospec.report.pareto import write_pareto_figures
from ecospec.report.records import conf_defaults, load_records, model_costs
from ecospec.report.routing import TABLE_NAMES, build_routing
from ecospec.report.tables import SPECS, build_tables, fit_overheads, gammas_of, modeled_cells, sweeps
from ecospec.report.vllm import TABLE_NAMES as VLLM_TABLES
from ecospec.report.vllm import build_vllm
from ecospec.report.write import write_index, write_table

# files a build rewrites or removes
MANAGED = [*(s.name for s in SPECS), "table13_models", "modeled", "moespec", *TABLE_NAMES, *VLLM_TABLES, GAMMA_TABLE]


FIGURE_PROCESSES = 2  # matplotlib is most of a build's time: draw in forked processes while tables are built


def _figures_child(frame, out: Path, part: tuple[int, int], conn) -> None:
    from ecospec.report.figures import write_figures

    try:
        conn.send_bytes(pickle.dumps(("ok", write_figures(frame, out, part))))
    except BaseException as e:  # noqa: BLE001 - re-raised by the parent
        conn.send_bytes(pickle.dumps(("error", e)))
    finally:
        conn.close()


def _start_figures(frame, out: Path, processes: int = FIGURE_PROCESSES):
    """Start drawing the figures (fork shares the frame without pickling it); returns a function that waits for
    them and returns the FigureInfo list. Without fork, draws them here and now."""
    from ecospec.report.figures import remove_stale, write_figures

    if "fork" not in mp.get_all_start_methods():
        infos = write_figures(frame, out)
        return lambda: infos
    ctx = mp.get_context("fork")
    jobs = []
    for i in range(processes):
        parent, child = ctx.Pipe(duplex=False)
        proc = ctx.Process(target=_figures_child, args=(frame, out, (i, processes), child), daemon=True)
        proc.start()
        child.close()
        jobs.append((proc, parent))

    def wait():
        infos = []
        for proc, conn in jobs:
            try:
                status, value = pickle.loads(conn.recv_bytes())
            except EOFError:
                proc.join()
                raise RuntimeError(f"a figures process died (exit code {proc.exitcode})") from None
            proc.join()
            if status == "error":
                raise value
            infos += value
        infos.sort(key=lambda f: f.name)
        remove_stale(out, infos)
        return infos

    return wait


def build(records: Iterable[str | Path] = ("experiments",), out_dir: str | Path = "reports", since=None) -> list[Path]:
    """Read every result file under `records`, write each table that has cells (md, tex, csv), the figures under
    `out_dir/figures/` and the index; return the files written. Tables without cells lose their old files."""
    started = datetime.now(UTC)
    sources = [str(r) for r in records]
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    recs = load_records(sources, since)
    # our engine's records (E, phase times, traces) in the paper's regime: compiled cells get their own table
    hf = recs.frame[(recs.frame["backend"] != "vllm") & (recs.frame["engine"] == "eager")]
    costs = model_costs(recs.model_configs, recs.storages)  # first: the figures processes inherit what it loaded
    figures_job = _start_figures(hf, out / "figures")
    defaults = conf_defaults(recs.model_configs)
    bench = load_bench(sources, since)  # the verify-latency benchmark's points (Figure 1(a), fitted GPU profiles)
    profiles = latency_profiles(bench, costs)
    tables, missing = build_tables(hf, defaults, costs, fit_overheads(hf, costs), profiles)
    routing_tables, routing_missing, routing_figures = build_routing(
        hf, recs.model_configs, costs, out / "figures", defaults
    )
    vllm_tables, vllm_missing, vllm_figures = build_vllm(recs.frame, costs, out / "figures")
    gamma_tables, gamma_missing = build_gamma(hf, defaults)
    tables += gamma_tables + routing_tables + vllm_tables
    missing += gamma_missing + routing_missing + vllm_missing
    written = [p for t in tables for p in write_table(t, out)]
    from ecospec.report.modeled import SUMMARY, write_summary

    modeled_table = next((t for t in tables if t.name == "modeled"), None)
    if modeled_table is not None:  # its inputs alone, so that it can be rebuilt when the cost model changes
        used = modeled_table.used
        written.append(write_summary(modeled_cells(hf, costs, defaults), gammas_of(used), len(used), sweeps(used), out))
    else:
        (out / SUMMARY).unlink(missing_ok=True)
    built = {t.name for t in tables}
    for name in MANAGED:
        if name not in built:
            for ext in ("md", "tex", "csv"):
                (out / f"{name}.{ext}").unlink(missing_ok=True)
    moespec = next((t for t in tables if t.name == "moespec"), None)
    pareto = write_pareto_figures(moespec and moespec.frame, moespec and moespec.used, out / "figures")
    figures = figures_job() + routing_figures + pareto + vllm_figures + write_bench_figure(bench, out / "figures")
    written += [Path(p) for f in figures for p in f.files]
    if ((recs.frame["engine"] == "compiled") & (recs.frame["status"] == "ok")).any():  # experiment=engines
        from ecospec.report.engines import from_frame
        from ecospec.report.engines import table as engines_table

        (out / "engines.md").write_text(engines_table(from_frame(recs.frame)))
        written.append(out / "engines.md")
    adaptive = recs.frame["method"].isin(["evict", "cascade", "ecospec_adaptive"]) & (recs.frame["status"] == "ok")
    if adaptive.any():  # experiment=moe_methods
        from ecospec.report.moe_methods import from_frame as moe_frame
        from ecospec.report.moe_methods import report as moe_report

        (out / "moe_methods.md").write_text(moe_report(moe_frame(recs.frame)))
        written.append(out / "moe_methods.md")
    written.append(write_index(out, tables, figures, missing, recs.frame, sources, recs.skipped, since, started))
    return written
