"""The drafter kinds a config can name, each registered by a `kind_*.py` module of this package (torch-free: a
kind's `load` imports its implementation when a cell builds it). A new drafter is its implementation module, its
kind module and the `model.drafters.<kind>` entry of the models it drafts for."""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import ecospec.drafters as package

if TYPE_CHECKING:
    from ecospec.drafters.base import Drafter


@dataclass
class LoadContext:
    """What a kind's `load` gets to build its drafter for a cell: the kind, the model config and its
    `model.drafters.<kind>` entry, the loaded target, and the cell's resolvers (a local directory or HF id, the
    embedded default's stage folders, the target's parallel mode, the draft temperature)."""

    kind: str
    model: dict
    spec: dict
    target: object
    local: Callable[[str], Path]
    tiny_dirs: Callable
    parallel_mode: str
    temperature: float | tuple[float, ...] = 1.0


@dataclass(frozen=True)
class DrafterKind:
    name: str  # method.drafter and the key of model.drafters
    label: str  # how the reports print the model's own drafter with confidence selection
    load: Callable[[LoadContext], Drafter]  # builds the drafter (the protocol of drafters.base)
    compiled: bool = False  # engine=compiled drafts with it
    hidden: bool = False  # it reads the target's hidden states (an EAGLE-3 head)
    order: int = 50


_REGISTRY: dict[str, DrafterKind] = {}


def register(kind: DrafterKind) -> DrafterKind:
    if kind.name in _REGISTRY and _REGISTRY[kind.name] is not kind:
        raise ValueError(f"drafter kind {kind.name!r} is registered twice")
    _REGISTRY[kind.name] = kind
    return kind


def _discover() -> None:
    if getattr(_discover, "done", False):
        return
    for info in pkgutil.iter_modules(package.__path__):
        if info.name.startswith("kind_"):
            importlib.import_module(f"{package.__name__}.{info.name}")
    _discover.done = True


def kinds() -> list[DrafterKind]:
    _discover()
    return sorted(_REGISTRY.values(), key=lambda k: (k.order, k.name))


def names() -> tuple[str, ...]:
    return tuple(k.name for k in kinds())


def kind(name: str) -> DrafterKind:
    _discover()
    if name not in _REGISTRY:
        raise ValueError(f"unknown drafter kind {name!r}; allowed: {', '.join(names())}")
    return _REGISTRY[name]


def labels() -> dict[str, str]:
    return {k.name: k.label for k in kinds()}
