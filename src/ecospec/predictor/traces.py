"""Routing traces: the target router's top-k experts for every token of a dataset (predictor labels).

Layout of a trace directory::

    manifest.json        target (family, MoE layers, N, k), shard_size, shards, totals, complete
    shard-00000.npz      tokens int32 [T], offsets int64 [S+1] (sample s = tokens[offsets[s]:offsets[s+1]]),
                         routes uint8 (int16 if N > 256) [T, L, k]
    ...

Shard j holds samples [first_sample, first_sample + samples) of the input, in order. Every file is
written to a temp name and renamed, shard before manifest, so a killed collection leaves only whole
shards; a rerun skips the samples of the finished shards and continues behind them.
"""

from __future__ import annotations

import itertools
import json
import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from tqdm import tqdm

from ecospec.engine.routing import RoutingCapture
from ecospec.models.adapters import moe_info

FORMAT = "ecospec-routing-traces"
MANIFEST = "manifest.json"


@dataclass
class Traces:
    """All samples of a trace directory, concatenated."""

    tokens: np.ndarray  # int32 [T]
    offsets: np.ndarray  # int64 [S + 1]
    routes: np.ndarray  # uint8 / int16 [T, L, k]
    num_experts: int
    top_k: int
    moe_layers: tuple[int, ...]

    @property
    def num_samples(self) -> int:
        return len(self.offsets) - 1

    def sample(self, i: int) -> tuple[np.ndarray, np.ndarray]:
        """(tokens [t], routes [t, L, k]) of sample i."""
        a, b = self.offsets[i], self.offsets[i + 1]
        return self.tokens[a:b], self.routes[a:b]


def _atomic_write(path: Path, write) -> None:
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as f:
        write(f)
    os.replace(tmp, path)


def _write_manifest(out: Path, manifest: dict) -> None:
    _atomic_write(out / MANIFEST, lambda f: f.write(json.dumps(manifest, indent=2).encode()))


def _target_meta(target) -> dict:
    info = moe_info(target)
    return {
        "family": info.family,
        "name_or_path": getattr(target.config, "_name_or_path", ""),
        "moe_layers": list(info.moe_layers),
        "num_experts": info.num_experts,
        "top_k": info.top_k,
    }


def _start_manifest(out: Path, meta: dict, shard_size: int) -> dict:
    """The existing manifest (checked against this target and shard size), or a new empty one."""
    path = out / MANIFEST
    if not path.exists():
        return {"format": FORMAT, "target": meta, "shard_size": shard_size, "shards": [], "samples": 0, "tokens": 0}
    manifest = json.loads(path.read_text())
    old = {k: v for k, v in manifest["target"].items() if k != "name_or_path"}
    new = {k: v for k, v in meta.items() if k != "name_or_path"}
    if old != new or manifest["shard_size"] != shard_size:
        raise ValueError(
            f"{out} holds traces of another target or shard size ({manifest['target']}, shard_size "
            f"{manifest['shard_size']}); use a new directory"
        )
    return manifest


@torch.no_grad()
def collect_traces(
    target,
    sequences: Iterable[Sequence[int]],
    out_dir: str | Path,
    shard_size: int = 256,
    progress: bool = False,
) -> Path:
    """Run `target` over each sample (a list of token ids) and store its routing, resuming a
    previous run in `out_dir` (samples already in finished shards are skipped, not recomputed)."""
    if shard_size < 1:
        raise ValueError(f"shard_size must be >= 1, got {shard_size}")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    meta = _target_meta(target)
    manifest = _start_manifest(out, meta, shard_size)
    num_layers, k = len(meta["moe_layers"]), meta["top_k"]
    route_dtype = np.uint8 if meta["num_experts"] <= 256 else np.int16
    samples: list[tuple[np.ndarray, np.ndarray]] = []

    def flush() -> None:
        tokens = np.concatenate([t for t, _ in samples])
        routes = np.concatenate([r for _, r in samples])
        offsets = np.cumsum([0] + [len(t) for t, _ in samples], dtype=np.int64)
        name = f"shard-{len(manifest['shards']):05d}.npz"
        _atomic_write(out / name, lambda f: np.savez(f, tokens=tokens, offsets=offsets, routes=routes))
        entry = {"file": name, "first_sample": manifest["samples"], "samples": len(samples), "tokens": len(tokens)}
        manifest["shards"].append(entry)
        manifest["samples"] += len(samples)
        manifest["tokens"] += len(tokens)
        _write_manifest(out, manifest)
        samples.clear()

    manifest["complete"] = False
    todo = itertools.islice(sequences, manifest["samples"], None)
    with RoutingCapture(target) as cap:
        for seq in tqdm(todo, desc="traces", disable=not progress, initial=manifest["samples"]):
            ids = np.asarray(seq, dtype=np.int32).reshape(-1)
            routes = np.zeros((0, num_layers, k), dtype=route_dtype)
            if len(ids):
                target(torch.from_numpy(ids).long()[None].to(target.device), use_cache=False, logits_to_keep=1)
                routes = cap.take().transpose(0, 1).numpy().astype(route_dtype)  # [T, L, k]
            samples.append((ids, routes))
            if len(samples) == shard_size:
                flush()
    if samples:
        flush()
    manifest["complete"] = True
    _write_manifest(out, manifest)
    return out


def load_traces(trace_dir: str | Path) -> Traces:
    """Concatenate the shards listed in the manifest (in sample order)."""
    d = Path(trace_dir)
    manifest = json.loads((d / MANIFEST).read_text())
    if manifest.get("format") != FORMAT:
        raise ValueError(f"{d / MANIFEST} is not an ecospec routing-trace manifest")
    meta = manifest["target"]
    tokens, routes, offsets, start = [], [], [np.zeros(1, dtype=np.int64)], 0
    for shard in manifest["shards"]:
        with np.load(d / shard["file"]) as z:
            tokens.append(z["tokens"])
            routes.append(z["routes"])
            offsets.append(z["offsets"][1:] + start)
        start += len(tokens[-1])
    k, num_layers = meta["top_k"], len(meta["moe_layers"])
    dtype = np.uint8 if meta["num_experts"] <= 256 else np.int16
    return Traces(
        tokens=np.concatenate(tokens) if tokens else np.zeros(0, dtype=np.int32),
        offsets=np.concatenate(offsets),
        routes=np.concatenate(routes) if routes else np.zeros((0, num_layers, k), dtype=dtype),
        num_experts=meta["num_experts"],
        top_k=k,
        moe_layers=tuple(meta["moe_layers"]),
    )
