"""The verify-cost profile of a model on the engine and machine that run its cells, for the methods that price a
step in seconds (`analysis.verify_profile.VerifyProfile`):

    python -m ecospec.bench.profile --model tiny --engine eager,compiled [--threads 1]

For each engine: verify passes of the model's MoE layers over blocks of several sizes and unique-expert counts,
with forced routing (`bench.verify_latency`), fitted as a line in tokens and E (`analysis.verify_profile.fit_verify`);
the AR step at γ = 1, E = k; and, for the embedded default, one head pass of each draft shape (a tree level of top-k
rows, a chain's single row) and the predictor's pass, timed in real decodes of held-out prompts on that engine
(every step but each decode's first, whose head and predictor passes take the prompt once).
Written to `$ECOSPEC_CACHE/profiles/<model>-<engine>-<dtype>-<processor>.json` with its hash; no part of any
cell's identity. A method that needs one and finds none stops naming this command (`analysis.profiles`). On a GPU the
verify passes are timed with CUDA events (`verify_latency`); the head and predictor passes need the model's
components and are measured for the embedded default only (elsewhere: null, and said so).

Beside the profile, in the same run: this machine's read bandwidth on the profile's threads over a 512 MiB buffer
(beyond any last-level cache) and over one of the profiled weights' size, and each pass's time against its weight
bytes at the first (`against_bytes`; the file's `bandwidth`, printed): how far a pass is from the machine's limit.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
from dataclasses import asdict
from pathlib import Path

import numpy as np
import torch

from ecospec import sources
from ecospec.analysis.latency import fit_line
from ecospec.analysis.model_config import load_model_config
from ecospec.analysis.profiles import profiles_dir
from ecospec.analysis.verify_profile import VerifyProfile, fit_verify, independent_experts
from ecospec.analysis.weight_bytes import drafter_pass_bytes, model_cost, predictor_pass_bytes, verify_hbm_bytes
from ecospec.atomic import write_json
from ecospec.bench.passes import timed
from ecospec.cache import digest

GAMMAS = (2, 3, 4, 5, 6)
BATCHES = (2, 4, 8, 16, 32)  # the batch sizes whose verify passes and head passes a profile measures
LARGE = 512 << 20  # a read buffer well beyond any last-level cache (512 MiB)


def read_bandwidth(nbytes: int, repeats: int = 7) -> float:
    """This machine's read bandwidth (bytes/s) on torch's threads over a buffer of `nbytes`: the median of
    `repeats` sums of a float32 tensor that size, after an untimed one (a pass's weights are read the same way)."""
    x = torch.ones(max(int(nbytes) // 4, 1))
    x.sum()
    return x.numel() * 4 / statistics.median(timed(x.sum, x.device) for _ in range(repeats))


def against_bytes(cfg, profile: VerifyProfile, layers: int) -> dict:
    """This machine's read bandwidth over `LARGE` and over a buffer of the profiled weights' size (the model's,
    capped at `LARGE`), and each pass's time against its weight bytes at the first: the AR step, the verify phase
    of each block size, a head pass and the predictor's pass (null where the profile has no time for it)."""
    cost = model_cost(cfg)
    size = min(LARGE, cost.dense_bytes * layers / cost.num_layers + cost.num_experts * layers * cost.expert_bytes)
    bw = read_bandwidth(LARGE)
    out = {
        "read_bytes_per_s": bw,
        "buffer_bytes": LARGE,
        "model_read_bytes_per_s": read_bandwidth(size),
        "model_buffer_bytes": int(size),
        "passes": [],
    }
    scale = layers / cost.moe_layers  # the passes timed cover `layers` MoE layers

    def row(name: str, seconds: float | None, nbytes: float) -> None:
        at_bw = nbytes / bw
        ratio = None if seconds is None else seconds / at_bw
        out["passes"].append({"pass": name, "seconds": seconds, "bytes": nbytes, "bytes_s": at_bw, "ratio": ratio})

    row("AR step", profile.ar_step_s, verify_hbm_bytes(cost, cost.top_k) * scale)
    for t, e in profile.experts_by_tokens.items():
        if t != "1":
            row(f"verify, {t} tokens", profile.t_verify(int(t), e), verify_hbm_bytes(cost, e) * scale)
    for shape, seconds in profile.draft_pass_s.items():
        row(f"head pass, {shape}", seconds, drafter_pass_bytes(cfg, "eagle3")[1])
    if profile.predictor_pass_s is not None:
        row("predictor pass", profile.predictor_pass_s, predictor_pass_bytes(cfg)[0])
    return out


def describe(bandwidth: dict) -> str:
    """The bandwidths and the passes against their bytes, a line each."""
    lines = [
        f"read bandwidth over {bandwidth['buffer_bytes'] / 2**20:.0f} MiB: "
        f"{bandwidth['read_bytes_per_s'] / 1e9:.1f} GB/s; over the profiled weights' size "
        f"({bandwidth['model_buffer_bytes'] / 2**20:.1f} MiB): {bandwidth['model_read_bytes_per_s'] / 1e9:.1f} GB/s"
    ]
    for r in bandwidth["passes"]:
        took = "not timed" if r["seconds"] is None else f"{r['seconds'] * 1e3:.3f} ms = {r['ratio']:.2f} x"
        lines.append(f"  {r['pass']:<20} {r['bytes'] / 1e6:7.2f} MB, {r['bytes_s'] * 1e3:.3f} ms at that rate; {took}")
    return "\n".join(lines)


def _processor(device: torch.device) -> str:
    from ecospec.experiment.records import hardware

    return hardware(device)


def _decodes(engine: str, prompts: int, tokens: int, gammas) -> dict:
    """From real decodes of held-out prompts of the embedded default on `engine`, prepared as the cells prepare
    it (seconds): every step's verify phase with its block size and unique experts (AR, and chains of each γ in
    `gammas`: blocks of exactly γ tokens), the AR step whole, one head pass of each draft shape and the predictor's
    pass, and the routes of the AR-decoded text. The second of two rounds is timed."""
    import ecospec
    from ecospec.components import load_build
    from ecospec.experiment.engines import CellEngine
    from ecospec.tiny.build import paths
    from ecospec.tiny.evaluate import heldout_ids

    target, tokenizer, drafter, predictor = load_build(paths("full"))
    ids = [p for ps in heldout_ids(tokenizer, ["gsm8k", "humaneval"], prompts).values() for p in ps]
    g = max(gammas)
    runs = [("tree", "ecospec", drafter, g), ("ar", "confidence", None, g)]  # AR on the tree's target, as in a cell
    runs += [("chain", "chain", drafter, gamma) for gamma in gammas]
    cell = CellEngine(engine)
    out: dict = {"pred": [], "ar": [], "routes": [], "steps": [], "catchup": {"head": [], "predictor": []}}
    heads: dict[str, list[float]] = {}  # shape -> [passes, seconds]
    for shape, selector, dr, gamma in runs:
        session = ecospec.methods.method(selector).open(g, 3, 2)
        for warm in (True, False):
            for p in ids:
                pred = predictor if selector == "ecospec" else None
                eng = cell.for_decode(
                    target,
                    dr,
                    g,
                    p.shape[1],
                    tokens,
                    predictor=pred,
                    depth=session.draft_shape[0],
                    topk=session.draft_shape[1],
                    depths=tuple(range(1, g)),
                )
                res = ecospec.generate(
                    target,
                    p,
                    drafter=dr,
                    selector=selector,
                    predictor=pred,
                    gamma=gamma,
                    depth=3,
                    topk=2,
                    max_new_tokens=tokens,
                    engine=eng,
                    trace=warm and dr is None,
                )
                if warm and dr is None:
                    out["routes"].append(torch.tensor([st.trace.routes for st in res.steps]).squeeze(2))
                if warm:
                    continue
                decode = res.steps[1:]  # the first step's head and predictor passes take the prompt, once a prompt
                if dr is not None:  # the first step's catch-up: the prompt's tokens, the first step's passes
                    first, seen = res.steps[0], p.shape[1] + 1
                    out["catchup"]["head"].append((seen, first.t_draft, first.drafted_depth, shape))
                    if pred is not None:
                        out["catchup"]["predictor"].append((seen, first.t_pred))
                if dr is not None:
                    head = heads.setdefault(shape, [0, 0.0])
                    head[0] += sum(st.drafted_depth for st in decode)
                    head[1] += sum(st.t_draft for st in decode)
                out["pred"] += [st.t_pred for st in decode] if pred is not None else []
                out["ar"] += [st.t_total for st in res.steps] if dr is None else []
                if shape != "tree":
                    out["steps"] += [(st.verified, sum(st.experts) / len(st.experts), st.t_verify) for st in res.steps]
    out["draft"] = {shape: seconds / max(passes, 1) for shape, (passes, seconds) in heads.items()}
    pred_s = sum(out["pred"]) / len(out["pred"]) if out["pred"] else 0.0
    out["catchup"] = {
        "head": fit_catchup([(m, t - d * out["draft"][shape]) for m, t, d, shape in out["catchup"]["head"]]),
        "predictor": fit_catchup([(m, t - pred_s) for m, t in out["catchup"]["predictor"]]),
    }
    sizes = sorted({q for q, _, _ in out["steps"]})
    out["by_tokens"] = {
        str(q): [
            float(np.mean([t for n, _, t in out["steps"] if n == q])),
            float(np.mean([e for n, e, _ in out["steps"] if n == q])),
        ]
        for q in sizes
    }
    out["ar_verify"] = sum(t for q, _, t in out["steps"] if q == 1) / sum(q == 1 for q, _, _ in out["steps"])
    out["source"] = (
        f"embedded default: {len(ids)} held-out prompts x {tokens} tokens, AR and chains of gamma "
        f"{', '.join(map(str, gammas))}, second of two rounds"
    )
    out["by_batch"], out["draft_by_batch"] = _batched(target, tokenizer, drafter, tokens, gammas, engine)
    out["source"] += f"; batches of {', '.join(map(str, BATCHES))} held-out prompts alike"
    return out


def _batched(target, tokenizer, drafter, tokens: int, gammas, engine: str, batches=BATCHES) -> tuple[dict, dict]:
    """From real batched decodes (`generate_batch` on `engine`, prepared for B rows as a cell prepares it: the
    compiled target's graphs for the largest γ serve AR and every chain) of B held-out prompts for each B in
    `batches`: the mean
    verify phase and unique experts per layer of the passes where all B sequences verify t tokens (AR: t = 1; the
    chain of each γ: t = γ), {str(B): {str(t): [seconds, E]}}, and one tree head pass over B sequences,
    {str(B): seconds}. Each batch takes the benchmarks' prompts in turn (the cells' mix); at each batch size a
    first, untimed AR decode warms the shapes."""
    import ecospec
    from ecospec.experiment.engines import CellEngine
    from ecospec.tiny.evaluate import heldout_ids

    per = -(-max(batches) // 2)
    gsm8k, humaneval = heldout_ids(tokenizer, ["gsm8k", "humaneval"], per).values()
    ids = [p[0] for pair in zip(gsm8k, humaneval, strict=True) for p in pair]
    ar = ("ar", None, "confidence", max(gammas))
    runs = [ar, *(("chain", drafter, "chain", g) for g in gammas), ("tree", drafter, "confidence", max(gammas))]
    by_batch, draft = {}, {}
    cell = CellEngine(engine)
    longest = max(p.shape[0] for p in ids)
    for b in batches:
        steps, heads = [], [0, 0.0]
        eng = cell.for_decode(target, drafter, max(gammas), longest, tokens, rows=b)
        for i, (shape, dr, selector, gamma) in enumerate([ar, *runs]):
            res = ecospec.generate_batch(
                target, ids[:b], drafter=dr, selector=selector, gamma=gamma, max_new_tokens=tokens, engine=eng
            )
            if i == 0:
                continue
            full = [s for s in res.steps if s.sequences == b]
            if shape == "tree":  # the configured tree's depth, every pass but the first (the prompts')
                heads[0] += 3 * (len(res.steps) - 1)
                heads[1] += sum(s.t_draft for s in res.steps[1:])
            else:
                steps += [(s.verified // b, sum(s.experts) / len(s.experts), s.t_verify) for s in full]
        by_batch[str(b)] = {
            str(q): [
                float(np.mean([t for n, _, t in steps if n == q])),
                float(np.mean([e for n, e, _ in steps if n == q])),
            ]
            for q in sorted({n for n, _, _ in steps})
        }
        draft[str(b)] = heads[1] / max(heads[0], 1)
    return by_batch, draft


def fit_catchup(points) -> list[float]:
    """[seconds, seconds per token] of a drafting step's extra time `points` ((tokens the drafter had not seen,
    seconds beyond its usual passes) each) as a line in those tokens; [0, 0] without two lengths to fit."""
    if len({m for m, _ in points}) < 2:
        return [0.0, 0.0]
    slope, intercept, _ = fit_line([m for m, _ in points], [t for _, t in points])
    return [intercept, slope]


def fit_steps(steps, per_expert_layer_s: float, layers: int) -> tuple[float, float, float]:
    """(intercept, per token, R²) of the real verify phases `steps` ((tokens, E, seconds) each) as a line in tokens,
    their experts priced at the forced-routing fit's `per_expert_layer_s`."""
    repriced = [t - per_expert_layer_s * e * layers for _, e, t in steps]
    slope, intercept, r2 = fit_line([q for q, _, _ in steps], repriced)
    return intercept, slope, r2


def window_experts(routes: list[torch.Tensor], num_experts: int, sizes) -> dict[str, float]:
    """Mean unique experts per layer among t consecutive tokens of `routes` (each [n, L, k]), for each t."""
    out = {}
    for t in sizes:
        counts = []
        for r in routes:
            hot = torch.zeros(r.shape[0], r.shape[1], num_experts, dtype=torch.bool).scatter_(2, r, True)
            for i in range(r.shape[0] - t + 1):
                counts.append(hot[i : i + t].any(0).sum(-1).float().mean().item())
        out[str(t)] = sum(counts) / len(counts)
    return out


def measure(
    model: str,
    engine: str,
    threads: int = 1,
    points: int = 3,
    repeats: int = 20,
    prompts: int = 2,
    tokens: int = 32,
    gammas=GAMMAS,
    layers: int | None = None,
) -> Path:
    """Measure and write one profile; returns its path."""
    from ecospec.bench.verify_latency import run

    torch.set_num_threads(threads)
    cfg = load_model_config(model)
    cost = model_cost(cfg)
    layers = layers or cost.moe_layers
    with tempfile.TemporaryDirectory() as tmp:
        records = run(
            model,
            layers=layers,
            gammas=list(gammas),
            impls=["eager"],
            points=points,
            repeats=repeats,
            warmup=2,
            prefix=64,
            device="cpu",
            out=tmp,
            echo=None,
            engines=[engine],
        )
    records = [r for r in records if r["impl"] == ("compiled" if engine == "compiled" else "eager")]
    intercept, per_token, per_expert, r2, n = fit_verify(records, layers)
    ar_pass = next(r["t_pass_s"] for r in records if r["gamma"] == 1)
    sizes = range(1, max(gammas) + 1)
    fit_ar = intercept + per_token + per_expert * cost.top_k * layers
    if sources.builtin(cfg):
        dec = _decodes(engine, prompts, tokens, gammas)
        ar_step = sum(dec["ar"]) / len(dec["ar"])
        intercept, per_token, r2 = fit_steps(dec["steps"], per_expert, layers)
        n = len(dec["steps"])
        overhead = ar_step - dec["ar_verify"]  # the AR step beyond its verify phase: the loop's own work
        draft, pred = dec["draft"], sum(dec["pred"]) / len(dec["pred"])
        experts = window_experts(dec["routes"], cost.num_experts, sizes)
        by_tokens = dec["by_tokens"]
        by_batch, draft_by_batch = dec.get("by_batch"), dec.get("draft_by_batch")
        catchup = dec["catchup"]
        parts = (
            f"per expert: bench.verify_latency's forced routing ({len(records)} passes); per token and "
            f"intercept (and verify_by_tokens, which t_verify uses): the verify phases of {n} real steps "
            f"({dec['source']}), their experts priced per expert; unique experts per block size: windows of "
            "the AR-decoded text's routes"
        )
    else:
        ar_step, overhead, draft, pred, by_tokens = ar_pass, max(0.0, ar_pass - fit_ar), {}, None, None
        by_batch = draft_by_batch = catchup = None
        experts = {str(t): independent_experts(cost.num_experts, cost.top_k, t) for t in sizes}
        parts = (
            f"bench.verify_latency's forced routing, {n} points (the embedded default adds real decodes: "
            "elsewhere no loop overhead, no head or predictor pass, unique experts per block size for "
            "independent uniform routing)"
        )
    profile = VerifyProfile(
        model=model,
        engine=engine,
        dtype=records[0]["dtype"],
        processor=_processor(torch.device("cpu")),
        layers=layers,
        intercept_s=intercept,
        per_token_s=per_token,
        per_expert_layer_s=per_expert,
        r2=r2,
        points=n,
        ar_step_s=ar_step,
        overhead_s=overhead,
        draft_pass_s=draft,
        predictor_pass_s=pred,
        experts_by_tokens=experts,
        source=parts,
        verify_by_tokens=by_tokens,
        verify_by_batch=by_batch,
        draft_by_batch=draft_by_batch,
        catchup=catchup,
    )
    body = asdict(profile)
    path = profiles_dir() / f"{profile.key}.json"
    data = {"profile": body, "hash": digest(body), "records": records, "bandwidth": against_bytes(cfg, profile, layers)}
    write_json(path, data, indent=1)
    return path


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", required=True, help="a conf/model name (tiny: with head and predictor passes)")
    ap.add_argument("--engine", default="eager", help="eager, compiled or both (comma-separated)")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--points", type=int, default=3, help="E values per block size")
    a = ap.parse_args(argv)
    for engine in a.engine.split(","):
        path = measure(a.model, engine, threads=a.threads, points=a.points)
        p = json.loads(path.read_text())["profile"]
        print(
            f"{engine}: t_verify = {p['intercept_s'] * 1e3:.3f} ms + {p['per_token_s'] * 1e3:.4f} ms/token + "
            f"{p['per_expert_layer_s'] * 1e3:.5f} ms/expert-layer x E x {p['layers']} (R² {p['r2']:.3f}); AR step "
            f"{p['ar_step_s'] * 1e3:.3f} ms (loop overhead {p['overhead_s'] * 1e3:.3f}); head pass "
            f"{p['draft_pass_s']}; predictor {p['predictor_pass_s']}; E by block size {p['experts_by_tokens']}; "
            f"measured verify by block size {p['verify_by_tokens']} -> "
            f"{path}"
        )
        print(describe(json.loads(path.read_text())["bandwidth"]))
        for b, by_q in (p.get("verify_by_batch") or {}).items():
            ms = ", ".join(f"{q}: {v[0] * 1e3:.2f} ms at E {v[1]:.1f}" for q, v in by_q.items())
            head = p["draft_by_batch"][b] * 1e3
            print(f"  B = {b}: verify phase by tokens a sequence {ms}; tree head pass {head:.3f} ms")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
