"""The verify-cost profile of a model on the engine and machine that run its cells, for the methods that price a
step in seconds (`analysis.cost.VerifyProfile`):

    python -m ecospec.bench.profile --model tiny --engine eager,compiled [--threads 1]

For each engine: verify passes of the model's MoE layers over blocks of several sizes and unique-expert counts,
with forced routing (`bench.verify_latency`), fitted as a line in tokens and E (`analysis.cost.fit_verify`); the
AR step at γ = 1, E = k; and, for the embedded default, one head pass of each draft shape (a tree level of top-k
rows, a chain's single row) and the predictor's pass, timed in real decodes of held-out prompts on that engine.
Written to `$ECOSPEC_CACHE/profiles/<model>-<engine>-<dtype>-<processor>.json` with its hash; no part of any
cell's identity. A method that needs one and finds none stops naming this command (`load_profile`). On a GPU the
verify passes are timed with CUDA events (`verify_latency`); the head and predictor passes need the model's
components and are measured for the embedded default only (elsewhere: null, and said so).
"""

from __future__ import annotations

import argparse
import json
import tempfile
from dataclasses import asdict
from pathlib import Path

import torch

from ecospec.analysis.cost import VerifyProfile, fit_verify, load_model_config, model_cost, profile_key
from ecospec.atomic import write_json
from ecospec.cache import cache_root, digest

GAMMAS = (2, 4, 6)


class ProfileMissing(ValueError):
    """No verify-cost profile for this model, engine and machine."""


def profiles_dir() -> Path:
    return cache_root() / "profiles"


def command(model: str, engine: str) -> str:
    return f"python -m ecospec.bench.profile --model {model} --engine {engine}"


def load_profile(model: str, engine: str, dtype: str, processor: str) -> tuple[VerifyProfile, str]:
    """(the profile, its hash) for this model, engine, dtype and processor; ProfileMissing names the command."""
    path = profiles_dir() / f"{profile_key(model, engine, dtype, processor)}.json"
    if not path.is_file():
        raise ProfileMissing(f"no verify-cost profile for model={model} engine={engine} on {processor} ({path}); "
                             f"make it with: {command(model, engine)}")  # fmt: skip
    data = json.loads(path.read_text())
    return VerifyProfile(**data["profile"]), data["hash"]


def _processor(device: torch.device) -> str:
    from ecospec.experiment.records import hardware

    return hardware(device)


def _parts(engine: str, prompts: int, tokens: int, gamma: int) -> tuple[dict, float | None, str]:
    """One head pass of each shape and the predictor's pass, from real decodes of the embedded default (seconds)."""
    import ecospec
    from ecospec.tiny.build import paths
    from ecospec.tiny.evaluate import heldout_ids, load_components

    target, tokenizer, drafter, predictor = load_components(paths("full"))
    ids = [p for ps in heldout_ids(tokenizer, ["gsm8k", "humaneval"], prompts).values() for p in ps]
    out, pred = {}, []
    for shape, selector, depth, topk in (("tree", "ecospec", 3, 2), ("chain", "chain", gamma - 1, 1)):
        passes, seconds = 0, 0.0
        for warm in (True, False):  # the first round compiles / warms; the second is timed
            for p in ids:
                res = ecospec.generate(target, p, drafter=drafter, selector=selector,
                                       predictor=predictor if selector == "ecospec" else None, gamma=gamma,
                                       depth=depth, topk=topk, max_new_tokens=tokens, engine=engine)  # fmt: skip
                if not warm:
                    passes += sum(st.drafted_depth for st in res.steps)
                    seconds += sum(st.t_draft for st in res.steps)
                    if selector == "ecospec":
                        pred += [st.t_pred for st in res.steps]
        out[shape] = seconds / max(passes, 1)
    source = f"embedded default: {len(ids)} held-out prompts x {tokens} tokens per shape, second of two rounds"
    return out, (sum(pred) / len(pred) if pred else None), source


def measure(model: str, engine: str, threads: int = 1, points: int = 3, repeats: int = 20, prompts: int = 2,
            tokens: int = 32, gammas=GAMMAS, layers: int | None = None) -> Path:  # fmt: skip
    """Measure and write one profile; returns its path."""
    from ecospec.bench.verify_latency import run

    torch.set_num_threads(threads)
    cfg = load_model_config(model)
    layers = layers or model_cost(cfg).moe_layers
    with tempfile.TemporaryDirectory() as tmp:
        records = run(model, layers=layers, gammas=list(gammas), impls=["eager"], points=points, repeats=repeats,
                      warmup=2, prefix=64, device="cpu", out=tmp, echo=None, engines=[engine])  # fmt: skip
    records = [r for r in records if r["impl"] == ("compiled" if engine == "compiled" else "eager")]
    intercept, per_token, per_expert, r2, n = fit_verify(records, layers)
    ar = next(r["t_pass_s"] for r in records if r["gamma"] == 1)
    draft, pred, parts_source = ({}, None, "not measured (the embedded default only)")
    if cfg.get("source") == "tiny":
        draft, pred, parts_source = _parts(engine, prompts, tokens, max(gammas))
    profile = VerifyProfile(
        model=model, engine=engine, dtype=records[0]["dtype"], processor=_processor(torch.device("cpu")),
        layers=layers, intercept_s=intercept, per_token_s=per_token, per_expert_layer_s=per_expert, r2=r2, points=n,
        ar_step_s=ar, draft_pass_s=draft, predictor_pass_s=pred,
        source=f"verify passes: bench.verify_latency, forced routing, {n} points; parts: {parts_source}",
    )  # fmt: skip
    body = asdict(profile)
    path = profiles_dir() / f"{profile.key}.json"
    write_json(path, {"profile": body, "hash": digest(body), "records": records}, indent=1)
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
        print(f"{engine}: t_verify = {p['intercept_s'] * 1e3:.3f} ms + {p['per_token_s'] * 1e3:.4f} ms/token + "
              f"{p['per_expert_layer_s'] * 1e3:.5f} ms/expert-layer x E x {p['layers']} (R² {p['r2']:.3f}); AR step "
              f"{p['ar_step_s'] * 1e3:.3f} ms; head pass {p['draft_pass_s']}; predictor {p['predictor_pass_s']} -> "
              f"{path}")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
