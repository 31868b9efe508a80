"""Prompt formats of the seven benchmarks (paper Appendix E), as pure string functions."""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

# GSM8K answers carry calculator annotations such as "<<48/2=24>>"; the few-shot CoT text drops them.
_CALCULATOR = re.compile(r"<<[^<>]*>>")


@dataclass(frozen=True)
class Prompt:
    """One evaluation prompt: a stable id and the formatted user turns (two for mtbench, one elsewhere).
    ``completion`` marks a raw code continuation (humaneval), never wrapped in a chat template."""

    id: str
    turns: tuple[str, ...]
    completion: bool = False


def gsm8k_exemplar(question: str, answer: str) -> str:
    """A GSM8K train row as a CoT exemplar: its "#### n" line becomes "The answer is n."."""
    reasoning, _, final = answer.rpartition("####")
    reasoning = _CALCULATOR.sub("", reasoning).strip()
    return f"Question: {question.strip()}\nAnswer: {reasoning}\nThe answer is {final.strip()}."


def gsm8k_turn(question: str, exemplars: Sequence[tuple[str, str]]) -> str:
    """Standard few-shot CoT: the exemplars, then the test question with an open "Answer:"."""
    shots = [gsm8k_exemplar(q, a) for q, a in exemplars]
    return "\n\n".join([*shots, f"Question: {question.strip()}\nAnswer:"])


def aime_turn(question: str) -> str:
    return f"{question.strip()}\nPlease reason step by step, and put your final answer within \\boxed{{}}."


def problem_turn(problem: str) -> str:
    """MATH500 and AMC zero-shot format."""
    return f"Problem:\n{problem.strip()}\n\nSolution:"
