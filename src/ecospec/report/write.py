"""The one writer of the report's pages: a built table as Markdown (GitHub), LaTeX (booktabs) and CSV, a page of
prose around tables (engines.md, moe_methods.md) as Markdown, and the index `README.md`, whose last list names every
other file of the directory from `report/outputs.py`'s `BESIDE`. Every Markdown table, of a table or a page, is laid
out by `grid`.

Numbers are formatted by the metric a column ends with ("GSM8K speedup" -> 1.22×); a missing cell prints "—".
The CSV keeps the numbers unformatted (empty = missing) and every row label, so it reads back as the table.
"""

from __future__ import annotations

import fnmatch
import math
import numbers
import re
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
import pandas as pd

from ecospec.report.compare import change
from ecospec.report.frame import LABEL_COLUMNS, sweeps

MISSING = "—"
INDEX = "README.md"
BESIDE_HEADING = "## Other outputs in this directory"
SKIPPED_HEADING = "## Skipped files"
LINK = re.compile(r"\]\(([^)\s]+)\)")  # a Markdown link's target


@dataclass
class Table:
    """A built table: its frame, how to print it and the records it came from."""

    name: str  # file stem
    label: str  # "Table 1"
    title: str
    note: str
    frame: pd.DataFrame
    combine: bool  # print each group's metrics in one cell, "a / b / c"
    used: pd.DataFrame  # the records behind the cells


@dataclass
class Page:
    """A page of prose around tables, whose cells its module prints itself (intervals, ratios, goals): its blocks in
    order, Markdown text or a frame of printed cells (laid out by `grid`), and the records behind it for the index."""

    name: str  # file stem
    label: str  # "Engines"
    title: str
    blocks: list[str | pd.DataFrame]
    used: pd.DataFrame


@dataclass(frozen=True)
class Beside:
    """Files a report directory may hold besides the tables and figures a build links in its index (report/outputs.py
    lists them): what they hold and the command that writes them, DIR standing for the directory."""

    patterns: tuple[str, ...]  # paths under the directory, `fnmatch` patterns: "across_builds.*", "figures/fig_x.*"
    what: str
    command: str


def _g(digits: int):
    return lambda v: f"{v:.{digits}g}"


def _one_decimal(v: float) -> str:
    """As the paper prints E and GB (23.7); small values (tiny models) keep three significant digits."""
    return f"{v:.1f}" if abs(v) >= 1 else f"{v:.3g}"


FORMATS = {
    "speedup": lambda v: f"{v:.2f}×",
    "alpha": lambda v: f"{v:.2f}",
    "rho": lambda v: f"{v:.2f}",
    "accuracy": lambda v: f"{v:.0%}",
    "E": _one_decimal,
    "hbm_gb": _one_decimal,
    "expert_params_m": _g(4),
    "total_params_b": _g(4),
    "active_params_b": _g(4),
    # the overlap paper's tables (report/routing.py); shares and errors are stored in percent
    "overlap": lambda v: f"{v:.3f}",
    "anchor": lambda v: f"{v:.3f}",
    "te": lambda v: f"{v:.3f}",
    "experts": lambda v: f"{v:.2f}",
    "ratio": lambda v: f"{v:.2f}×",
    "share": lambda v: f"{v:.1f}%",
    "err": lambda v: f"{v:+.1f}%",
    "delta": lambda v: f"{v:+.3f}",
    "gap": lambda v: f"{v:+.3f}",
    "draft_over_ar": lambda v: f"{v:.1%}",
    "pred_over_verify": lambda v: f"{v:.1%}",
    "d": lambda v: f"{v:+.2f}",
    "p": lambda v: f"{v:.1e}",
    "n": lambda v: f"{v:.0f}",
    # the MoE-Spec table (moespec.table_moespec)
    "budget_error_rate": lambda v: f"{v:.1%}",
    "matches_ar": lambda v: f"{v:.2f}",
    "first_divergence": lambda v: f"{v:.1f}",
    "loglik_per_token": lambda v: f"{v:.3f}",
    "ar_loglik_per_token": lambda v: f"{v:.3f}",
}
HEADERS = {
    "speedup": "Spd",
    "alpha": "α",
    "E": "E",
    "rho": "ρ",
    "hbm_gb": "HBM / verify (GB)",
    "t_pred_s": "T_pred (s)",
    "t_draft_s": "T_draft (s)",
    "t_verify_s": "T_verify (s)",
    "t_step_s": "T_total (s)",
    "draft_over_ar": "T_draft / T_AR",
    "pred_over_verify": "T_pred / T_verify",
    "t_verify_ms": "T_verify (ms)",
    "t_step_ms": "T_step (ms)",
    "t_draft_pred_ms": "T_draft+pred (ms)",
    "accuracy": "Accuracy",
    "layers": "Layers",
    "moe_layers": "MoE layers",
    "num_experts": "Experts (N)",
    "top_k": "Top-k",
    "expert_params_m": "Expert params (M)",
    "total_params_b": "Total params (B)",
    "active_params_b": "Active params (B)",
    "storage": "Storage",
    "te": "TE",
    "delta": "Δ",
    "ar_t_step_ms": "T_AR (ms)",
    "c_expert": "C_expert (MB/GPU)",
    "c_dense": "C_dense (MB/GPU)",
    "budget_error_rate": "Budget error",
    "matches_ar": "= AR",
    "first_divergence": "1st divergence",
    "loglik_per_token": "log p / token",
    "ar_loglik_per_token": "AR log p / token",
}
LATEX = {
    "`": "",
    "α": r"$\alpha$",
    "γ": r"$\gamma$",
    "ρ": r"$\rho$",
    "×": r"$\times$",
    "—": "---",
    "≥": r"$\geq$",
    "Δ": r"$\Delta$",
}
LATEX_SPECIAL = {
    "\\": r"\textbackslash{}",
    "&": r"\&",
    "%": r"\%",
    "$": r"\$",
    "#": r"\#",
    "_": r"\_",
    "{": r"\{",
    "}": r"\}",
    "~": r"\textasciitilde{}",
    "^": r"\textasciicircum{}",
}


