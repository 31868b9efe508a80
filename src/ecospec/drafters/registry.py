"""The drafter kinds a config can name, each registered by a `kind_*.py` module of this package (torch-free: a
kind's `load` imports its implementation when a cell builds it). A new drafter is its implementation module, its
kind module and the `model.drafters.<kind>` entry of the models it drafts for."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from ecospec.registry import Registry

if TYPE_CHECKING:
    from ecospec.drafters.base import Drafter


RANDOM_PATH = "random"  # model.drafters.<kind>.path of a random head (tests)
SYNTHETIC_PATHS = (RANDOM_PATH, "perturbed")  # paths that name no checkpoint: a random head, a perturbed target copy


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
    # engine=compiled: (drafter, gamma=, depth=, topk=, max_len=, depths=, native=, rows=) -> the drafter prepared for
    # those fixed shapes; None: engine=compiled refuses the kind (validation and the public API alike)
    prepare: Callable[..., Drafter] | None = None
    hidden: bool = False  # it reads the target's hidden states (an EAGLE-3 head)
    build_stage: str | None = None  # the embedded default's build stage whose folder holds its `head`, if it has one
    # what one pass reads, for the cost model (`analysis.weight_bytes.drafter_pass_bytes`): "head" (an EAGLE-3 head),
    # "mtp" (DeepSeek's MTP module, part of the target's checkpoint) or "lm" (a draft LM); None: not modeled
    weights: str | None = None
    # the kind whose shape (its `facts.drafters.<kind>`, its build stage's head) it has: GTO's, the EAGLE-3 head's
    shape_of: str | None = None
    # (model config) -> one line when the checkpoint it loads without a `path` is not made yet (what it needs and the
    # command that makes it); None: nothing to make
    missing: Callable[[dict], str | None] | None = None
    standard: bool = True  # False: a head trained for one table (GTO's), never a model's standard drafter
    order: int = 50

    @property
    def compiled(self) -> bool:
        """Whether engine=compiled drafts with it: one fact, `prepare`, for the refusal and the run."""
        return self.prepare is not None


REGISTRY = Registry(
    "drafter kind",
    "ecospec.drafters",
    lambda name, names: ValueError(f"unknown drafter kind {name!r}; allowed: {', '.join(names)}"),
    prefix="kind_",
)
register = REGISTRY.register
kinds = REGISTRY.all
names = REGISTRY.names
kind = REGISTRY.get


def as_is(drafter, **shape):
    """A kind's `prepare` where engine=compiled drafts with the drafter as it is: its own forward beside the compiled
    target (a draft model)."""
    return drafter


def labels() -> dict[str, str]:
    return {k.name: k.label for k in kinds()}
