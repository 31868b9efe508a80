"""Drafters propose draft tokens: EAGLE-3 heads, DeepSeek MTP heads, a separate draft LM. Each kind a config can
name (`method.drafter`, `model.drafters.<kind>`) is a `kind_*.py` module of this package that registers a
`DrafterKind` (`drafters.registry`: its label, whether the compiled engine drafts with it, how a cell builds it).
The classes are imported on first use, so validation and the reports read the registry without torch."""

from importlib import import_module

_LAZY = {
    "DraftModelDrafter": "ecospec.drafters.draft_model",
    "Eagle3Drafter": "ecospec.drafters.eagle3",
    "MtpDrafter": "ecospec.drafters.mtp",
    "MtpHead": "ecospec.drafters.mtp",
}
__all__ = list(_LAZY)


def __getattr__(name: str):
    if name in _LAZY:
        return getattr(import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'ecospec.drafters' has no attribute {name!r}")
