"""How the report's modules import each other: at the top (no report module imported inside a function, where it
would hide a cycle) and by public names only."""

import ast
import subprocess
import sys
from pathlib import Path

import ecospec.report

REPORT = Path(ecospec.report.__file__).parent


def _imports(path: Path):
    """(imported module, names, whether inside a function) of each `from ecospec... import` in `path`."""
    tree = ast.parse(path.read_text())
    nested = {id(n) for f in ast.walk(tree) if isinstance(f, ast.FunctionDef) for n in ast.walk(f)}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("ecospec"):
            yield node.module, [a.name for a in node.names], id(node) in nested


def test_report_modules_import_each_other_at_the_top_and_by_public_names():
    inside, private = [], []
    for path in sorted(REPORT.glob("*.py")):
        for module, names, in_function in _imports(path):
            if in_function and module.startswith("ecospec.report"):
                inside.append(f"{path.name}: {module}")
            private += [f"{path.name}: {module}.{n}" for n in names if n.startswith("_")]
    assert not inside, inside
    assert not private, private


def test_a_report_loads_no_torch(tmp_path):
    """`make tables` reads result files and counts models from their configs: it never loads torch or transformers
    (their import is seconds of a report's time), nor wandb where no cell logged to it (report/dashboard.py). The
    tiny model's records are left out: their routing comparison traces the release once per machine (`tiny.build`),
    which does load torch."""
    from ecospec.experiment.job import write_record
    from ecospec.report.synthetic import iter_records

    for rec in iter_records(300, seed=0):
        if rec["config"]["model"]["name"] != "tiny":
            cell = tmp_path / "experiments" / rec["experiment"] / rec["cell"]
            cell.mkdir(parents=True, exist_ok=True)
            write_record(cell, rec)
    check = (
        "import sys\n"
        "from ecospec.report import build\n"
        f"build([{str(tmp_path / 'experiments')!r}], {str(tmp_path / 'reports')!r})\n"
        "loaded = sorted(m for m in ('torch', 'transformers', 'scipy.stats', 'wandb') if m in sys.modules)\n"
        "assert not loaded, loaded\n"
    )
    run = subprocess.run([sys.executable, "-c", check], capture_output=True, text=True)
    assert run.returncode == 0, run.stderr[-2000:]
    assert (tmp_path / "reports" / "table01_main.md").exists() and (tmp_path / "reports" / "figures").is_dir()
