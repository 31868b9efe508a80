"""Reading a routing-trace directory (the layout `predictor.traces` writes and documents): plain numpy, no torch, so
that what only reads traces (the report's routing analysis) does not load a model's stack."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

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
    ids: list[str] | None = None  # sample ids (traces of benchmark samples), None for anonymous windows

    @property
    def num_samples(self) -> int:
        return len(self.offsets) - 1

    def sample(self, i: int) -> tuple[np.ndarray, np.ndarray]:
        """(tokens [t], routes [t, L, k]) of sample i."""
        a, b = self.offsets[i], self.offsets[i + 1]
        return self.tokens[a:b], self.routes[a:b]


def load_traces(trace_dir: str | Path) -> Traces:
    """Concatenate the shards listed in the manifest (in sample order)."""
    d = Path(trace_dir)
    manifest = json.loads((d / MANIFEST).read_text())
    if manifest.get("format") != FORMAT:
        raise ValueError(f"{d / MANIFEST} is not an ecospec routing-trace manifest")
    meta = manifest["target"]
    tokens, routes, offsets, ids, start = [], [], [np.zeros(1, dtype=np.int64)], [], 0
    for shard in manifest["shards"]:
        with np.load(d / shard["file"]) as z:
            tokens.append(z["tokens"])
            routes.append(z["routes"])
            offsets.append(z["offsets"][1:] + start)
            ids.append(z["ids"].tolist() if "ids" in z.files else None)
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
        ids=[i for part in ids for i in part] if ids and all(part is not None for part in ids) else None,
    )
