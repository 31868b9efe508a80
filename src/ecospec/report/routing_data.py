"""The routing data the overlap paper's tables and figures read (`routing.py`, `routing_figures.py`): per model,
routing statistics from each kind of data (`Data`), and the drafted tokens of every traced record.

* "SD records": the committed sequences rebuilt from the verify-pass traces of the model's ok SD records
  (`analysis.traces.sequence_routes`; cells run with trace_steps > 0), pooled over records, with the datasets as
  the data slices (Table 18's spread). At T = 0 every method commits the same greedy sequence, so a (dataset,
  prompt, turn) enters once (its longest trace); sampled (T > 0) sequences all enter.
* "vLLM records": the committed sequences of `backend=vllm` records run with `backend.routed_experts=true`, routed by
  vLLM itself (`vllm_backend.routes`), pooled the same way: a second engine's routing beside ours.
* "tiny corpus": for a tiny model (config source `tiny`) the routing traces of its build (`ecospec.tiny.build`,
  stage `traces`: the target over corpus windows), when that build is on this machine.
"""

from __future__ import annotations

import warnings
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from ecospec import sources
from ecospec.analysis.ipf import unique_experts
from ecospec.analysis.overlap import Pooled, pooled
from ecospec.analysis.traces import DraftTokens, draft_tokens, sequence_routes
from ecospec.predictor.trace_files import MANIFEST, load_traces
from ecospec.tiny.stages import paths, source

WINDOW = 4  # tokens per unique-expert window: the paper's K = 3 drafts + the root
MAX_DISTANCE = 4  # step distances of Table 17
RECORDS, VLLM_RECORDS, CORPUS = "SD records", "vLLM records", "tiny corpus"
DATA_ORDER = (RECORDS, VLLM_RECORDS, CORPUS)


@dataclass(frozen=True)
class RoutingSource:
    """Routing statistics of one model from one kind of data."""

    model: str
    data: str  # one of DATA_ORDER
    stats: Pooled  # slices: datasets (records) or the one corpus slice
    sequences: int
    used: pd.DataFrame  # the records behind it (none for a corpus)
    ipf_uniform: float
    ipf_skewed: float


@dataclass
class RoutingData:
    """What the overlap tables and figures read: routing sources, and the drafted tokens of each traced record."""

    sources: list[RoutingSource] = field(default_factory=list)
    traced: pd.DataFrame = field(default_factory=pd.DataFrame)  # the traced ok records (no trace column)
    tokens: dict[str, DraftTokens] = field(default_factory=dict)  # record path -> its drafted tokens

    def models(self) -> list[str]:
        return list(dict.fromkeys(s.model for s in self.sources))


def _has_trace(t) -> bool:
    return isinstance(t, list) and len(t) > 0


def _ipf(stats, loads=None) -> float:
    try:
        return unique_experts(stats.k, stats.n_experts, stats.overlap[: WINDOW - 1], WINDOW, loads)
    except ValueError:  # overlaps undefined (short sequences) or infeasible for the loads
        return float("nan")


def _source(model: str, data: str, routes: list, slices: list, n_experts: int, used: pd.DataFrame) -> RoutingSource:
    stats = pooled(routes, n_experts, slices, MAX_DISTANCE, WINDOW)
    return RoutingSource(model, data, stats, len(routes), used, _ipf(stats.all), _ipf(stats.all, stats.all.probs))


def _trace_sequences(rec) -> list[tuple[tuple, np.ndarray]]:
    return sequence_routes(rec.trace)


def _vllm_sequences(rec) -> list[tuple[tuple, np.ndarray]]:
    return [((r["prompt"], r["turn"]), np.asarray(r["routes"], dtype=np.int64)) for r in rec.routes]


