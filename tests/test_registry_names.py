"""A method, drafter, model family or model source is named in its registry and nowhere in experiment/ or report/:
those read the registries (issue 56). What counts is a name used as a value (compared, passed, listed); a name as a
key of a config, a record or a mapping (`d["gto"]`, `.get("eagle3")`) is the schema's, and docstrings and messages
are prose. The public API's own words stay. A paper table's methods are those its experiment runs
(conf/experiment, read by `report.lineup.sweep`)."""

import ast
from pathlib import Path

import pytest
import yaml

from ecospec import conf_dir, families, sources
from ecospec.drafters.registry import names as drafter_names
from ecospec.methods import names as selector_names

PACKAGE = Path(__file__).resolve().parents[1] / "src" / "ecospec"
PUBLIC = {"confidence", "oracle", "hf"}  # selector="confidence", predictor="oracle", backend=hf
# (file under src/ecospec, name): why it is not a registry name there
KEPT = {
    ("experiment/cell.py", "ecospec"): "summary.ar_source names our AR loop (the package), not the method",
    ("experiment/tracking.py", "ecospec"): "the W&B project's default is the package's name",
    ("report/moespec.py", "moespec"): "the table's and its experiment's name (conf/experiment/moespec.yaml)",
    ("report/overlap_paper.py", "mixtral"): "a model's name (conf/model/mixtral.yaml) beside the paper's",
}


def registry_names() -> set[str]:
    methods = {yaml.safe_load(p.read_text())["name"] for p in (conf_dir() / "method").glob("*.yaml")}
    return methods | set(selector_names()) | set(drafter_names()) | set(families.names()) | set(sources.names())


def named(source: str, names: set[str]) -> list[tuple[int, str]]:
    """(line, name) of every registry name `source` uses as a value."""
    tree = ast.parse(source)
    prose = set()
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if (
            isinstance(body, list)
            and body
            and isinstance(body[0], ast.Expr)
            and isinstance(body[0].value, ast.Constant)
        ):
            prose.add(id(body[0].value))  # a docstring
        if isinstance(node, ast.Subscript):
            prose.add(id(node.slice))
        elif isinstance(node, ast.Dict):
            prose.update(id(k) for k in node.keys if k is not None)
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.args:
            if node.func.attr in ("get", "pop", "setdefault"):
                prose.add(id(node.args[0]))
        elif isinstance(node, ast.JoinedStr):
            prose.update(id(v) for v in node.values)
    return sorted(
        (node.lineno, node.value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in prose
        if node.value in names
    )


def uses(folder: str) -> dict[str, list[tuple[int, str]]]:
    names = registry_names() - PUBLIC
    out = {}
    for path in sorted((PACKAGE / folder).rglob("*.py")):
        rel = path.relative_to(PACKAGE).as_posix()
        found = [(line, n) for line, n in named(path.read_text(), names) if (rel, n) not in KEPT]
        if found:
            out[rel] = found
    return out


def test_experiment_names_no_method_drafter_family_or_source():
    assert uses("experiment") == {}


def test_report_names_no_method_drafter_family_or_source():
    assert uses("report") == {}


@pytest.mark.parametrize(
    ("source", "found"),
    [
        ('if model["source"] == "tiny":\n    pass', [(1, "tiny")]),
        ('kinds = ("eagle3", "draft_model")', [(1, "draft_model"), (1, "eagle3")]),
        ('x = d["gto"]; y = m.get("eagle3"); z = {"mtp": 1}', []),
        ('def f(x):\n    """ecospec"""\n    return f"{x}ecospec"', []),
    ],
)
def test_the_check_sees_a_name_used_as_a_value_only(source, found):
    assert named(source, registry_names()) == found
