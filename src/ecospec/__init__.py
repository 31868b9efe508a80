"""ecospec: cost-aware speculative decoding for Mixture-of-Experts language models."""

from importlib.metadata import PackageNotFoundError, version

from ecospec.engine.loop import generate
from ecospec.selection import select

try:
    __version__ = version("ecospec")
except PackageNotFoundError:  # running from a source tree that is not installed
    __version__ = "0+unknown"

__all__ = ["__version__", "generate", "select"]