def _metric(column: str) -> str:
    return column.rsplit(" ", 1)[-1]


def _fmt(column: str, value) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return MISSING
    if not isinstance(value, numbers.Real):
        return str(value)
    metric = _metric(column)
    if metric in FORMATS:
        return FORMATS[metric](value)
    if metric.endswith("_s") or metric.endswith("_ms"):
        return f"{value:.3g}"
    return str(value) if isinstance(value, numbers.Integral) else f"{value:g}"


def _label(value) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return ""
    return f"{value:g}" if isinstance(value, float) else str(value)


BOUNDS = ("_lo", "_hi")  # "<column>_lo" / "_hi": the 95 % interval of "<column>" (report.compare.with_intervals)


def _cell(columns: dict[str, list], c: str, i: int, ratio: bool) -> str:
    """Row i's value of column c (`columns`: the frame's columns as lists) as printed: with its interval where the
    table has one ("1.38× [1.21, 1.55]"); on a ratio row (method against method) as a change, "+4 % [−2, +9]", ≈
    where the interval holds no change."""
    v = columns[c][i]
    lo, hi = (columns[c + b][i] if c + b in columns else math.nan for b in BOUNDS)
    bounded = not (pd.isna(v) or pd.isna(lo) or pd.isna(hi))
    if ratio and not pd.isna(v):
        return change(v, lo, hi) if bounded else change(v)
    if bounded:
        return f"{_fmt(c, v)} [{_fmt(c, lo).rstrip('×')}, {_fmt(c, hi).rstrip('×')}]"
    return _fmt(c, v)


def display(table: Table) -> pd.DataFrame:
    """The table as printed: formatted text, "—" for a missing value, a value's interval beside it where the table
    has one, each group's metrics joined into one cell ("a / b / c") when the table combines them, and a row label
    left blank where it repeats the row above."""
    df = table.frame
    labels = [c for c in df.columns if c in LABEL_COLUMNS]
    values = [c for c in df.columns if c not in labels and not c.endswith(BOUNDS)]
    ratio = (df["Source"] == "ratio").to_numpy() if "Source" in df else np.zeros(len(df), dtype=bool)
    columns = {c: df[c].tolist() for c in df.columns}  # a list per column: pandas per cell costs more than printing
    out = {c: [_label(v) for v in columns[c]] for c in labels}
    keep = [c for c in labels if c != "Source"]
    same = [[i > 0 and out[c][i] == out[c][i - 1] for i in range(len(df))] for c in keep]
    for j, c in enumerate(keep):  # blank a label that repeats the row above, along with every label left of it
        for i in range(len(df)):
            if all(same[k][i] for k in range(j + 1)):
                out[c][i] = ""
    if table.combine:
        groups: dict[str, list[str]] = {}
        for c in values:
            groups.setdefault(c.rsplit(" ", 1)[0] if " " in c else c, []).append(c)
        for head, cols in groups.items():
            name = head if " " in cols[0] else HEADERS.get(head, head)
            out[name] = [" / ".join(_cell(columns, c, i, ratio[i]) for c in cols) for i in range(len(df))]
    else:
        for c in values:
            head = (c.rsplit(" ", 1)[0] + " " + HEADERS.get(_metric(c), _metric(c))) if " " in c else HEADERS.get(c, c)
            out[head] = [_cell(columns, c, i, ratio[i]) for i in range(len(df))]
    return pd.DataFrame(out)


