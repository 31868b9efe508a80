"""Drafters propose draft tokens: EAGLE-3 heads, DeepSeek MTP heads, a separate draft LM."""

from ecospec.drafters.draft_model import DraftModelDrafter
from ecospec.drafters.eagle3 import Eagle3Drafter
from ecospec.drafters.mtp import MtpDrafter, MtpHead

__all__ = ["DraftModelDrafter", "Eagle3Drafter", "MtpDrafter", "MtpHead"]
