"""Every file a report directory may hold, in one place: what a build may write under it (`FILES`, `FIGURE_NAMES`),
and what other commands write beside it (`BESIDE`: the one-page reports' own commands, the modeled table's rebuild,
the benchmark studies), which the index's last list names with the command that writes each. A build removes the
files it may write but did not write this time (a build from a subset of records leaves no stale table, page or
figure behind) and never a file it may not write.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from ecospec.report.batch_methods_page import FIGURE as BATCH_FIGURE
from ecospec.report.batch_methods_page import FILE_NAME as BATCH_FIGURES
from ecospec.report.batch_methods_page import NAME as BATCH_METHODS
from ecospec.report.batch_methods_page import TITLE as BATCH_METHODS_TITLE
from ecospec.report.demo import FILE_NAME as DEMO_FIGURE
from ecospec.report.demo import NAME as DEMO
from ecospec.report.engines_page import NAME as ENGINES
from ecospec.report.engines_page import TITLE as ENGINES_TITLE
from ecospec.report.fig1a import FILE_NAME as FIG1A_BENCH
from ecospec.report.figures import FILE_NAME as PAPER_FIGURES
from ecospec.report.gamma import TABLE_NAME as GAMMA_TABLE
from ecospec.report.moe_methods_page import NAME as MOE_METHODS
from ecospec.report.moe_methods_page import TITLE as MOE_METHODS_TITLE
from ecospec.report.pareto import FILE_NAME as PARETO
from ecospec.report.roofline import PAPER_TABLE3, SUMMARY
from ecospec.report.routing import TABLE_NAMES as ROUTING_TABLES
from ecospec.report.routing_figures import FILE_NAME as ROUTING_FIGURES
from ecospec.report.tables import NAMES as PAPER_TABLES
from ecospec.report.vllm import FILE_NAME as VLLM_FIGURES
from ecospec.report.vllm import TABLE_NAMES as VLLM_TABLES
from ecospec.report.write import INDEX, Beside

TABLES = (*PAPER_TABLES, GAMMA_TABLE, *ROUTING_TABLES, *VLLM_TABLES, DEMO)  # each as .md, .tex and .csv
TABLE_FORMATS = ("md", "tex", "csv")
PAGES = (ENGINES, MOE_METHODS, BATCH_METHODS)  # pages of prose around tables, .md
DATA = (SUMMARY,)  # the modeled table's inputs
FIGURES = "figures"  # the folder the figures go to, each as .png and .pdf
FIGURE_NAMES = (PAPER_FIGURES, FIG1A_BENCH, ROUTING_FIGURES, PARETO, VLLM_FIGURES, DEMO_FIGURE, BATCH_FIGURES)
FILES = frozenset([f"{t}.{ext}" for t in TABLES for ext in TABLE_FORMATS] + [f"{p}.md" for p in PAGES] + [*DATA, INDEX])
STUDY = "python benchmarks/studies/{}.py --out DIR"  # benchmarks/studies/README.md: what each measured
# Files beside the tables and figures the index links: a page a build did not write this time, the modeled table's
# inputs and the files other commands write; the index lists those present, in this order, with their command.
BESIDE = (
    Beside(
        (f"{ENGINES}.md",),
        f"{ENGINES_TITLE} (`experiment=engines`)",
        "python -m ecospec.report.engines --records experiments/engines --out DIR",
    ),
    Beside(
        (f"{MOE_METHODS}.md",),
        f"{MOE_METHODS_TITLE} (`experiment=moe_methods`)",
        "python -m ecospec.report.moe_methods --records experiments/moe_methods --out DIR",
    ),
    Beside(
        (f"{BATCH_METHODS}.md", f"{FIGURES}/{BATCH_FIGURE}_*"),
        f"{BATCH_METHODS_TITLE} (`experiment=batch_methods`) and its figures",
        "python -m ecospec.report.batch_methods --records experiments/batch_methods --out DIR",
    ),
    Beside(
        (SUMMARY,),
        "The modeled table's inputs, α and E per model, temperature and method (`python -m "
        f"ecospec.report.modeled --summary DIR/{SUMMARY} --out DIR` rebuilds the modeled table from them alone)",
        "python -m ecospec.report --out DIR",
    ),
    Beside(
        (f"{PAPER_TABLE3}.*",),
        "The EcoSpec paper's Table 3 beside the roofline model at the paper's α and E (modeled, not measured)",
        "python -m ecospec.report.modeled --paper --out DIR",
    ),
    Beside(
        ("across_builds.*",),
        "EcoSpec against EAGLE-3 on three builds of the embedded default's recipe",
        STUDY.format("across_builds"),
    ),
    Beside(
        ("batch_scaling.*",),
        "Batched decoding on the embedded default against the batch size",
        STUDY.format("batch_scaling"),
    ),
    Beside(
        ("calibration*.md", "figures/fig_calibration_tiny*.*"),
        "The embedded default's EAGLE-3 head's calibration, and its chain against the confidence tree",
        STUDY.format("calibration"),
    ),
    Beside(
        ("clock_spread.*",),
        "The spread of a repeated cell's speedup under each clock, the machine idle and busy",
        STUDY.format("clock_spread"),
    ),
    Beside(
        ("compiled_ops.*",),
        "Where a compiled pass's time goes on the embedded default, op category by category",
        STUDY.format("compiled_ops"),
    ),
    Beside(
        ("compiled_engine.json",),
        "The compiled engine against the eager one on the embedded default",
        STUDY.format("compiled_engine"),
    ),
    Beside(("target_entropy.*",), "How flat the embedded default's target is at T = 1", STUDY.format("target_entropy")),
)


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
