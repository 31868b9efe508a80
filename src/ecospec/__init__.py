"""ecospec: cost-aware speculative decoding for Mixture-of-Experts language models."""

from ecospec.engine.loop import generate
from ecospec.selection import select

__all__ = ["generate", "select"]
