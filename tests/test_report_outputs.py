"""The files a report build manages (`report.outputs`): every file a build writes is on the list, a build from a
subset of the records removes what it no longer writes (tables, pages, figures) and leaves every file off the list
alone, and the index names each page."""

import json
import tarfile
from pathlib import Path

import pytest

from ecospec.report import build
from ecospec.report.outputs import is_managed
from ecospec.report.synthetic import synthetic_records

pytestmark = pytest.mark.usefixtures("no_release_traces")  # conftest: no tracing of the release

INPUTS = Path(__file__).parent / "golden" / "report_inputs.tar.gz"  # a real moe_methods run: eager and compiled
UNMANAGED = {"across_builds.md": "# Across builds\n", "across_builds.json": "{}\n", "figures/batch_scaling.png": "x"}


def _records(root: Path, experiments: set[str] | None = None, methods_run: bool = True) -> Path:
    for rec in synthetic_records(150, seed=0):
        if experiments is None or rec["experiment"] in experiments:
            cell = root / rec["experiment"] / rec["cell"]
            cell.mkdir(parents=True, exist_ok=True)
            (cell / "result.json").write_text(json.dumps(rec))
    if methods_run:
        with tarfile.open(INPUTS) as tar:
            tar.extractall(root / "moe_methods", filter="data")
    return root


def _files(out: Path) -> set[str]:
    return {p.relative_to(out).as_posix() for p in out.rglob("*") if p.is_file()}


def test_a_build_removes_only_the_files_it_manages_and_no_longer_writes(tmp_path):
    out = tmp_path / "reports"
    for rel, text in UNMANAGED.items():
        (out / rel).parent.mkdir(parents=True, exist_ok=True)
        (out / rel).write_text(text)

    full = {p.relative_to(out).as_posix() for p in build([_records(tmp_path / "all")], out)}
    assert _files(out) == full | set(UNMANAGED)  # the build wrote these and touched nothing else
    assert all(is_managed(out / rel, out) for rel in full), "a file the build writes is missing from outputs.py"
    assert not any(is_managed(out / rel, out) for rel in UNMANAGED)
    assert {"engines.md", "moe_methods.md", "modeled_cells.json", "table01_main.tex", "table06_07_batch.csv"} <= full
    index = (out / "README.md").read_text()
    tables, others = index.split("## Other outputs in this directory")
    assert "[md](engines.md)" in tables and "[md](moe_methods.md)" in tables
    assert "[json](across_builds.json) [md](across_builds.md); `python benchmarks/studies/across_builds.py" in others
    assert "[json](modeled_cells.json)" in others  # written by the build, linked by no table
    assert "`figures/batch_scaling`, on no list of `report/outputs.py`: [png](figures/batch_scaling.png)" in others
    assert "engines.md" not in others and "moe_methods.md" not in others

    # no compiled or cost-model cells, one experiment's records: their pages and the tables without cells go
    subset = {p.relative_to(out).as_posix() for p in build([_records(tmp_path / "some", {"table1"}, False)], out)}
    assert _files(out) == subset | set(UNMANAGED)
    assert {"engines.md", "moe_methods.md", "table06_07_batch.csv"} & subset == set()
    assert {"table01_main.md", "README.md"} <= subset < full | {"README.md"}
    for rel, text in UNMANAGED.items():
        assert (out / rel).read_text() == text
    assert "engines.md" not in (out / "README.md").read_text()
