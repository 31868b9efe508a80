"""The report's output on a fixed set of records, kept as golden files so that a refactor of `ecospec.report` can
show it writes the same pages: 842 synthetic records (`report.synthetic`, the paper's grid, written as a cell
wrote them before per-prompt rows had a file of their own) and the 24 gsm8k cells of a real `experiment=moe_methods`
run (`report_inputs.tar.gz`, for the engines and methods pages).

Text outputs are compared whole, less what changes run to run (the build time and its duration) and the last
digits of a float, which the summation order of a numpy build or a processor decides; figures by name.

    python tests/golden/report_golden.py   # rewrite tests/golden/report/ from the current code
"""

from __future__ import annotations

import json
import os
import re
import sys
import tarfile
from pathlib import Path

HERE = Path(__file__).parent
GOLDEN = HERE / "report"
INPUTS = HERE / "report_inputs.tar.gz"
SYNTHETIC = 842  # the synthetic grid: every paper table has cells
TEXT = (".md", ".tex", ".csv", ".json")
# what differs between two builds of the same records
VOLATILE = [
    (re.compile(r"Built \d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC"), "Built <time>"),
    (re.compile(r"Took \d+(\.\d+)? s\."), "Took <seconds>."),
    (re.compile(r"/\S*?/experiments\b"), "<records>"),
]
LONG_FLOAT = re.compile(r"-?\d+\.\d{10,}(?:e[-+]?\d+)?")  # a float written to 16 or 17 digits


def rounded(text: str) -> str:
    """`text` with each long float to 10 significant digits."""
    return LONG_FLOAT.sub(lambda m: f"{float(m.group()):.10g}", text)


def write_inputs(root: Path) -> Path:
    """The records under `root/experiments`, as result files."""
    from ecospec.report.synthetic import synthetic_records

    records = root / "experiments"
    for rec in synthetic_records(SYNTHETIC, seed=0):
        cell = records / rec["experiment"] / rec["cell"]
        cell.mkdir(parents=True, exist_ok=True)
        (cell / "result.json").write_text(json.dumps(rec, indent=1))
    with tarfile.open(INPUTS) as tar:
        tar.extractall(records / "moe_methods", filter="data")
    return records


def normalized(out: Path) -> dict[str, str]:
    """relative path -> text with the volatile parts replaced; a figure's text is its name."""
    pages = {}
    for path in sorted(p for p in out.rglob("*") if p.is_file()):
        rel = path.relative_to(out).as_posix()
        if path.suffix not in TEXT:
            pages[rel] = "(figure)"
            continue
        text = path.read_text()
        for pattern, repl in VOLATILE:
            text = pattern.sub(repl, text)
        pages[rel] = rounded(text)
    return pages


def build(root: Path) -> dict[str, str]:
    """Build the report of the golden records in `root`; the caller points ECOSPEC_CACHE at an empty cache and sets
    ECOSPEC_TINY=cache (`isolated`), so no release traces and no profiles of this machine enter it."""
    from ecospec.report import build as build_report

    records = write_inputs(root)
    build_report([records], root / "reports")
    return normalized(root / "reports")


def isolated(root: Path) -> dict[str, str]:
    return {"ECOSPEC_CACHE": str(root / "cache"), "ECOSPEC_TINY": "cache"}


def golden() -> dict[str, str]:
    return {p.relative_to(GOLDEN).as_posix(): rounded(p.read_text()) for p in sorted(GOLDEN.rglob("*")) if p.is_file()}


def main() -> int:
    import shutil
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        os.environ.update(isolated(Path(tmp)))
        pages = build(Path(tmp))
    shutil.rmtree(GOLDEN, ignore_errors=True)
    for rel, text in pages.items():
        (GOLDEN / rel).parent.mkdir(parents=True, exist_ok=True)
        (GOLDEN / rel).write_text(text)
    print(f"wrote {len(pages)} golden files to {GOLDEN}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
