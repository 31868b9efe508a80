"""ecospec: cost-aware speculative decoding for Mixture-of-Experts language models.

`generate`, `generate_batch`, `select` and `select_batch` are imported on first use, so tools that only read
records or data (`python -m ecospec.report`, `python -m ecospec.data`) do not pay for importing torch and
transformers.
"""

from importlib import import_module
from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("ecospec")
except PackageNotFoundError:  # running from a source tree that is not installed
    __version__ = "0+unknown"

_LAZY = {
    "generate": "ecospec.engine.loop",
    "generate_batch": "ecospec.engine.batch_loop",
    "select": "ecospec.selection",
    "select_batch": "ecospec.selection",
}
__all__ = ["__version__", "generate", "generate_batch", "select", "select_batch"]


def __getattr__(name: str):
    if name in _LAZY:
        return getattr(import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'ecospec' has no attribute {name!r}")
