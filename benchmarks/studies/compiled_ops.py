"""Where a compiled pass's time goes, op by op, on the embedded default: the AR step, a 2-token and a 6-token verify
(chains, through `CompiledTarget.verify` as the loop calls it), a head pass of the EAGLE-3 tree and the expert
predictor's pass, each as the compiled engine runs it in a cell (one torch thread).

    python benchmarks/studies/compiled_ops.py [--prompts 2] [--tokens 32] [--out reports/tiny]
    perf record -F 4000 -g -- python benchmarks/studies/compiled_ops.py --spin 1   # native code, below the ops

First each pass is timed without the profiler (its calls' total over `--rounds` rounds of every pass, per pass);
then the same calls run under `torch.profiler` with inductor's kernel profiling on
(TORCHINDUCTOR_CPP_ENABLE_KERNEL_PROFILE=1, set here before torch loads: the graphs compile again, once, into their
own cache entries), and the self time of every op under each pass is summed into the categories of `CATEGORY`.
Profiled times run longer than unprofiled ones (each op recorded costs a few µs), so the shares are the finding and
the unprofiled times the scale. The head and predictor passes come from real EcoSpec decodes of HumanEval prompts (a
head pass: a step's drafting, `begin` and its `expand` calls, divided by the tree levels it drafted, as
`bench.profile` counts it); the AR step from AR decodes of the same prompts; the verifies from chains of fixed
tokens after the first prompt, nothing committed. `--spin Q` runs only the Q-token verify step (1: the AR step's
graph) of the graphs cells use (no kernel profiling) for `--seconds`, for a native profiler such as `perf`, and
prints its mean time per call.
"""

from __future__ import annotations

import os
import sys

if "--spin" not in sys.argv:  # before torch: inductor reads it at import (--spin times the graphs cells run)
    os.environ.setdefault("TORCHINDUCTOR_CPP_ENABLE_KERNEL_PROFILE", "1")

import argparse  # noqa: E402
import contextlib  # noqa: E402
import functools  # noqa: E402
import json  # noqa: E402
import time  # noqa: E402
from collections import defaultdict  # noqa: E402
from pathlib import Path  # noqa: E402

import torch  # noqa: E402
from provenance import run_commit  # noqa: E402

import ecospec  # noqa: E402
from ecospec.engine.compiled import prepare  # noqa: E402
from ecospec.engine.scope import slots  # noqa: E402
from ecospec.engine.static_eagle3 import prepare_drafter  # noqa: E402
from ecospec.engine.static_predictor import prepare_predictor  # noqa: E402
from ecospec.experiment.records import hardware  # noqa: E402
from ecospec.tiny import load_tiny  # noqa: E402
from ecospec.tiny.evaluate import humaneval_ids  # noqa: E402

GAMMA, DEPTH, TOPK = 6, 3, 2
TOKENS = 32  # new tokens a decode makes (--tokens)
# (category, substrings of an op's name), first match wins; the pass's own self time is "host: Python"
CATEGORY = (
    ("native steps (one C++ call a pass)", ("_native_",)),  # the CPU's target, head and predictor
    ("inductor's fused C++ kernels", ("cpp_fused",)),  # first of the graphs': their names list the ops fused
    ("attention (SDPA, ecospec::block_attention)", ("scaled_dot_product", "ecospec::block_attention")),
    ("routed experts (ecospec::moe_experts)", ("ecospec::moe_experts",)),
    ("linear layers (mm, addmm, bmm)", ("mm_out", "addmm", "bmm")),
    ("routing: topk, sort, cumsum, scatter", ("topk", "sort", "cumsum", "scatter", "index_add")),
    ("compiled graph: wrapper and its inputs", ("## Call CompiledFxGraph",)),
    (
        "dynamo and AOT call overhead",
        ("TorchDynamo", "Pregraph", "AOTDispatcher", "Torch-Compiled Region", "CompiledFunction"),
    ),
)
OTHER = "other ATen ops (views, copies, allocations)"
HOST = "host: Python around the graph"
PASSES = ("AR step", "verify, 2 tokens", "verify, 6 tokens", "head pass", "predictor pass")


