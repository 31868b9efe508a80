"""Every file a report build may write under its directory, in one place. A build removes those it did not write
this time (a build from a subset of records leaves no stale table, page or figure behind) and never a file this list
does not name (the benchmark scripts' pages, `python -m ecospec.report.modeled --paper`'s table, anything else kept
beside the report).
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from ecospec.report.demo import FILE_NAME as DEMO_FIGURE
from ecospec.report.demo import NAME as DEMO
from ecospec.report.engines_page import NAME as ENGINES
from ecospec.report.fig1a import FILE_NAME as FIG1A_BENCH
from ecospec.report.figures import FILE_NAME as PAPER_FIGURES
from ecospec.report.gamma import TABLE_NAME as GAMMA_TABLE
from ecospec.report.moe_methods_page import NAME as MOE_METHODS
from ecospec.report.pareto import FILE_NAME as PARETO
from ecospec.report.roofline import SUMMARY
from ecospec.report.routing import TABLE_NAMES as ROUTING_TABLES
from ecospec.report.routing_figures import FILE_NAME as ROUTING_FIGURES
from ecospec.report.tables import NAMES as PAPER_TABLES
from ecospec.report.vllm import FILE_NAME as VLLM_FIGURES
from ecospec.report.vllm import TABLE_NAMES as VLLM_TABLES
from ecospec.report.write import INDEX

TABLES = (*PAPER_TABLES, GAMMA_TABLE, *ROUTING_TABLES, *VLLM_TABLES, DEMO)  # each as .md, .tex and .csv
TABLE_FORMATS = ("md", "tex", "csv")
PAGES = (ENGINES, MOE_METHODS)  # pages of prose around tables, .md
DATA = (SUMMARY,)  # the modeled table's inputs
FIGURES = "figures"  # the folder the figures go to, each as .png and .pdf
FIGURE_NAMES = (PAPER_FIGURES, FIG1A_BENCH, ROUTING_FIGURES, PARETO, VLLM_FIGURES, DEMO_FIGURE)
FILES = frozenset([f"{t}.{ext}" for t in TABLES for ext in TABLE_FORMATS] + [f"{p}.md" for p in PAGES] + [*DATA, INDEX])


def is_managed(path: Path, out_dir: Path) -> bool:
    """Whether a build of `out_dir` may write `path`."""
    rel = Path(path).resolve().relative_to(Path(out_dir).resolve())
    if len(rel.parts) == 2 and rel.parts[0] == FIGURES:
        return any(p.fullmatch(rel.name) for p in FIGURE_NAMES)
    return len(rel.parts) == 1 and rel.name in FILES


def remove_unwritten(out_dir: Path, written: Iterable[Path]) -> list[Path]:
    """Delete the files under `out_dir` a build may write but this one did not; return them."""
    out_dir = Path(out_dir)
    kept = {Path(p).resolve() for p in written}
    present = [*out_dir.glob("*"), *(out_dir / FIGURES).glob("*")]
    stale = [p for p in present if p.is_file() and is_managed(p, out_dir) and p.resolve() not in kept]
    for p in stale:
        p.unlink()
    return sorted(stale)
