"""The tiny build's stages as plain data (name, revision, recipe, whether optional) and what follows from them
without running one: a budget's identity, its cache folder and where its files are (`paths`). No torch: the cost
model and the report read a build's files through this module; `tiny.build` gives each stage its run."""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from ecospec.cache import cache_root
from ecospec.identity import release_identity, tiny_version
from ecospec.tiny.budgets import BUDGETS, Budget, calibrate_recipe, get_budget
from ecospec.tiny.layout import RELEASE_DIR
from ecospec.tiny.release import verify

ENV_SOURCE = "ECOSPEC_TINY"  # release (default) | cache: which full-budget models every caller gets


@dataclass(frozen=True)
class StageSpec:
    """A stage's place in the key: ``recipe(budget)`` is the knobs it depends on (default: the budget field named
    like the stage); ``revision``: bump when its run changes; ``optional``: built only when asked for
    (`build(..., until=name)` or `extra`), never by default."""

    name: str
    revision: str = "1"
    optional: bool = False
    recipe: Callable[[Budget], Any] | None = None

    def recipe_of(self, budget: Budget) -> Any:
        if self.recipe is not None:
            return self.recipe(budget)
        value = getattr(budget, self.name, None)
        return asdict(value) if hasattr(value, "__dataclass_fields__") else value


SPECS: tuple[StageSpec, ...] = (
    StageSpec("corpus"),
    StageSpec("target"),
    StageSpec("drafter", revision="2"),  # EAGLE-3 head (ecospec.drafters.eagle3_train); 2: the speculators layout
    StageSpec("traces"),  # routing traces for the predictor
    StageSpec("predictor"),  # expert predictor (ecospec.predictor)
    StageSpec("evaluate"),  # alpha, E, T_pred on HumanEval prompts
    StageSpec("gto", revision="2", optional=True),  # the GTO head (method=gto), on use
    # the EAGLE-3 head's draft temperature (ecospec.tiny.calibrate); last, so that no stage before it rebuilds
    StageSpec("calibrate", recipe=calibrate_recipe),
)


def recipe_identity(budget: str | Budget = "full") -> str:
    """Hash of what shapes the budget's weights (`identity.release_identity` of the stages): what a release of it
    carries and is checked against."""
    return release_identity(SPECS, get_budget(budget))


def version(budget: str | Budget = "full") -> str:
    """The cache folder's name (`identity.tiny_version`): the recipe's identity and this Python's minor version."""
    return tiny_version(recipe_identity(budget))


def source(budget: str | Budget = "full", choice: str | None = None) -> str:
    """Where the budget's models come from: ``release`` (the shipped one: the full budget, unless ``$ECOSPEC_TINY``
    or `choice` says ``cache``) or ``cache`` (trained here, on first use)."""
    choice = choice or os.environ.get(ENV_SOURCE) or "release"
    if choice not in ("release", "cache"):
        raise ValueError(
            f"{ENV_SOURCE}={choice!r}: choose release (the shipped embedded default) or cache (train here)"
        )
    b = get_budget(budget)
    return "release" if choice == "release" and b == BUDGETS["full"] else "cache"


def root_dir(budget: str | Budget = "full") -> Path:
    return cache_root() / f"tiny-{version(budget)}"


def on_release_dir(budget: str | Budget = "full") -> Path:
    """Where stages the release does not ship (the routing traces) are built on top of it, by release identity."""
    return cache_root() / f"tiny-release-{recipe_identity(budget)}"


def paths(budget: str | Budget = "full", choice: str | None = None) -> dict[str, Path]:
    """Directories of the build (they exist once built) or of the release (checked first: ``source``): ``root``,
    one per stage, and shortcuts ``tokenizer`` (HF tokenizer dir) and ``target_model`` (HF model dir, tokenizer
    files included). The release ships no ``traces``: theirs is a cache folder (``on_release_dir``) that
    ``build(until="traces")`` fills on first use."""
    released = source(budget, choice) == "release"
    if released:
        verify(recipe_identity(budget))
        root = RELEASE_DIR
    else:
        root = root_dir(budget)
    out = {"root": root, **{s.name: root / s.name for s in SPECS}}
    if released:  # the release ships no traces: they are made here on first use
        out["traces"] = on_release_dir(budget) / "traces"
    out["tokenizer"] = root / "corpus" / "tokenizer"
    out["target_model"] = root / "target" / "model"
    return out
