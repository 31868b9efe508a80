"""What a compiled cell's first run costs on a fresh machine, and where: the CPU kernels' build and each graph the
cell prepares (the target's AR graph, its graphs for the method's block sizes, the EAGLE-3 head's and the
predictor's), each timed from nothing in a child process whose `$ECOSPEC_CACHE` is empty (the embedded default
comes from the release, as in a fresh clone).

    python benchmarks/studies/cold_start.py [--method ecospec_adaptive] [--wrapper joint,engine] [--scratch DIR]

`--wrapper`: how each graph's C++ wrapper is built, one child per value in that order (`joint`: every graph's with
its kernels in one -O3 build, torch's way; `engine`: the engine's rule, lean for the block sizes between 1 and γ:
`graphs.compile_method`). Each child then times each block size's verify step (median of `--calls` calls after a
300-token prefill, the sizes in rounds), so that a cheaper build that slows a step shows. One torch thread; inductor
compiles with its default worker count.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve()


def child(method: str, wrapper: str, calls: int) -> dict:
    """Run in the child: prepare every graph of a `method` cell cold, timed part by part, then time each block size's
    step in rounds (`bench.passes.timed_in_rounds`)."""
    import torch

    import ecospec.methods
    from ecospec.bench.passes import timed_in_rounds
    from ecospec.components import load_build
    from ecospec.engine import compiled, graphs, static_qwen3
    from ecospec.engine.compiled import prepare
    from ecospec.engine.scope import slots
    from ecospec.engine.static_eagle3 import prepare_drafter
    from ecospec.engine.static_predictor import prepare_predictor
    from ecospec.tiny.build import paths

    torch.set_num_threads(1)
    if wrapper == "joint":
        compiled.compile_method = lambda obj, fn, lean=False: graphs.compile_method(obj, fn)
    target, _, drafter, predictor = load_build(paths("full"))
    session = ecospec.methods.method(method).open(6, 3, 2)
    gamma, (depth, topk) = session.gamma, session.draft_shape
    size = slots(300 + 64 + gamma)
    out: dict = {"wrapper": wrapper, "method": method, "parts": {}}

    def timed(name, fn):
        t0 = time.perf_counter()
        made = fn()
        out["parts"][name] = round(time.perf_counter() - t0, 1)
        return made

    timed("cpu kernels", static_qwen3.cpu_kernels)
    timed("target, AR (q = 1)", lambda: prepare(target, gamma=1, max_len=size))
    sizes = tuple(s for s in session.block_sizes if s <= gamma)
    hidden = tuple(drafter.hidden_layers)
    sd = timed(
        f"target, speculative (q = {', '.join(map(str, sorted({1, gamma, *sizes})))})",
        lambda: prepare(target, gamma=gamma, max_len=size, hidden_layers=hidden, sizes=sizes),
    )
    depths = session.draft_depths
    timed(
        f"EAGLE-3 head (depths {', '.join(map(str, depths))})",
        lambda: prepare_drafter(drafter, gamma=gamma, depth=depth, topk=topk, max_len=size, depths=depths),
    )
    if session.wants_experts:
        timed(
            "expert predictor",
            lambda: prepare_predictor(predictor, gamma=gamma, depth=depth, topk=topk, max_len=size),
        )
    out["graphs_s"] = round(sum(out["parts"].values()), 1)
    with torch.inference_mode():
        sd.prefill(torch.randint(0, target.config.vocab_size, (300,)))
        points = []
        for q in sd.sizes:
            args = (list(range(5, 5 + q)), [-1, *range(q - 1)], list(range(q)))
            points.append((lambda args=args: sd.verify(*args), lambda i: setattr(sd, "routes", [])))
        times = timed_in_rounds(points, warmup=20, repeats=calls, device=torch.device("cpu"))
    for q, ts in zip(sd.sizes, times, strict=True):
        out[f"step_q{q}_ms"] = round(statistics.median(ts) * 1e3, 3)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--method", default="ecospec_adaptive")
    ap.add_argument("--wrapper", default="joint,engine", help="joint and/or engine, comma-separated")
    ap.add_argument("--calls", type=int, default=200)
    ap.add_argument("--scratch", type=Path, default=None, help="where the empty caches go (a temporary directory)")
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        print(json.dumps(child(args.method, args.child, args.calls)))
        return 0
    wrappers = args.wrapper.split(",")
    if not wrappers or set(wrappers) - {"joint", "engine"}:
        ap.error(f"--wrapper {args.wrapper!r}: joint and/or engine")
    scratch = Path(tempfile.mkdtemp(prefix="cold-", dir=args.scratch))
    for wrapper in wrappers:
        cache = scratch / wrapper
        env = {**os.environ, "ECOSPEC_CACHE": str(cache)}
        env.pop("TORCHINDUCTOR_CACHE_DIR", None)  # the engine's own choice: under $ECOSPEC_CACHE
        cmd = [sys.executable, str(HERE), "--child", wrapper, "--method", args.method, "--calls", str(args.calls)]
        t0 = time.perf_counter()
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
        wall = time.perf_counter() - t0
        if proc.returncode:
            sys.stderr.write(proc.stderr[-4000:])
            return proc.returncode
        res = json.loads(proc.stdout.strip().splitlines()[-1])
        since = time.time() - wall
        stray = [p for p in Path(tempfile.gettempdir()).glob("torchinductor_*") if p.stat().st_mtime > since]
        steps = ", ".join(f"q = {k[6:-3]}: {v} ms" for k, v in res.items() if k.startswith("step_q"))
        print(
            f"{wrapper}: process {wall:.0f} s, kernels and graphs {res['graphs_s']:.0f} s; median step {steps}; "
            f"written outside $ECOSPEC_CACHE: {[str(p) for p in stray] or 'nothing'}"
        )
        for part, seconds in res["parts"].items():
            print(f"  {part}: {seconds} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
