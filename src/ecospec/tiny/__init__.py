"""The embedded default: a tokenizer, a small Qwen3-MoE target, its EAGLE-3 head and expert predictor, trained on
CPU from the interpreter's own standard library by the recipe here, and released once in ``tiny/release/``.

    from ecospec.tiny import load_tiny
    target, tokenizer, drafter, predictor = load_tiny()   # the release, checked in place; nothing trains

See ``ecospec.tiny.release`` for the release, ``ecospec.tiny.build`` for the cache layout, ``ecospec.tiny.budgets``
for the budgets, ``corpus`` and ``target`` for the recipes.
"""

from ecospec.cache import cache_root
from ecospec.lazy import lazy_attributes
from ecospec.tiny.budgets import BUDGETS, Budget, CorpusRecipe, TargetRecipe, get_budget
from ecospec.tiny.stages import paths, source, version

# imported on first use: these modules load torch and transformers, which what only reads a build's files (the cost
# model, the report) does without
LAZY = {
    "ecospec.tiny.build": (
        "STAGES",
        "Context",
        "Stage",
        "build",
        "load_tiny",
        "load_tiny_target",
        "load_tiny_tokenizer",
        "status",
    ),
    "ecospec.tiny.target": (
        "RoutingImbalanceError",
        "check_routing",
        "routing_load_stats",
        "routing_stats_from_routes",
    ),
}

__getattr__ = lazy_attributes(__name__, LAZY)

__all__ = [
    "BUDGETS",
    "STAGES",
    "Budget",
    "Context",
    "CorpusRecipe",
    "RoutingImbalanceError",
    "Stage",
    "TargetRecipe",
    "build",
    "cache_root",
    "check_routing",
    "get_budget",
    "load_tiny",
    "load_tiny_target",
    "load_tiny_tokenizer",
    "paths",
    "routing_load_stats",
    "routing_stats_from_routes",
    "source",
    "status",
    "version",
]
