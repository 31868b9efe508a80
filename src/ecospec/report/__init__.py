"""Tables and figures from result records (`make tables`): the EcoSpec paper's Tables 1-13 with the paper's
values beside ours, modeled GPU numbers, the MoE-Spec comparison (table and `pareto.py`'s figure), the overlap
paper's routing, acceptance and target-efficiency tables (`routing.py`), the figures, and an index `README.md` of
what came from which sweeps.

`report/` reads result files only, never models (docs/design.md "Data flows one way").
"""

from __future__ import annotations

import gc
from collections.abc import Iterable
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path

from ecospec.report import batch_methods_page, demo, engines_page, moe_methods_page
from ecospec.report.dashboard import chosen_logger, log_tables
from ecospec.report.fig1a import latency_profiles, load_bench, write_bench_figure
from ecospec.report.figures import write_figures
from ecospec.report.frame import sweeps
from ecospec.report.gamma import build_gamma
from ecospec.report.moespec import NAME as MOESPEC
from ecospec.report.outputs import BESIDE, FIGURES, remove_unwritten
from ecospec.report.pareto import write_pareto_figures
from ecospec.report.records import Records, conf_defaults, load_records, model_costs
from ecospec.report.roofline import NAME as MODELED
from ecospec.report.roofline import fit_overheads, gammas_of, modeled_cells, write_summary
from ecospec.report.routing import build_routing
from ecospec.report.tables import build_tables
from ecospec.report.vllm import build_vllm
from ecospec.report.write import write_index, write_page, write_table


def build(
    records: Iterable[str | Path] = ("experiments",), out_dir: str | Path = "reports", since=None, logger: str = "none"
) -> list[Path]:
    """Read every result file under `records`, write each table that has cells (md, tex, csv), the pages, the
    figures under `out_dir/figures/` and the index; return the files written. The files a build may write
    (`outputs.py`) that this one did not are removed; no other file is touched. `logger` (`dashboard.LOGGERS`):
    whether the tables and figures also go to one W&B run (`cells`: where the records' cells logged to W&B)."""
    started = datetime.now(UTC)
    sources = [str(r) for r in records]
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    with _collector_paused():  # what loads here lives for the whole build: the collector's passes would free nothing
        recs = load_records(sources, since)
        costs = model_costs(recs.model_configs, recs.storages)
    gc.freeze()  # and later passes skip it
    try:
        written = _write(recs, costs, sources, out, since, started)
    finally:
        gc.unfreeze()
    logger_cfg = chosen_logger(logger, recs.logger)
    if logger_cfg is not None:
        first = Path(sources[0]) if sources else out
        log_tables(written, out, logger_cfg, Path(logger_cfg.get("dir") or (first if first.is_dir() else first.parent)))
    return written


@contextmanager
def _collector_paused():
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def _write(recs: Records, costs: dict, sources: list[str], out: Path, since, started: datetime) -> list[Path]:
    """The build's outputs from its loaded records and model costs (`build`)."""
    # our engine's records (E, phase times, traces) in the paper's regime: compiled cells get their own table
    # (make demo's cells have a page of their own: in no paper table)
    hf = recs.frame[
        (recs.frame["backend"] != "vllm") & (recs.frame["engine"] == "eager") & recs.frame["demo_gpu"].isna()
    ]
    paper_figures = write_figures(hf, out / FIGURES)
    defaults = conf_defaults(recs.model_configs)
    bench = load_bench(sources, since)  # the verify-latency benchmark's points (Figure 1(a), fitted GPU profiles)
    profiles = latency_profiles(bench, costs)
    tables, missing = build_tables(hf, defaults, costs, fit_overheads(hf, costs), profiles)
    routing_tables, routing_missing, routing_figures = build_routing(
        hf, recs.model_configs, costs, out / FIGURES, defaults
    )
    vllm_tables, vllm_missing, vllm_figures = build_vllm(recs.frame, costs, out / FIGURES)
    gamma_tables, gamma_missing = build_gamma(hf, defaults)
    demo_tables, demo_figures = demo.for_report(recs.frame, out / FIGURES)
    tables += gamma_tables + routing_tables + vllm_tables + demo_tables
    missing += gamma_missing + routing_missing + vllm_missing
    written = [p for t in tables for p in write_table(t, out)]
    modeled_table = next((t for t in tables if t.name == MODELED), None)
    if modeled_table is not None:  # its inputs alone, so that it can be rebuilt when the cost model changes
        used = modeled_table.used
        written.append(write_summary(modeled_cells(hf, costs, defaults), gammas_of(used), len(used), sweeps(used), out))
    moespec = next((t for t in tables if t.name == MOESPEC), None)
    pareto = write_pareto_figures(moespec and moespec.frame, moespec and moespec.used, out / FIGURES)
    figures = (
        paper_figures
        + routing_figures
        + demo_figures
        + pareto
        + vllm_figures
        + write_bench_figure(bench, out / FIGURES)
    )
    written += [Path(p) for f in figures for p in f.files]
    ok = recs.frame["status"] == "ok"
    pages = []
    if (ok & (recs.frame["engine"] == "compiled")).any():  # experiment=engines
        pages.append(engines_page.page(engines_page.from_frame(recs.frame)))
    if moe_methods_page.ran(recs.frame):  # experiment=moe_methods
        pages.append(moe_methods_page.page(moe_methods_page.from_frame(recs.frame)))
    if batch_methods_page.ran(recs.frame):  # experiment=batch_methods
        built, batch_figures = batch_methods_page.page(batch_methods_page.from_frame(recs.frame))
        pages.append(built)
        written += batch_methods_page.write_figures(batch_figures, out / FIGURES)
    written += [write_page(p, out) for p in pages]
    remove_unwritten(out, written)
    index = write_index(out, tables, figures, missing, recs.frame, sources, recs.skipped, since, started, pages, BESIDE)
    written.append(index)
    return written
