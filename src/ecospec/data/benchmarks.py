"""The seven benchmarks: where each lives on the Hugging Face Hub and how a row becomes a Prompt."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from ecospec.data.formats import Prompt, aime_turn, gsm8k_turn, problem_turn

Row = dict
# (row, position in dataset order, exemplar rows) -> Prompt
ToPrompt = Callable[[Row, int, list[Row]], Prompt]


@dataclass(frozen=True)
class Benchmark:
    name: str
    hf_id: str
    configs: tuple[str | None, ...]  # loaded one after another and concatenated in this order
    split: str
    fields: tuple[str, ...]  # the columns read; everything else (e.g. MMStar's image) is dropped
    to_prompt: ToPrompt
    exemplar_split: str | None = None  # few-shot exemplars: the first `n_exemplars` rows of this split
    n_exemplars: int = 0


def _gsm8k(row: Row, i: int, shots: list[Row]) -> Prompt:
    return Prompt(f"gsm8k/{i}", (gsm8k_turn(row["question"], [(s["question"], s["answer"]) for s in shots]),))


def _humaneval(row: Row, i: int, shots: list[Row]) -> Prompt:
    number = row["task_id"].rsplit("/", 1)[1]
    return Prompt(f"humaneval/{number}", (row["prompt"],), completion=True)


def _aime25(row: Row, i: int, shots: list[Row]) -> Prompt:
    return Prompt(f"aime25/{i}", (aime_turn(row["question"]),))


def _math500(row: Row, i: int, shots: list[Row]) -> Prompt:
    return Prompt(f"math500/{i}", (problem_turn(row["problem"]),))


def _amc(row: Row, i: int, shots: list[Row]) -> Prompt:
    return Prompt(f"amc/{row['id']}", (problem_turn(row["problem"]),))


# MT-Bench prompt ids are FastChat's question ids, 81..160, taken from the row position (HF's mt_bench_prompts keeps
# FastChat's order but has no question_id; its prompt_id is a hash of the text, which no other copy carries).
MTBENCH_FIRST_QUESTION_ID = 81


def _mtbench(row: Row, i: int, shots: list[Row]) -> Prompt:
    return Prompt(f"mtbench/{MTBENCH_FIRST_QUESTION_ID + i}", tuple(turn.strip() for turn in row["prompt"]))


def _mmstar(row: Row, i: int, shots: list[Row]) -> Prompt:
    return Prompt(f"mmstar/{row['index']}", (row["question"].strip(),))


BENCHMARKS: dict[str, Benchmark] = {
    b.name: b
    for b in (
        Benchmark(
            "gsm8k",
            "openai/gsm8k",
            ("main",),
            "test",
            ("question", "answer"),
            _gsm8k,
            exemplar_split="train",
            n_exemplars=5,
        ),
        Benchmark("humaneval", "openai/openai_humaneval", (None,), "test", ("task_id", "prompt"), _humaneval),
        Benchmark("aime25", "opencompass/AIME2025", ("AIME2025-I", "AIME2025-II"), "test", ("question",), _aime25),
        Benchmark("math500", "HuggingFaceH4/MATH-500", (None,), "test", ("problem",), _math500),
        Benchmark("amc", "AI-MO/aimo-validation-amc", (None,), "train", ("id", "problem"), _amc),
        Benchmark("mtbench", "HuggingFaceH4/mt_bench_prompts", (None,), "train", ("prompt",), _mtbench),
        Benchmark("mmstar", "Lin-Chen/MMStar", (None,), "val", ("index", "question"), _mmstar),
    )
}
DATASETS: tuple[str, ...] = tuple(BENCHMARKS)