def _record_sources(traced: pd.DataFrame, data: str, sequences) -> list[RoutingSource]:
    """One source per model from its records' committed sequences (`sequences(record)`: ((prompt, turn), routes))."""
    out = []
    for model, rows in traced.groupby("model", sort=True):
        seqs: dict[tuple, tuple[str, np.ndarray]] = {}
        for rec in rows.itertuples():
            runs: Counter = Counter()  # a (prompt, turn) whose trace has a gap gives several runs
            for (prompt, turn), routes in sequences(rec):
                runs[prompt, turn] += 1
                key = (prompt, turn, runs[prompt, turn]) + ((rec.dataset,) if rec.temperature == 0 else (rec.path,))
                if key not in seqs or len(routes) > len(seqs[key][1]):
                    seqs[key] = (rec.dataset, routes)
        shapes = Counter(r.shape[1:] for _, r in seqs.values())
        shape = shapes.most_common(1)[0][0]
        if len(shapes) > 1:
            warnings.warn(f"model {model}: {data} routes of other [layers, k] than {shape} left out", stacklevel=3)
        kept = [(d, r) for d, r in seqs.values() if r.shape[1:] == shape]
        n = rows["num_experts"].dropna()
        n_experts = int(n.mode().iloc[0]) if len(n) else int(max(r.max() for _, r in kept)) + 1
        used = rows.drop(columns=["trace", "routes", "expert_load"], errors="ignore")
        out.append(_source(model, data, [r for _, r in kept], [d for d, _ in kept], n_experts, used))
    return out


def corpus_routes(model_config: Mapping) -> tuple[list[np.ndarray], int] | None:
    """The routing traces of a tiny model's build on this machine (one array [tokens, layers, k] per corpus window)
    and N; None for another model or when a cache build has no traces. The release ships none: they are traced from
    it on first use (``tiny.build``, about a minute) and kept in the cache."""
    if not sources.builtin(model_config):
        return None
    try:
        budget = model_config.get("budget") or "full"
        folder = paths(budget)["traces"]
        if not (folder / MANIFEST).exists():
            if source(budget) != "release":
                return None  # a cache build without its traces stage: nothing to read
            from ecospec.tiny.build import build  # torch: only to trace the release, once

            build(budget, until="traces", progress=False)  # traced from the release once, then kept
        traces = load_traces(folder)
    except (OSError, ValueError, KeyError) as e:
        warnings.warn(f"model {model_config.get('name')}: tiny build traces unreadable ({e})", stacklevel=2)
        return None
    if traces.num_samples == 0:
        return None
    return [traces.sample(i)[1] for i in range(traces.num_samples)], traces.num_experts


def collect(frame: pd.DataFrame, model_configs: Mapping[str, Mapping] | None = None) -> RoutingData:
    """Routing sources of every model with traced ok SD records or a tiny build with traces, and the drafted tokens
    of every traced record. Budgeted records (MoE-Spec's cap re-routes tokens) are not the target's routing."""
    ok = frame[frame["status"] == "ok"] if "status" in frame else frame.iloc[0:0]
    if "expert_budget" in ok:
        ok = ok[ok["expert_budget"].isna()]
    # astype(bool): on an empty frame the mapped mask is of dtype object, and indexing by it drops every column
    traced = ok[ok["trace"].map(_has_trace).astype(bool)] if "trace" in ok else ok.iloc[0:0]
    routed = ok[ok["routes"].map(_has_trace).astype(bool)] if "routes" in ok else ok.iloc[0:0]
    data = RoutingData(traced=traced.drop(columns=["trace", "routes", "expert_load"], errors="ignore"))
    if len(traced):
        data.sources = _record_sources(traced, RECORDS, _trace_sequences)
        data.tokens = {rec.path: draft_tokens(rec.trace) for rec in traced.itertuples()}
    if len(routed):
        data.sources += _record_sources(routed, VLLM_RECORDS, _vllm_sequences)
    for model, cfg in sorted((model_configs or {}).items()):
        corpus = corpus_routes(cfg)
        if corpus is not None:
            routes, n = corpus
            none = data.traced.iloc[0:0]
            data.sources.append(_source(model, CORPUS, routes, [CORPUS] * len(routes), n, none))
    order = {m: i for i, m in enumerate(sorted({s.model for s in data.sources}))}
    data.sources.sort(key=lambda s: (order[s.model], DATA_ORDER.index(s.data)))
    return data


def data_label(s: RoutingSource, slice_name: str | None = None) -> str:
    if s.data == CORPUS:
        return f"{CORPUS} ({s.sequences} windows)"
    if slice_name is None:
        return f"{s.data}: pooled ({s.sequences} sequences, {len(s.stats.slices)} datasets)"
    return f"{s.data}: {slice_name}"
