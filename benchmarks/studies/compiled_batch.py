"""The compiled engine at batch sizes above 1: what a sequence that finishes early should become, on the embedded
default, AR decoding (one torch thread).

    python benchmarks/studies/compiled_batch.py [--batches 4,8,32] [--tokens 64] [--rounds 3] [--out reports/tiny]

Each batch mixes the held-out prompts of the four offline benchmarks. The tiny model rarely ends a sequence within
`--tokens`, so each sequence stops at a stop token chosen from a first eager decode (`stop_token`: of the tokens it
makes often, the one whose first appearance is most spread across the batch), and sequences finish at different
steps, as a real batch's do. The same batch is decoded three ways, interleaved round by round in one process: the
eager engine, and the compiled one with finished sequences masked at the fixed shape (the engine's rule,
`CompiledTarget`: one graph per block size) or leaving the batch (`LeavingTarget`, here: the live sequences move to
the next smaller prepared batch size, a power of two). Tokens must be equal across the three (checked); each way's
time is the median over rounds of the batch's decode wall time, prefill included. Warm-ups (compiles) are reported
apart and never timed.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch
from provenance import run_commit

import ecospec
from ecospec.engine.compiled import CompiledTarget, prepare
from ecospec.engine.scope import slots
from ecospec.experiment.records import hardware
from ecospec.tiny import load_tiny
from ecospec.tiny.calibrate import DATASETS as BENCHMARKS  # the four with an offline copy
from ecospec.tiny.evaluate import heldout_ids

FINISHED = ("mask", "leave")


class LeavingTarget(CompiledTarget):
    """The other rule: sequences that finish leave the batch. A `CompiledTarget` for the batch size, then every
    power of two below it, all prepared at once; when the sequences still decoding fit the next smaller one, their
    cache rows move there and the steps run its graphs. The loop's calls go to the one in use (a `CompiledTarget`
    to the loop, none of whose own state it uses)."""

    def __init__(self, sizes: list[CompiledTarget]):  # no super().__init__: it holds no rows itself
        self.sizes = sorted(sizes, key=lambda t: -t.rows)  # the largest first: a decode only moves down
        self.current = self.sizes[0]
        first = self.sizes[0]
        self.target, self.gamma, self.max_len, self.rows = first.target, first.gamma, first.max_len, first.rows
        self.hidden_layers = first.hidden_layers
        self.compile_s = sum(t.compile_s for t in self.sizes)
        self.static = first.static

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        for t in self.sizes:
            t.routes = []

    def prepare_parts(self, drafter, predictor, **shapes):
        return self.current.prepare_parts(drafter, predictor, **shapes)

    def prefill(self, prompts: list[torch.Tensor]):
        self.current = min((t for t in self.sizes if t.rows >= len(prompts)), key=lambda t: t.rows)
        return self.current.prefill(prompts)

    def verify(self, blocks):
        return self.current.verify(blocks)

    def compact(self, paths: list[list[int]]) -> None:
        self.current.compact(paths)

    def lookup(self, roots: list[int], trees) -> list[torch.Tensor]:
        return self.current.lookup(roots, trees)

    def drop(self, keep: list[int]) -> None:
        src = self.current
        src.drop(keep)
        smaller = [t for t in self.sizes if len(src.live) <= t.rows < src.rows]
        if not smaller:
            return
        dst = min(smaller, key=lambda t: t.rows)
        rows = torch.tensor(src.live, device=src.static.slot_ids.device)
        n = len(src.live)
        caches = zip(dst.static.k_cache + dst.static.v_cache, src.static.k_cache + src.static.v_cache, strict=True)
        for to, frm in caches:
            to[:n] = frm.index_select(0, rows)
        lengths = [src.lengths[r] for r in src.live]
        dst.lengths = lengths + [lengths[0]] * (dst.rows - n)  # rows no sequence uses: dummies
        dst.live, dst.routes = list(range(n)), []
        self.current = dst

    def take_routes(self) -> torch.Tensor:
        """Every counted pass's routes in pass order: the larger batch sizes' passes came first."""
        return torch.cat([t.take_routes() for t in self.sizes], dim=1)


def leaving(target, *, gamma: int, max_len: int, rows: int) -> LeavingTarget:
    """The graphs of blocks up to `gamma` for `rows` sequences and every power of two below, as one `LeavingTarget`."""
    sizes = sorted({rows, *(2**i for i in range(rows.bit_length()) if 2**i < rows)})
    return LeavingTarget([prepare(target, gamma=gamma, max_len=max_len, rows=r) for r in sizes])


def batch_prompts(tokenizer, size: int) -> list[torch.Tensor]:
    """`size` prompts taken in turn from the four benchmarks' held-out prompts."""
    per = heldout_ids(tokenizer, BENCHMARKS, -(-size // len(BENCHMARKS)))
    mixed = [per[name][i][0] for i in range(len(per[BENCHMARKS[0]])) for name in BENCHMARKS]
    return mixed[:size]


def stop_token(outputs: list[list[int]], tokens: int) -> int:
    """Of the 20 tokens the batch makes most often, the one whose first position in each sequence (`tokens` where
    it never appears) varies most across the batch."""
    from collections import Counter

    common = [t for t, _ in Counter(t for out in outputs for t in out).most_common(20)]
    first = lambda t: [out.index(t) if t in out else tokens for out in outputs]  # noqa: E731
    return max(common, key=lambda t: statistics.pvariance(first(t)))


def run(batches: list[int], tokens: int, rounds: int) -> dict:
    torch.set_num_threads(1)
    target, tokenizer, _, _ = load_tiny()
    out = {"tokens": tokens, "rounds": rounds, "batches": {}}
    with torch.inference_mode():
        for size in batches:
            prompts = batch_prompts(tokenizer, size)
            longest = max(p.shape[0] for p in prompts) + tokens + 1
            engines, warm = {"eager": "eager"}, {}
            for way in FINISHED:
                t0 = time.perf_counter()
                make = prepare if way == "mask" else leaving
                engines[way] = make(target, gamma=1, max_len=slots(longest), rows=size)
                warm[way] = round(time.perf_counter() - t0, 1)
            free = ecospec.generate_batch(target, prompts, max_new_tokens=tokens, eos_token_id=[])
            stop = stop_token([r.tokens for r in free.results], tokens)
            times = {name: [] for name in engines}
            results = {}
            for _ in range(rounds):
                for name, engine in engines.items():
                    t0 = time.perf_counter()
                    res = ecospec.generate_batch(
                        target, prompts, max_new_tokens=tokens, eos_token_id=[stop], engine=engine
                    )
                    times[name].append(time.perf_counter() - t0)
                    results[name] = [r.tokens for r in res.results]
            if not results["eager"] == results["mask"] == results["leave"]:
                raise RuntimeError(f"B={size}: the compiled engine's tokens differ from the eager engine's")
            lengths = [len(t) for t in results["eager"]]
            med = {name: statistics.median(ts) for name, ts in times.items()}
            out["batches"][str(size)] = {
                "stop_token": stop,
                "new_tokens": lengths,
                "warm_up_s": warm,
                "seconds": {k: [round(t, 4) for t in v] for k, v in times.items()},
                "median_s": {k: round(v, 4) for k, v in med.items()},
                "leave_over_mask": round(med["leave"] / med["mask"], 3),
                "compiled_over_eager": {w: round(med[w] / med["eager"], 3) for w in FINISHED},
            }
            print(
                f"B={size}: new tokens {min(lengths)}..{max(lengths)}, median s eager {med['eager']:.3f}, "
                f"mask {med['mask']:.3f}, leave {med['leave']:.3f} (leave/mask {med['leave'] / med['mask']:.3f}); "
                f"warm-up mask {warm['mask']} s, leave {warm['leave']} s",
                flush=True,
            )
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--batches", default="4,8,32", help="batch sizes, comma-separated")
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--out", type=Path, default=None, help="write compiled_batch.json there")
    a = ap.parse_args()
    res = run([int(b) for b in a.batches.split(",")], a.tokens, a.rounds)
    res["commit"] = run_commit()
    res["machine"] = hardware(torch.device("cpu"))
    if a.out:
        a.out.mkdir(parents=True, exist_ok=True)
        (a.out / "compiled_batch.json").write_text(json.dumps(res, indent=1) + "\n")


if __name__ == "__main__":
    main()
