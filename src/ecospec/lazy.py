"""Package attributes imported on first use (PEP 562), for packages whose modules load torch while some of their
names are wanted without it (the cost model and the report count and read files; they run no model)."""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterable, Mapping
from typing import Any


def lazy_attributes(package: str, modules: Mapping[str, Iterable[str]]) -> Callable[[str], Any]:
    """A module-level ``__getattr__`` for `package` that imports each name's module (``{module: names}``) when the
    name is first read."""
    where = {name: module for module, names in modules.items() for name in names}

    def __getattr__(name: str) -> Any:
        if name not in where:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        return getattr(importlib.import_module(where[name]), name)

    return __getattr__
