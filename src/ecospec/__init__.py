"""ecospec: cost-aware speculative decoding for Mixture-of-Experts language models.

`generate`, `generate_batch`, `select` and `select_batch` are imported on first use, so tools that only read
records or data (`python -m ecospec.report`, `python -m ecospec.data`) do not pay for importing torch and
transformers.
"""

from importlib import import_module
from importlib.metadata import PackageNotFoundError, version
from importlib.resources import files
from pathlib import Path

try:
    __version__ = version("ecospec")
except PackageNotFoundError:  # running from a source tree that is not installed
    __version__ = "0+unknown"

_LAZY = {
    "generate": "ecospec.engine.loop",
    "generate_batch": "ecospec.engine.loop",
    "select": "ecospec.selection",
    "select_batch": "ecospec.selection",
}
__all__ = ["__version__", "conf_dir", "generate", "generate_batch", "select", "select_batch"]


def conf_dir() -> Path:
    """The Hydra configs (model/, method/, ...): package data, so a wheel install has them as the source tree does."""
    return Path(str(files(__name__) / "conf"))


def __getattr__(name: str):
    if name in _LAZY:
        return getattr(import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'ecospec' has no attribute {name!r}")
