"""Routing traces: the target router's top-k experts for every token of a dataset (predictor labels).

Layout of a trace directory::

    manifest.json        target (family, MoE layers, N, k), shard_size, collection (how the samples were made),
                         shards, totals, complete
    shard-00000.npz      tokens int32 [T], offsets int64 [S+1] (sample s = tokens[offsets[s]:offsets[s+1]]),
                         routes uint8 (int16 if N > 256) [T, L, k], ids str [S] (sample ids, when given)
    ...

Shard j holds samples [first_sample, first_sample + samples) of the input, in order. Every file is
written to a temp name and renamed, shard before manifest, so a killed collection leaves only whole
shards; a rerun skips the samples of the finished shards and continues behind them (``TraceWriter.samples``).
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

import numpy as np
import torch
from tqdm import tqdm

from ecospec.atomic import write_file
from ecospec.engine.routing import RoutingCapture
from ecospec.models.adapters import moe_info
from ecospec.predictor.trace_files import FORMAT, MANIFEST


def _atomic_write(path: Path, write) -> None:
    write_file(path, write, text=False)


def _write_manifest(out: Path, manifest: dict) -> None:
    _atomic_write(out / MANIFEST, lambda f: f.write(json.dumps(manifest, indent=2).encode()))


def target_meta(target) -> dict:
    """What a trace directory records about its target (and checks on resume)."""
    info = moe_info(target)
    return {
        "family": info.family,
        "name_or_path": getattr(target.config, "_name_or_path", ""),
        "moe_layers": list(info.moe_layers),
        "num_experts": info.num_experts,
        "top_k": info.top_k,
    }


class TraceWriter:
    """Appends samples to a trace directory in whole shards, resuming what a killed run left there.

    `collection` describes how the samples were made (dataset, response length, ...); a directory holding
    traces of another target, shard size or collection is refused rather than mixed.
    """

    def __init__(
        self,
        out_dir: str | Path,
        meta: Mapping,
        shard_size: int,
        collection: Mapping | None = None,
        write: bool = True,
        fresh: bool = False,
    ):
        """`write=False` (the ranks other than 0 of a tensor-parallel job): keeps count like the writer, writes
        nothing; `fresh`: ignore what the directory holds (it is being replaced)."""
        if shard_size < 1:
            raise ValueError(f"shard_size must be >= 1, got {shard_size}")
        self.out = Path(out_dir)
        self.write = write
        if write:
            self.out.mkdir(parents=True, exist_ok=True)
        self.fresh = fresh
        self.manifest = self._start(dict(meta), shard_size, dict(collection or {}))
        self.route_dtype = np.uint8 if meta["num_experts"] <= 256 else np.int16
        self.pending: list[tuple[np.ndarray, np.ndarray, str | None]] = []
        self.manifest["complete"] = False

    def _start(self, meta: dict, shard_size: int, collection: dict) -> dict:
        path = self.out / MANIFEST
        if self.fresh or not path.exists():
            return {
                "format": FORMAT,
                "target": meta,
                "shard_size": shard_size,
                "collection": collection,
                "shards": [],
                "samples": 0,
                "tokens": 0,
            }
        manifest = json.loads(path.read_text())
        old = {k: v for k, v in manifest["target"].items() if k != "name_or_path"}
        new = {k: v for k, v in meta.items() if k != "name_or_path"}
        if old != new or manifest["shard_size"] != shard_size:
            raise ValueError(
                f"{self.out} holds traces of another target or shard size ({manifest['target']}, shard_size "
                f"{manifest['shard_size']}); use a new directory"
            )
        if manifest.get("collection", {}) != collection:
            raise ValueError(
                f"{self.out} holds traces collected with other settings ({manifest.get('collection')}, now "
                f"{collection}); use a new directory or delete it"
            )
        return manifest

    @property
    def samples(self) -> int:
        """Samples already written (a resumed run continues with the sample after them)."""
        return self.manifest["samples"] + len(self.pending)

    def add(self, tokens: Sequence[int] | np.ndarray, routes: np.ndarray, sample_id: str | None = None) -> None:
        """One sample: its token ids [t] and their routes [t, L, k]."""
        ids = np.asarray(tokens, dtype=np.int32).reshape(-1)
        routes = np.asarray(routes).astype(self.route_dtype)
        if routes.shape[0] != len(ids):
            raise ValueError(f"{len(ids)} tokens but routes for {routes.shape[0]}")
        self.pending.append((ids, routes, sample_id))
        if len(self.pending) == self.manifest["shard_size"]:
            self.flush()

    def flush(self) -> None:
        """Write the pending samples as one shard, then the manifest that lists it."""
        if not self.pending:
            return
        m = self.manifest
        tokens = np.concatenate([t for t, _, _ in self.pending])
        routes = np.concatenate([r for _, r, _ in self.pending])
        offsets = np.cumsum([0] + [len(t) for t, _, _ in self.pending], dtype=np.int64)
        arrays = {"tokens": tokens, "offsets": offsets, "routes": routes}
        if all(sid is not None for _, _, sid in self.pending):
            arrays["ids"] = np.array([sid for _, _, sid in self.pending], dtype=np.str_)
        name = f"shard-{len(m['shards']):05d}.npz"
        if self.write:
            _atomic_write(self.out / name, lambda f: np.savez(f, **arrays))
        m["shards"].append(
            {"file": name, "first_sample": m["samples"], "samples": len(self.pending), "tokens": len(tokens)}
        )
        m["samples"] += len(self.pending)
        m["tokens"] += len(tokens)
        if self.write:
            _write_manifest(self.out, m)
        self.pending.clear()

    def close(self) -> Path:
        """Flush and mark the directory complete."""
        self.flush()
        self.manifest["complete"] = True
        if self.write:
            _write_manifest(self.out, self.manifest)
        return self.out


@torch.no_grad()
def route_batch(target, sequences: Sequence[Sequence[int]]) -> list[np.ndarray]:
    """The routes [t, L, k] (int64) of each sequence, from one right-padded forward of the whole batch: causal
    attention never lets a real token see the padding behind it, so each equals the sequence's own forward."""
    lengths = [len(s) for s in sequences]
    width = max(lengths, default=0)
    info = moe_info(target)
    if width == 0:
        return [np.zeros((0, info.num_moe_layers, info.top_k), dtype=np.int64) for _ in sequences]
    batch = torch.zeros(len(sequences), width, dtype=torch.long)
    for row, seq in enumerate(sequences):
        batch[row, : len(seq)] = torch.as_tensor(list(seq), dtype=torch.long)
    with RoutingCapture(target) as cap:
        target(batch.to(target.device), use_cache=False, logits_to_keep=1)
        routes = cap.take()  # [L, B * width, k], batch-major
    per_row = routes.view(routes.shape[0], len(sequences), width, -1).permute(1, 2, 0, 3).numpy()  # [B, width, L, k]
    return [per_row[row, :n] for row, n in enumerate(lengths)]


@torch.no_grad()
def collect_traces(
    target,
    sequences: Iterable[Sequence[int]],
    out_dir: str | Path,
    shard_size: int = 256,
    progress: bool = False,
    batch_size: int = 1,
) -> Path:
    """Run `target` over each sample (a list of token ids) and store its routing, resuming a
    previous run in `out_dir` (samples already in finished shards are skipped, not recomputed).
    `batch_size` samples share one right-padded forward."""
    writer = TraceWriter(out_dir, target_meta(target), shard_size)
    todo = itertools.islice(sequences, writer.samples, None)
    bar = tqdm(desc="traces", disable=not progress, initial=writer.samples)
    while batch := list(itertools.islice(todo, batch_size)):
        for seq, routes in zip(batch, route_batch(target, batch), strict=True):
            writer.add(seq, routes)
        bar.update(len(batch))
    bar.close()
    return writer.close()
