"""The package's import structure, read from the source (every import statement, at module level or inside a
function: a function-level import that closes a cycle is still a cycle, only deferred)."""

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src"
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