def category(name: str) -> str:
    for label, keys in CATEGORY:
        if any(k in name for k in keys):
            return label
    return OTHER


class Scopes:
    """Runs each pass in a `record_function` scope named for it, and times it."""

    def __init__(self):
        self.times: dict[str, list[float]] = defaultdict(list)
        self.units: dict[str, float] = defaultdict(float)  # passes per scope name (a draft step drafts several)

    def reset(self) -> None:
        self.times.clear()
        self.units.clear()

    @contextlib.contextmanager
    def scope(self, label: str, units: float = 1):
        with torch.profiler.record_function(f"pass: {label}"):
            t0 = time.perf_counter()
            yield
            self.times[label].append(time.perf_counter() - t0)
        self.units[label] += units

    def wrap(self, obj, method: str, label: str, units=lambda *a, **k: 1) -> None:
        """Every call of `obj.method` in a scope `label`, counting `units(*args, **kwargs)` passes."""
        fn = getattr(obj, method)

        @functools.wraps(fn)
        def run(*args, **kwargs):
            with self.scope(label, units(*args, **kwargs)):
                return fn(*args, **kwargs)

        setattr(obj, method, run)


def chain(q: int) -> tuple[list[int], list[int], list[int]]:
    """A q-token chain block for `CompiledTarget.verify`: fixed tokens, each node the child of the one before."""
    return [7 + j for j in range(q)], [-1, *range(q - 1)], list(range(q))


def verify_target(target, drafter, max_len: int):
    """The target as an EcoSpec cell of γ = GAMMA prepares it."""
    return prepare(target, gamma=GAMMA, max_len=max_len, hidden_layers=tuple(drafter.hidden_layers))


def _walk(event, into: dict) -> None:
    for child in event.cpu_children:
        into[category(child.name)] += child.self_cpu_time_total
        _walk(child, into)


def breakdown(prof) -> dict[str, dict[str, float]]:
    """{pass: {category: total µs}} over every scope event of the profile."""
    out: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    for ev in prof.events():
        if ev.name.startswith("pass: ") and not (ev.cpu_parent and ev.cpu_parent.name.startswith("pass: ")):
            into = out[ev.name.removeprefix("pass: ")]
            into[HOST] += ev.self_cpu_time_total
            _walk(ev, into)
    return out


def run(prompts: int, tokens: int, rounds: int) -> dict:
    torch.set_num_threads(1)
    target, tokenizer, drafter, predictor = load_tiny()
    ids = humaneval_ids(tokenizer, prompts)
    max_len = slots(max(p.shape[1] for p in ids) + tokens + GAMMA)  # as a cell prepares it
    t0 = time.perf_counter()
    ar = prepare(target, gamma=1, max_len=max_len)
    sd = verify_target(target, drafter, max_len)
    head = prepare_drafter(drafter, gamma=GAMMA, depth=DEPTH, topk=TOPK, max_len=max_len)
    pred = prepare_predictor(predictor, gamma=GAMMA, depth=DEPTH, topk=TOPK, max_len=max_len)
    compile_s = time.perf_counter() - t0
    scopes = Scopes()
    scopes.wrap(ar, "verify", "AR step")
    scopes.wrap(head, "begin", "head pass", units=lambda *a, depth=None, **k: depth or DEPTH)
    scopes.wrap(head, "expand", "head pass", units=lambda *a, **k: 0)  # a step's levels count once, at begin
    scopes.wrap(pred, "predict", "predictor pass")
    blocks = {q: chain(q) for q in (2, 6)}
    sd.prefill_one(ids[0][0])

    def one_round():
        for p in ids:
            ecospec.generate(target, p, max_new_tokens=tokens, engine=ar)
            ecospec.generate(
                target, p, drafter=head, predictor=pred, selector="ecospec", gamma=GAMMA, depth=DEPTH, topk=TOPK,
                max_new_tokens=tokens, engine=sd,
            )  # fmt: skip
        for q, block in blocks.items():
            with scopes.scope(f"verify, {q} tokens"):
                sd.verify_one(*block)  # nothing committed: every call verifies the same block

    with torch.inference_mode():
        one_round()  # warm
        scopes.reset()
        for _ in range(rounds):
            one_round()
        timed = {k: sum(v) / scopes.units[k] for k, v in scopes.times.items()}
        calls = dict(scopes.units)
        scopes.reset()
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
            one_round()
        units = dict(scopes.units)
    parts = breakdown(prof)
    table = {}
    for name in PASSES:
        cats = {k: v / units[name] for k, v in parts[name].items()}
        table[name] = {
            "unprofiled_us": 1e6 * timed[name],
            "profiled_us": sum(cats.values()),
            "categories_us": dict(sorted(cats.items(), key=lambda kv: -kv[1])),
            "passes_timed": calls[name],
        }
    return {"compile_s": compile_s, "prompts": prompts, "tokens": tokens, "rounds": rounds, "passes": table}


