"""The package's import structure, read from the source (every import statement, at module level or inside a
function: a function-level import that closes a cycle is still a cycle, only deferred): no cycle, no private name
taken from another module, and no import from a layer above the importer's (the layers of docs/design.md)."""

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "src"
PACKAGE = "ecospec"


def _modules() -> dict[str, Path]:
    out = {}
    for path in sorted((SRC / PACKAGE).rglob("*.py")):
        parts = path.relative_to(SRC).with_suffix("").parts
        out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return out


MODULES = _modules()


def _resolve(name: str) -> str | None:
    """The module a dotted name refers to: itself, or the module that defines it (`ecospec.a.b.func` -> ecospec.a.b)."""
    while name and name not in MODULES:
        name = name.rpartition(".")[0]
    return name or None


def _absolute(module: str, node: ast.ImportFrom) -> str:
    if not node.level:
        return node.module or ""
    base = module.split(".")
    is_package = MODULES[module].name == "__init__.py"
    base = base[: len(base) - node.level + (1 if is_package else 0)]
    return ".".join([*base, node.module] if node.module else base)


def imports(module: str) -> list[tuple[str, str | None, int]]:
    """(imported module, the name taken from it or None, line) for every ecospec import in `module`."""
    out = []
    for node in ast.walk(ast.parse(MODULES[module].read_text())):
        if isinstance(node, ast.Import):
            out += [(a.name, None, node.lineno) for a in node.names if a.name.split(".")[0] == PACKAGE]
        elif isinstance(node, ast.ImportFrom):
            src = _absolute(module, node)
            if src.split(".")[0] != PACKAGE:
                continue
            for a in node.names:
                sub = f"{src}.{a.name}"
                out.append((sub, None, node.lineno) if sub in MODULES else (src, a.name, node.lineno))
    return out


def graph() -> dict[str, set[str]]:
    g = {m: set() for m in MODULES}
    for m in MODULES:
        for target, _, _ in imports(m):
            t = _resolve(target)
            if t and t != m:
                g[m].add(t)
    return g


def cycles(g: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan)."""
    index, low, stack, on, out = {}, {}, [], set(), []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(g[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(g):
        if v not in index:
            visit(v)
    return out


def test_no_import_cycles():
    found = cycles(graph())
    assert not found, "import cycles (function-level imports included): " + "; ".join(" <-> ".join(c) for c in found)


def test_no_private_name_is_imported_from_another_module():
    bad = [
        f"{m}:{line} imports {name} from {src}"
        for m in MODULES
        for src, name, line in imports(m)
        if name and name.startswith("_") and not name.startswith("__") and _resolve(src) != m
    ]
    assert not bad, "private names imported across modules:\n" + "\n".join(bad)


def test_the_checks_see_a_cycle_and_a_private_import():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []
    some = next(m for m in MODULES if imports(m))
    assert all(_resolve(t) for t, _, _ in imports(some))


def layer_table(text: str) -> list[tuple[str, list[str]]]:
    """(layer, its entries) of the "Layers" table of docs/design.md, bottom layer first."""
    section = text.split("### Layers", 1)[1].split("\n#", 1)[0]
    rows = [line.split("|")[1:3] for line in section.splitlines() if re.match(r"\| \d", line)]
    return [(name.strip(), re.findall(r"`([\w.*]+)`", mods)) for name, mods in rows]


def layer_of(module: str, table: list[tuple[str, list[str]]]) -> int | None:
    """The index of `module`'s layer: its longest entry (`a.b` covers a.b and what is under it, `a.b.*` only what is
    under it); None where no entry covers it."""
    best, found = -1, None
    for i, (_, entries) in enumerate(table):
        for e in entries:
            base = e.removesuffix(".*")
            covers = module.startswith(base + ".") or (module == base and not e.endswith(".*"))
            weight = len(base) + (0.5 if e.endswith(".*") else 0)
            if covers and weight > best:
                best, found = weight, i
    return found


def test_no_module_imports_from_a_layer_above_its_own():
    table = layer_table((ROOT / "docs" / "design.md").read_text())
    assert [name.split()[0] for name, _ in table] == [str(i) for i in range(1, len(table) + 1)]
    unplaced = sorted(m for m in MODULES if layer_of(m, table) is None)
    assert not unplaced, f"modules in no layer of docs/design.md: {unplaced}"
    up = []
    for m, targets in graph().items():
        mine = layer_of(m, table)
        for t in sorted(targets):
            if layer_of(t, table) > mine:
                up.append(f"{m} ({table[mine][0]}) imports {t} ({table[layer_of(t, table)][0]})")
    assert not up, "imports from a layer above: " + "; ".join(up)


def test_the_layer_check_reads_entries_as_the_doc_says():
    table = [("1 low", ["a", "a.x", "c"]), ("2 high", ["a.*", "b"])]
    assert layer_of("a", table) == 0 and layer_of("a.x", table) == 0 and layer_of("a.x.y", table) == 0
    assert layer_of("a.y", table) == 1 and layer_of("b.z", table) == 1 and layer_of("d", table) is None
    assert layer_table("x\n### Layers\n| layer | m |\n| --- | --- |\n| 1 low | `a`, `b.*` |\n\n## Next") == [
        ("1 low", ["a", "b.*"])
    ]


@pytest.mark.slow  # one tiny cell under a profiler (make test-slow, CI)
def test_the_typed_cell_reaches_few_modules(tmp_path):
    """Issue 56's bound: from `run_cell` to its record the cell's config (the typed cell, the composed config and
    its identity views) enters at most 8 modules, in at most 12 calls from another module
    (`benchmarks/config_path.py`)."""
    import sys

    from hydra import compose, initialize_config_dir
    from omegaconf import open_dict

    from ecospec import conf_dir

    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        import config_path
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))
    with initialize_config_dir(config_dir=str(conf_dir()), version_base="1.3"):
        cfg = compose("config", overrides=list(config_path.FAST))
    with open_dict(cfg):
        cfg.out_dir = str(tmp_path)
    cell, entries, _, climbs = config_path.trace(cfg, tmp_path / "cell")
    assert len(cell) <= 8, sorted(cell)
    assert sum(entries.values()) <= 12, dict(entries)
    assert not climbs