def grid(cells: pd.DataFrame) -> str:
    """A frame of printed cells as a GitHub Markdown table: the one layout of every table and page."""
    return cells.to_markdown(index=False, disable_numparse=True)


def to_markdown(table: Table) -> str:
    return f"### {table.label}. {table.title}\n\n{table.note}\n\n{grid(display(table))}\n"


def page_markdown(page: Page) -> str:
    blocks = [grid(b) if isinstance(b, pd.DataFrame) else b for b in page.blocks]
    return "\n\n".join([f"# {page.title}", *blocks]) + "\n"


def write_page(page: Page, out_dir: Path) -> Path:
    """`<name>.md` under out_dir."""
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"{page.name}.md"
    path.write_text(page_markdown(page), encoding="utf-8")
    return path


def _latex_text(text: str) -> str:
    text = "".join(LATEX_SPECIAL.get(ch, ch) for ch in str(text))
    for k, v in LATEX.items():
        text = text.replace(k, v)
    return text


def to_latex(table: Table) -> str:
    """A booktabs `table` float of the printed cells (written out here: pandas' Styler renders it through jinja2 in
    many times the time)."""
    shown = display(table)
    head = [_latex_text(c) for c in shown.columns]
    rows = [" & ".join(_latex_text(v) for v in row) + " \\\\" for row in shown.itertuples(index=False)]
    lines = [
        f"% {table.label}, written by `python -m ecospec.report`; needs \\usepackage{{booktabs}}",
        "\\begin{table}[t]",
        "\\centering",
        f"\\caption{{{_latex_text(f'{table.title}. {table.note}')}}}",
        f"\\label{{tab:{table.name}}}",
        f"\\begin{{tabular}}{{{'l' * len(head)}}}",
        "\\toprule",
        " & ".join(head) + " \\\\",
        "\\midrule",
        *rows,
        "\\bottomrule",
        "\\end{tabular}",
        "\\end{table}",
    ]
    return "\n".join(lines) + "\n"


def write_table(table: Table, out_dir: Path) -> list[Path]:
    """`<name>.md`, `<name>.tex`, `<name>.csv` under out_dir."""
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = [out_dir / f"{table.name}.{ext}" for ext in ("md", "tex", "csv")]
    paths[0].write_text(to_markdown(table), encoding="utf-8")
    paths[1].write_text(to_latex(table), encoding="utf-8")
    table.frame.to_csv(paths[2], index=False)
    return paths


def _time(ts) -> str:
    return "—" if ts is None or pd.isna(ts) else pd.Timestamp(ts).strftime("%Y-%m-%d %H:%M UTC")


def _experiments(value) -> str:
    if isinstance(value, dict):
        return ", ".join(f"{k} ({v})" for k, v in value.items()) or "none"
    if isinstance(value, str):
        return value
    return ", ".join(map(str, value or [])) or "none"


