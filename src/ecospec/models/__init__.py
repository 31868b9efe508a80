"""Supported MoE targets: family adapters, tiny presets, loading. The names below load torch and transformers on
first use, so that `models.param_count` and `models.presets` (plain counting and data) import without them."""

from ecospec.lazy import lazy_attributes

LAZY = {
    "ecospec.models.adapters": (
        "SUPPORTED_CLASSES",
        "MoeInfo",
        "UnsupportedModelError",
        "config_moe_info",
        "moe_info",
        "routers",
    ),
    "ecospec.models.loading": ("TINY_INIT_STD", "load_target", "perturbed_copy", "tiny_config", "tiny_model"),
    "ecospec.models.presets": ("PRESETS",),
}

__all__ = sorted(name for names in LAZY.values() for name in names)

__getattr__ = lazy_attributes(__name__, LAZY)
