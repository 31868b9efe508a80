"""Evaluation prompts available offline."""

from ecospec.data.humaneval import humaneval_prompts

__all__ = ["humaneval_prompts"]