def write_index(
    out_dir: Path,
    tables: list[Table],
    figures: Iterable,
    missing: list[str],
    frame: pd.DataFrame,
    sources: list[str],
    skipped: list[str],
    since=None,
    started: datetime | None = None,
    pages: Iterable[Page] = (),
    beside: Iterable[Beside] = (),
) -> Path:
    """`README.md`: what was read and when, every table, page and figure file with the sweeps (experiments) and record
    counts it came from and its newest record, then every other file of the directory (`beside_section`)."""
    built = datetime.now(UTC)
    lines = ["# Reports", ""]
    ok = int((frame["status"] == "ok").sum())
    lines.append(
        f"Built {built.strftime('%Y-%m-%d %H:%M:%S UTC')} by `python -m ecospec.report` from "
        f"{', '.join(f'`{s}`' for s in sources)}" + (f" (records finished since {since})" if since else "") + ": "
        f"{len(frame)} records, {ok} ok and {len(frame) - ok} failed (failed cells are in no table); "
        f"{len(skipped)} unreadable or partial files skipped; newest record {_time(frame['finished'].max())}."
        + (f" Took {(built - started).total_seconds():.1f} s." if started else "")
    )
    lines += ["", "## Tables", "", "| table | files | sweeps (records) | newest record |", "| --- | --- | --- | --- |"]
    pages = list(pages)
    for t in [*tables, *pages]:
        exts = ("md",) if isinstance(t, Page) else ("md", "tex", "csv")
        files = " ".join(f"[{ext}]({t.name}.{ext})" for ext in exts)
        newest = _time(t.used["finished"].max()) if len(t.used) else "—"
        lines.append(f"| {t.label}. {t.title} | {files} | {sweeps(t.used)} | {newest} |")
    if missing:
        lines += ["", f"No cells in the records yet: {', '.join(missing)}."]
    figures = list(figures)
    lines += ["", "## Figures", ""]
    if figures:
        lines += ["| figure | files | sweeps | records |", "| --- | --- | --- | --- |"]
        for f in figures:
            files = " ".join(
                f"[{Path(p).suffix.lstrip('.') or Path(p).name}]({_relative(p, out_dir)})" for p in f.files
            )
            lines.append(f"| {f.caption} | {files} | {_experiments(f.experiments)} | {f.n_records} |")
    else:
        lines.append("None.")
    linked = {target for line in lines for target in LINK.findall(line)}
    lines += beside_section(out_dir, linked, beside)
    if skipped:
        lines += ["", SKIPPED_HEADING, "", *[f"- `{p}`" for p in skipped]]
    path = out_dir / INDEX
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def beside_section(out_dir: Path, linked: set[str], beside: Iterable[Beside]) -> list[str]:
    """The index's last list: every file under `out_dir` (figures/ included) that `linked` (the index's other links)
    leaves out, one line per entry of `beside` whose files are there and a line per file stem no entry names; no
    lines when every file is linked."""
    out_dir = Path(out_dir)
    files = sorted(
        p.relative_to(out_dir).as_posix() for p in out_dir.rglob("*") if p.is_file() and not p.name.startswith(".")
    )
    left = [f for f in files if f not in linked and f != INDEX]
    entries = []
    for entry in beside:
        mine = [f for f in left if any(fnmatch.fnmatchcase(f, pattern) for pattern in entry.patterns)]
        left = [f for f in left if f not in mine]
        if mine:
            entries.append(f"- {entry.what}: {_links(mine)}; `{entry.command}`")
    stems: dict[str, list[str]] = {}
    for f in left:
        stems.setdefault(f.split(".")[0], []).append(f)
    entries += [f"- `{stem}`, on no list of `report/outputs.py`: {_links(fs)}" for stem, fs in stems.items()]
    if not entries:
        return []
    intro = "Files here that the tables and figures above do not link, each with the command that writes it (DIR: this "
    intro += "directory); the benchmark scripts' pages each say how they were made."
    return ["", BESIDE_HEADING, "", intro, "", *entries]


def _links(files: list[str]) -> str:
    """Markdown links to `files`, each named by its extension, or by its file name where two share one."""
    exts = [f.rsplit(".", 1)[-1] for f in files]
    unique = len(set(exts)) == len(exts)
    return " ".join(f"[{ext if unique else f.rsplit('/', 1)[-1]}]({f})" for f, ext in zip(files, exts, strict=True))


def relisted(out_dir: Path, beside: Iterable[Beside]) -> str:
    """`out_dir`'s index with only its last list made anew (`beside_section`, from the links in the rest of it): what
    `relist` writes after a page or a file was written beside a report without rebuilding it from its records."""
    body, skipped = _cut((Path(out_dir) / INDEX).read_text(encoding="utf-8"), SKIPPED_HEADING)
    lines = _cut(body, BESIDE_HEADING)[0].rstrip("\n").split("\n")
    linked = {target for line in lines for target in LINK.findall(line)}
    lines += beside_section(Path(out_dir), linked, beside)
    return "\n".join(lines) + ("\n\n" + skipped.rstrip("\n") if skipped else "") + "\n"


def relist(out_dir: Path, beside: Iterable[Beside]) -> Path:
    """Rewrite `out_dir`'s index as `relisted` makes it; the rest of the index is kept as it is."""
    text = relisted(out_dir, beside)
    path = Path(out_dir) / INDEX
    path.write_text(text, encoding="utf-8")
    return path


def _cut(text: str, heading: str) -> tuple[str, str]:
    """`text` before the section `heading` opens, and that section on (empty where there is none)."""
    at = text.find("\n" + heading + "\n")
    return (text, "") if at < 0 else (text[:at], text[at + 1 :])


def _relative(path, out_dir: Path) -> str:
    p = Path(path)
    try:
        return p.resolve().relative_to(out_dir.resolve()).as_posix()
    except ValueError:
        return p.as_posix()