def spin(q: int, seconds: float) -> None:
    """The q-token step of the target as `run` prepares it, called for `seconds` after a warm-up."""
    torch.set_num_threads(1)
    target, tokenizer, drafter, _ = load_tiny()
    ids = humaneval_ids(tokenizer, 1)[0][0]
    sd = verify_target(target, drafter, slots(ids.shape[0] + TOKENS + GAMMA))  # `run`'s graphs at its defaults
    block = chain(q)
    with torch.inference_mode():
        sd.prefill_one(ids)
        for _ in range(100):
            sd.verify_one(*block)
        calls, t0 = 0, time.perf_counter()
        while time.perf_counter() - t0 < seconds:
            sd.verify_one(*block)
            calls += 1
    print(f"{q}-token verify: {(time.perf_counter() - t0) / calls * 1e6:.0f} µs a call over {calls} calls")


def markdown(res: dict) -> str:
    cats = [label for label, _ in CATEGORY] + [OTHER, HOST]
    head = "| op category | " + " | ".join(PASSES) + " |"
    lines = [head, "|" + " --- |" * (len(PASSES) + 1)]
    for c in cats:
        row = []
        for name in PASSES:
            p = res["passes"][name]
            us = p["categories_us"].get(c, 0.0)
            row.append(f"{us:.0f} ({us / p['profiled_us']:.0%})")
        lines.append(f"| {c} | " + " | ".join(row) + " |")
    lines.append("| **profiled total, µs** | " + " | ".join(f"{res['passes'][n]['profiled_us']:.0f}" for n in PASSES))
    lines[-1] += " |"
    lines.append(
        "| **unprofiled, µs a pass** | " + " | ".join(f"{res['passes'][n]['unprofiled_us']:.0f}" for n in PASSES)
    )
    lines[-1] += " |"
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--prompts", type=int, default=2)
    ap.add_argument("--tokens", type=int, default=TOKENS)
    ap.add_argument("--rounds", type=int, default=3, help="unprofiled rounds timed before the profiled one")
    ap.add_argument("--out", type=Path, default=None, help="write compiled_ops.json / .md there")
    ap.add_argument("--spin", type=int, choices=(1, 2, GAMMA), default=None, help="only run this step size's graph")
    ap.add_argument("--seconds", type=float, default=20.0, help="how long --spin runs")
    a = ap.parse_args()
    if a.spin:
        return spin(a.spin, a.seconds)
    res = run(a.prompts, a.tokens, a.rounds)
    res["commit"] = run_commit()
    res["machine"] = hardware(torch.device("cpu"))
    text = markdown(res)
    print(text)
    if a.out:
        a.out.mkdir(parents=True, exist_ok=True)
        (a.out / "compiled_ops.json").write_text(json.dumps(res, indent=1) + "\n")
        (a.out / "compiled_ops.md").write_text(
            "# Where a compiled pass's time goes\n\n"
            f"`python benchmarks/studies/compiled_ops.py --out {a.out}` on {res['machine']}, commit {res['commit']}: "
            "µs per pass of the embedded default on the compiled engine, by op category, under the profiler "
            "(share of the pass), and the same passes unprofiled. What each category holds, and what the native "
            'profile below the ops adds: docs/engine.md, "Where a compiled pass\'s time goes".\n\n' + text + "\n"
        )


if __name__ == "__main__":
    main()
