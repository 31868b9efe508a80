"""Supported MoE targets: family adapters, tiny presets, loading."""

from ecospec.models.adapters import (
    SUPPORTED_CLASSES,
    MoeInfo,
    UnsupportedModelError,
    config_moe_info,
    moe_info,
    routers,
)
from ecospec.models.loading import TINY_INIT_STD, load_target, perturbed_copy, tiny_config, tiny_model
from ecospec.models.presets import PRESETS

__all__ = [
    "PRESETS",
    "SUPPORTED_CLASSES",
    "TINY_INIT_STD",
    "MoeInfo",
    "UnsupportedModelError",
    "config_moe_info",
    "load_target",
    "moe_info",
    "perturbed_copy",
    "routers",
    "tiny_config",
    "tiny_model",
]
