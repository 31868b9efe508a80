"""Model sources: where a target comes from, one record per source in its own module of this package (`tiny`: the
embedded default, trained by the package's recipe and released with it; `random`: a tiny preset of a real
architecture, random weights; `hf`: a checkpoint by HF id or local directory). A new source is a new module here.

A record says what the rest of the project asks of a source: whether its predictor, GTO head and draft calibration
ship with the package (`builtin`), whether it is a real checkpoint that is sized and memory-checked before it loads
(`real`), whether vLLM can serve it, its HF config as known without a download, where its checkpoint is, and how its
target and tokenizer load. Importable without torch; loading imports it when called."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ecospec.registry import Registry

# where a tiny model's stage folders are: (model config, until=None) -> {stage name: folder}
TinyDirs = Callable[..., dict[str, Path]]


@dataclass(frozen=True)
class Source:
    name: str  # the model config's `source`
    builtin: bool  # the embedded default: its predictor, GTO head and draft calibration ship with it
    real: bool  # a real checkpoint: sized before it loads (memory check, cluster GPUs), needs facts to be modeled
    # (model config) -> its HF config fields without a download (model_type, num_experts_per_tok, ...), or None
    config: Callable[[Mapping], dict | None]
    # (model config, device, tiny dirs, parallel mode) -> (target, tokenizer)
    load: Callable[[Mapping, Any, TinyDirs, str], tuple[Any, Any]]
    # (model config, tiny dirs) -> the checkpoint vLLM loads (a directory or HF id); None: it has none
    checkpoint: Callable[[Mapping, TinyDirs], str] | None = None
    problem: Callable[[Mapping], str | None] = lambda model: None  # what in a model config cannot load, in one line
    order: int = 50


REGISTRY = Registry(
    "model source",
    __name__,
    lambda name, names: ValueError(f"model.source={name!r}: allowed: {', '.join(names)}"),
)
register = REGISTRY.register
sources = REGISTRY.all
names = REGISTRY.names
source = REGISTRY.get


def of(model: Mapping) -> Source:
    """The record of a model config's source (ValueError for an unknown one)."""
    return source(model.get("source"))


def known(model: Mapping) -> Source | None:
    """The record of a model config's source, None for a config without a known one (an old or synthetic record's,
    or one validation is about to refuse)."""
    name = model.get("source")
    return source(name) if name in names() else None


def builtin(model: Mapping) -> bool:
    """Whether the model is the embedded default (`Source.builtin`); False for an unknown source."""
    found = known(model)
    return bool(found and found.builtin)


def real(model: Mapping) -> bool:
    """Whether the model is a real checkpoint (`Source.real`); False for an unknown source."""
    found = known(model)
    return bool(found and found.real)


def facts(model: Mapping) -> dict | None:
    """The target's HF config fields known without a download (`Source.config`), or None (also for an unknown
    source)."""
    found = known(model)
    return found.config(model) if found else None


def dtype_of(name: str | None):
    """A config's dtype as `from_pretrained` takes it."""
    import torch

    return "auto" if name in (None, "auto") else getattr(torch, name)
