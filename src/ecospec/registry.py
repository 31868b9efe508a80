"""One registry mechanism for the records that modules contribute (methods, model families, drafter kinds): each
record is registered by a module of its package, and the package's modules are imported on first use. Importable
without torch (validation and the reports read the registries)."""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Callable


class Registry:
    """Records with a `name` and an `order`, registered by the modules of `package` whose names start with `prefix`
    (no prefix: every module not starting with "_"). `unknown(name, names)` builds the error for a missing name."""

    def __init__(self, what: str, package: str, unknown: Callable[[str, tuple[str, ...]], Exception], prefix: str = ""):
        self.what, self.package, self.prefix, self._unknown = what, package, prefix, unknown
        self.entries: dict[str, object] = {}
        self._found = False

    def register(self, record):
        """Add a record; a name registered twice is a programming error."""
        if record.name in self.entries and self.entries[record.name] is not record:
            raise ValueError(f"{self.what} {record.name!r} is registered twice")
        self.entries[record.name] = record
        return record

    def _discover(self) -> None:
        if self._found:
            return
        package = importlib.import_module(self.package)
        for info in pkgutil.iter_modules(package.__path__):
            wanted = info.name.startswith(self.prefix) if self.prefix else not info.name.startswith("_")
            if wanted:
                importlib.import_module(f"{self.package}.{info.name}")
        self._found = True

    def all(self) -> list:
        """Every record, by its order (then name)."""
        self._discover()
        return sorted(self.entries.values(), key=lambda r: (r.order, r.name))

    def names(self) -> tuple[str, ...]:
        return tuple(r.name for r in self.all())

    def get(self, name: str):
        self._discover()
        if name not in self.entries:
            raise self._unknown(name, self.names())
        return self.entries[name]
