"""What a compiled cell's first run costs on a fresh machine, and where: the CPU kernels' build (the target's native
step among them), the target's preparation, the EAGLE-3 head's graphs and the predictor's, each timed
from nothing in a child process whose `$ECOSPEC_CACHE` is empty (the embedded default comes from the release, as in a
fresh clone).

    python benchmarks/studies/cold_start.py [--method ecospec_adaptive] [--against static|o3-wrapper|size-asserts]
        [--scratch DIR]

The child then times each block size's verify step (median of `--calls` calls after a 300-token prefill, the sizes
in rounds). `--against` builds the target's graphs a second way, times that build, checks that both ways give equal
logits for every size and times each size's step in both, interleaved, each way first in half the rounds:
`static`, one graph per block size 2 .. γ with the size a constant (the engine's way before its verify graph took
the size as a symbol); `o3-wrapper`, the engine's two graphs with the C++ wrapper built with the kernels at -O3
(before it built the wrapper apart at -O1); `size-asserts`, the engine's two graphs checking every input's sizes
and strides on each call (inductor's default); `inductor`, the target's two inductor graphs as the engine builds
them where the native step does not run (a GPU) against the CPU's native step (their logits equal to rounding,
not bit for bit: the largest difference is printed). One torch thread; inductor compiles with its default worker count.
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
AGAINST = {  # the target's two inductor graphs (the engine's form off the CPU), built with these options over its own
    "inductor": {},
    "o3-wrapper": {"cpp_wrapper_build_separate": False},
    "size-asserts": {"size_asserts": True},
}


def child(method: str, calls: int, against: str | None) -> dict:
    """Run in the child: prepare every graph of a `method` cell cold, as `experiment.engines.CellEngine` does, timed
    part by part; then time each block size's step in rounds (`bench.passes.timed_in_rounds`), against the target's
    graphs built the `against` way (module docstring) when one is named."""
    import torch

    import ecospec.methods
    from ecospec.bench.passes import timed_in_rounds
    from ecospec.components import load_build
    from ecospec.engine import compiled, static_qwen3
    from ecospec.engine.compiled import mark_block_size, prepare
    from ecospec.engine.graphs import compile_method
    from ecospec.engine.scope import slots
    from ecospec.engine.static_eagle3 import prepare_drafter
    from ecospec.engine.static_predictor import prepare_predictor
    from ecospec.tiny.build import paths

    torch.set_num_threads(1)
    target, _, drafter, predictor = load_build(paths("full"))
    session = ecospec.methods.method(method).open(6, 3, 2)
    gamma, (depth, topk) = session.gamma, session.draft_shape
    size = slots(300 + 64 + gamma)
    out: dict = {"method": method, "parts": {}}

    def timed(name, fn):
        t0 = time.perf_counter()
        made = fn()
        out["parts"][name] = round(time.perf_counter() - t0, 1)
        return made

    def first_call_timed(obj, fn):  # the target's graphs, each timed at its first call (its compile)
        step = compile_method(obj, fn)

        def run(*args):
            if not run.timed:
                t0 = time.perf_counter()
                made = step(*args)
                q = args[0].shape[0]
                name = "compaction" if fn.__name__ == "compact" else "AR graph" if q == 1 else "verify graph"
                out["target graphs"][name] = round(time.perf_counter() - t0, 1)
                run.timed = True
                return made
            return step(*args)

        run.timed, run.step = False, step
        return run

    timed("cpu kernels", static_qwen3.cpu_kernels)
    hidden = tuple(drafter.hidden_layers)
    out["target graphs"] = {}
    compiled.compile_method = first_call_timed
    sd = timed("target", lambda: prepare(target, gamma=gamma, max_len=size, hidden_layers=hidden))
    compiled.compile_method = compile_method
    if not sd.static.native:  # inductor's graphs (a build without the native step): untimed from here
        sd.steps = {q: step.step for q, step in sd.steps.items()}
        sd.compact_step = sd.compact_step.step
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

    def use(way):  # the steps and buffers that `sd.verify` runs
        sd.steps, (sd._tokens, sd._pos, sd._tree) = way

    blocks = {q: (list(range(5, 5 + q)), [-1, *range(q - 1)], list(range(q))) for q in sd.sizes}
    ways = {"engine": (dict(sd.steps), (sd._tokens, sd._pos, sd._tree))}
    with torch.inference_mode():
        if against:  # buffers of their own: marked dynamic, or not, as the other way needs
            bufs = tuple({q: b.clone() for q, b in buf.items()} for buf in (sd._tokens, sd._pos, sd._tree))
            forward, t0 = type(sd.static).forward, time.perf_counter()
            if against == "static":
                other = {1: sd.steps[1], **{q: compile_method(sd.static, forward) for q in sd.sizes[1:]}}
            else:
                opts = AGAINST[against]
                block = compile_method(sd.static, forward, options=opts)
                other = {1: compile_method(sd.static, forward, options=opts), **{q: block for q in sd.sizes[1:]}}
                for q in sd.sizes[1:]:
                    mark_block_size((bufs[0][q], bufs[1][q], bufs[2][q]), gamma)
            for q in sd.sizes:
                other[q](bufs[0][q], bufs[1][q], sd._start, bufs[2][q])
            out["against_s"] = round(time.perf_counter() - t0, 1)
            ways[against] = (other, bufs)
        sd.prefill_one(torch.randint(0, target.config.vocab_size, (300,)))
        out["equal"] = {}
        for q in sd.sizes if against else ():
            got = []
            for way in ways.values():
                use(way)
                got.append(sd.verify_one(*blocks[q]))
            out["equal"][q] = all(torch.equal(a, b) for a, b in zip(*got, strict=True))
            out.setdefault("max_diff", {})[q] = max((a - b).abs().max().item() for a, b in zip(*got, strict=True))

        def point(way, q):
            def run():
                use(way)
                sd.verify_one(*blocks[q])

            return run, lambda i: setattr(sd, "routes", [])

        times: dict = {}  # each way first in half the rounds: the first of a round runs a few % slower here
        for order in (list(ways), list(ways)[::-1]):
            names = [(way, q) for q in sd.sizes for way in order]
            got = timed_in_rounds([point(ways[w], q) for w, q in names], 20, calls // 2, torch.device("cpu"))
            for name, ts in zip(names, got, strict=True):
                times.setdefault(name, []).extend(ts)
    for (way, q), ts in times.items():
        out.setdefault(f"{way}_step_ms", {})[q] = round(statistics.median(ts) * 1e3, 3)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--method", default="ecospec_adaptive")
    ap.add_argument("--against", choices=["static", *AGAINST], help="the target's graphs built another way too")
    ap.add_argument("--calls", type=int, default=200)
    ap.add_argument("--scratch", type=Path, default=None, help="where the empty cache goes (a temporary directory)")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        print(json.dumps(child(args.method, args.calls, args.against)))
        return 0
    cache = Path(tempfile.mkdtemp(prefix="cold-", dir=args.scratch))
    env = {**os.environ, "ECOSPEC_CACHE": str(cache)}
    env.pop("TORCHINDUCTOR_CACHE_DIR", None)  # the engine's own choice: under $ECOSPEC_CACHE
    cmd = [sys.executable, str(HERE), "--child", "--method", args.method, "--calls", str(args.calls)]
    cmd += ["--against", args.against] if args.against else []
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if proc.returncode:
        sys.stderr.write(proc.stderr[-4000:])
        return proc.returncode
    res = json.loads(proc.stdout.strip().splitlines()[-1])
    since = time.time() - wall
    stray = [p for p in Path(tempfile.gettempdir()).glob("torchinductor_*") if p.stat().st_mtime > since]
    print(
        f"{args.method}: process {wall:.0f} s, kernels and graphs {res['graphs_s']:.0f} s; "
        f"written outside $ECOSPEC_CACHE: {[str(p) for p in stray] or 'nothing'}"
    )
    for part, seconds in res["parts"].items():
        print(f"  {part}: {seconds} s")
        if part.startswith("target"):
            print("    " + ", ".join(f"{name} {s} s" for name, s in res["target graphs"].items()))
    if args.against:
        print(f"  against, {args.against}: built in {res['against_s']} s; equal logits {res['equal']}")
        print(f"  largest difference of logits and features by block size: {res['max_diff']}")
    for way in ("engine", args.against):
        if f"{way}_step_ms" in res:
            steps = ", ".join(f"q = {q}: {ms} ms" for q, ms in res[f"{way}_step_ms"].items())
            print(f"  median step, {way}: {steps}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
