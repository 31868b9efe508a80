"""Run the pipeline end to end on the embedded default and print one line per method.

The embedded default is the tiny model set the project trains itself on CPU (a Qwen3-MoE target
with 32 experts / top-4, its EAGLE-3 head and its expert predictor), built once and cached by
`python -m ecospec.tiny build` (about 15 minutes on 2 cores the first time, seconds afterwards).
Until the Hydra grid entry point lands (configs, datasets, result records) this script evaluates
AR and each selector on a few HumanEval prompts.
"""

from __future__ import annotations

import importlib

import torch

from ecospec.tiny.evaluate import EvalRecipe, evaluate, evaluate_summary


def main(prompts: int = 6, max_new_tokens: int = 64) -> None:
    tiny = importlib.import_module("ecospec.tiny.build")
    tiny.build("full")  # cached after the first run
    torch.set_num_threads(2)
    result = evaluate(tiny.paths("full"), EvalRecipe(prompts=prompts, max_new_tokens=max_new_tokens))
    print("\n".join(evaluate_summary(result)))


if __name__ == "__main__":
    main()
