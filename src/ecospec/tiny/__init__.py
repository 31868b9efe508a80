"""The embedded default: a tokenizer, a small Qwen3-MoE target (and later its drafter, routing traces and
expert predictor) trained on CPU from the interpreter's own standard library, once, and cached.

    from ecospec.tiny import load_tiny_target, load_tiny_tokenizer
    target = load_tiny_target()        # builds on first use (python -m ecospec.tiny build)
    tok = load_tiny_tokenizer()

See ``ecospec.tiny.build`` for the cache layout and the budgets, ``corpus`` and ``target`` for the recipes.
"""

from ecospec.tiny.build import (
    BUDGETS,
    STAGES,
    Budget,
    Context,
    CorpusRecipe,
    Stage,
    build,
    cache_root,
    get_budget,
    load_tiny_target,
    load_tiny_tokenizer,
    paths,
    status,
    version,
)
from ecospec.tiny.target import (
    RoutingImbalanceError,
    TargetRecipe,
    check_routing,
    routing_load_stats,
    routing_stats_from_routes,
)

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
    "load_tiny_target",
    "load_tiny_tokenizer",
    "paths",
    "routing_load_stats",
    "routing_stats_from_routes",
    "status",
    "version",
]
