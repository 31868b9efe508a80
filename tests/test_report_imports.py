"""How the report's modules import each other: at the top (no report module imported inside a function, where it
would hide a cycle) and by public names only."""

import ast
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
