"""Synthetic result records in the exact `result.json` schema, covering every table's axes: for tests and the
report benchmark (`benchmarks/report_bench.py`). The numbers are made up around the paper's; nothing is run.

The grid: each paper model (qwen3, gptoss, deepseek) and the tiny model, with their conf/model configs, over
the sweeps of the paper's tables: Table 1 (AR, baseline, EcoSpec x 7 benchmarks x T 0/1), 4 (global cost), 9
(predictor checkpoints acc50/acc60/final), 10 (oracle), 11-12 (γ 3-6), batch sizes 1/2/4/8, another drafter
checkpoint (GTO) with and without EcoSpec, and MoE-Spec's expert budgets (qwen3 and tiny). Past the grid, reruns
follow (new seeds, later sweeps, later times), and about 2 % of the records are failed cells. The tiny model's
SD cells of the first Table 1 round carry small verify-pass traces (`record["trace"]`, for the routing tables).
"""

from __future__ import annotations

import zlib
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from functools import cache

import numpy as np

from ecospec import conf_dir, sources
from ecospec.analysis.model_config import load_model_config
from ecospec.analysis.weight_bytes import model_cost, verify_hbm_bytes
from ecospec.drafters.registry import kinds as drafter_kinds
from ecospec.experiment.config import cell_config, cell_id, cell_name, method_config
from ecospec.experiment.records import SCHEMA
from ecospec.methods import AR
from ecospec.report.frame import MODELS as PAPER_MODELS
from ecospec.report.frame import VARIANT_DRAFTERS
from ecospec.report.lineup import BASE_ROLE, budgeted, conf_of, experiment_conf, named_for, role_of, spec_of, sweep
from ecospec.report.moespec import NAME as MOESPEC

EMBEDDED = next(
    p.stem for p in sorted((conf_dir() / "model").glob("*.yaml")) if sources.builtin(load_model_config(p.stem))
)
MODELS = (*PAPER_MODELS, EMBEDDED)  # the paper's models, then the embedded default
DATASETS = ("gsm8k", "humaneval", "aime25", "math500", "amc", "mtbench", "mmstar")
BUDGETS = {"qwen3": (16, 32, 64), "tiny": (4, 8, 16)}  # MoE-Spec cells (expert budgets) after the paper's grid
# model -> (baseline E, EcoSpec E, baseline α, EcoSpec α, AR s per token, baseline T_verify s, T_draft s)
PAPERISH = {
    "qwen3": (23.7, 20.5, 2.41, 2.32, 0.490, 0.832, 0.008),
    "gptoss": (11.6, 10.6, 1.88, 1.86, 0.081, 0.113, 0.035),
    "deepseek": (31.4, 31.2, 2.85, 2.79, 0.369, 0.980, 0.008),
    "tiny": (9.5, 8.4, 2.1, 2.0, 0.004, 0.006, 0.012),
}
# (E, α) factors of a method past its role's numbers above (the ablation's and the oracle's effects)
EFFECT = {"global_cost": (1.03, 0.88), "oracle": (0.98, 1.0)}
GPU = "NVIDIA H100 80GB HBM3"
BATCH_GPU = "NVIDIA H200"
CPU = "AMD EPYC 7B13 (2 threads)"
ACCURACY = {"acc50": 0.5, "acc60": 0.6, "final": 0.82}
RUN = {
    "out_dir": "experiments",
    "device": "auto",
    "threads": None,
    "force": False,
    "progress": False,
    "logger": {"name": "none"},
}
ENV = {
    "host": "synthetic",
    "python": "3.11.7",
    "torch": "2.13.0",
    "transformers": "5.24.0",
    "ecospec": "0.1.0",
    "git_commit": None,
    "slurm_job_id": None,
    "slurm_array_task_id": None,
}


def _own(experiment: str, model: str) -> list[str]:
    """The methods `experiment` sweeps (conf/experiment), its baseline under the name of `model`'s own drafter."""
    own = named_for(_model(model)[0]["default_drafter"])
    return [own if role_of(m) == BASE_ROLE else m for m in sweep(experiment).methods]


def _grid() -> list[dict]:
    """One dict per cell of the paper's sweeps (their methods as conf/experiment lists them): experiment, model,
    method, dataset and the knobs that differ."""
    cells = []
    # Table 5's methods that draft with the model's own kind: the variant head enters through its checkpoint path
    drafts_own = [m for m in sweep("table5").methods if conf_of(m)["drafter"] not in VARIANT_DRAFTERS]
    for model in MODELS:
        for ds in DATASETS:
            for t in (0.0, 1.0):
                for method in (AR, *sweep("table1").methods):
                    cells.append({"experiment": "table1", "model": model, "method": method, "dataset": ds, "T": t})
            for gamma in (3, 4, 5, 6):
                for method in _own("table11_12", model):
                    cells.append(
                        {"experiment": "table11_12", "model": model, "method": method, "dataset": ds, "gamma": gamma}
                    )
            for b in (1, 2, 4, 8):
                for method in (AR, *_own("table6_7", model)):
                    cells.append({"experiment": "batch", "model": model, "method": method, "dataset": ds, "B": b})
            if _model(model)[0]["default_drafter"] == _variant_of():
                for method in drafts_own:
                    cells.append({"experiment": "table5", "model": model, "method": method, "dataset": ds, "gto": True})
        for method in sweep("table4").methods:
            cells.append({"experiment": "table4", "model": model, "method": method, "dataset": "gsm8k"})
        for ds in ("gsm8k", "mtbench"):
            for ckpt in ("acc50", "acc60", "final"):
                for method in sweep("table9").methods:
                    cells.append(
                        {"experiment": "table9", "model": model, "method": method, "dataset": ds, "ckpt": ckpt}
                    )
            for method in sweep("table10").methods:
                cells.append({"experiment": "table10", "model": model, "method": method, "dataset": ds})
    for model, budgets in BUDGETS.items():
        for ds in ("gsm8k", "humaneval"):
            for method in [m for m in sweep(MOESPEC).methods if m in budgeted().values()]:
                for b in budgets:
                    cells.append({"experiment": MOESPEC, "model": model, "method": method, "dataset": ds, "EB": b})
    return cells


def _variant_of() -> str | None:
    """The drafter kind a variant head (GTO's: no model's standard drafter) trains further."""
    return next((k.shape_of for k in drafter_kinds() if not k.standard), None)


def _cost_aware(method: str) -> bool:
    """EcoSpec's numbers: an unbudgeted method past AR and the baseline (its budgeted twin keeps the baseline's)."""
    return role_of(method) not in (AR, BASE_ROLE) and not conf_of(method).get("budgeted")


def _learned(method: str) -> bool:
    """It runs the learned expert predictor."""
    return spec_of(method).predictor == "learned"


@cache
def _knobs(model: str) -> dict:
    """max_new_tokens and num_prompts of the experiment that runs `model`'s main cells (the embedded default's
    tiny_repro, the paper's table1)."""
    conf = experiment_conf("tiny_repro" if model == EMBEDDED else "table1")
    return {"max_new_tokens": conf["max_new_tokens"], "num_prompts": conf["num_prompts"]}


@cache
def _model(name: str) -> tuple[dict, object]:
    """The conf/model config as a record stores it (no `facts`), and its cost model."""
    cfg = load_model_config(name)
    return {k: v for k, v in cfg.items() if k != "facts"}, model_cost(name)


def _config(c: dict, seed: int) -> dict:
    model = dict(_model(c["model"])[0])
    kind = model["default_drafter"]
    if c.get("gto"):
        model["drafters"] = {**model["drafters"], kind: {**model["drafters"][kind], "path": f"gto/{c['model']}-{kind}"}}
    model["predictor"] = {**model["predictor"], "checkpoint": c.get("ckpt", model["predictor"]["checkpoint"])}
    if "checkpoints" in model["predictor"]:  # a trained predictor per checkpoint name
        model["predictor"]["checkpoints"] = {k: f"predictors/{c['model']}/{k}" for k in ("final", "acc50", "acc60")}
    return {
        "model": model,
        "method": method_config(c["method"]),  # conf/method/<name>.yaml, as a cell's record holds it
        "dataset": {"name": c["dataset"], "source": None},
        "temperature": c.get("T", 0.0),
        "top_p": 1.0,
        "gamma": c.get("gamma", model.get("gamma", 4)),  # the main cells at the model's own gamma (conf/model)
        "depth": 3,
        "topk": 2,
        "batch_size": c.get("B", 1),
        **_knobs(c["model"]),
        "seed": seed,
        **({"expert_budget": c["EB"], "budget_policy": "truncate"} if "EB" in c else {}),
    }


def _summary(c: dict, cfg: dict, rng: np.random.Generator, cost) -> dict:
    e_base, e_eco, a_base, a_eco, t_ar, tv_base, t_draft = PAPERISH[c["model"]]
    method, k = c["method"], cost.top_k
    noise = lambda s=0.04: float(rng.normal(1.0, s))  # noqa: E731
    gamma, batch = cfg["gamma"], cfg["batch_size"]
    scale_e = (1 + 0.18 * (gamma - 4)) * batch**0.55
    if method == AR:  # one token per step; E = k at B=1 (a batch's tokens route apart)
        alpha, e, t_verify, t_draft, t_pred = 1.0, k * batch**0.7, t_ar * batch**0.3 * noise(0.02), 0.0, 0.0
    else:
        eco = _cost_aware(method)
        e = (e_eco if eco else e_base) * scale_e
        alpha = (a_eco if eco else a_base) * (1 + 0.1 * (gamma - 4))
        e_by, alpha_by = EFFECT.get(method, (1.0, 1.0))
        e, alpha = e * e_by, alpha * alpha_by
        if c.get("ckpt") in ("acc50", "acc60"):
            e, alpha = e * (1.08 if c["ckpt"] == "acc50" else 1.04), alpha * 0.97
        if c.get("gto"):
            alpha = alpha * 1.12
        if "EB" in c:  # the cap: E at most B, acceptance falls as the cap bites
            bite = max(0.0, 1.0 - c["EB"] / e)
            e, alpha = min(e, c["EB"]), alpha * (1.0 - 0.3 * bite)
        t_verify = tv_base * (e / e_base) ** 0.6 * batch**0.3
        t_pred = 0.004 if eco and _learned(method) else 0.0
        alpha, e, t_verify = alpha * noise(), min(e * noise(), cost.num_experts), t_verify * noise()
    t_select = 3e-5 if method != AR else 0.0
    t_step = t_pred + t_draft + t_select + t_verify
    ar_t_step = t_ar * batch**0.3 * noise(0.02)
    steps = int(cfg["num_prompts"] * cfg["max_new_tokens"] / alpha)
    tokens = int(steps * alpha)
    tps, ar_tps = alpha / t_step, 1.0 / ar_t_step
    cap = min(c.get("EB", cost.num_experts), cost.num_experts)  # a budgeted pass activates at most B experts
    by_layer = rng.normal(min(e, cap), 0.0 if method == AR else 0.1 * e, cost.moe_layers).clip(k, cap)
    return {
        "alpha": alpha,
        "experts_per_layer": float(by_layer.mean()),
        "experts_by_layer": by_layer.tolist(),
        "t_pred_s": t_pred,
        "t_draft_s": t_draft,
        "t_select_s": t_select,
        "t_verify_s": t_verify,
        "t_step_s": t_step,
        "t_prefill_s": t_verify * 2,
        "tokens": tokens,
        "steps": steps,
        "prompts": cfg["num_prompts"],
        "seconds": tokens / tps,
        "tokens_per_s": tps,
        "ar_tokens_per_s": ar_tps,
        "ar_t_step_s": ar_t_step,
        "speedup": tps / ar_tps,
        "matches_ar": 1.0 if cfg["temperature"] == 0 else None,
        "hbm_bytes_per_verify": verify_hbm_bytes(cost, float(by_layer.mean())),
        "predictor_accuracy": ACCURACY.get(cfg["model"]["predictor"]["checkpoint"])
        if _cost_aware(method) and _learned(method)
        else None,
        "top_k": k,
        "num_experts": cost.num_experts,
        "num_moe_layers": cost.moe_layers,
        **({} if "EB" not in c else _quality(c, e_base)),
    }


def _quality(c: dict, e_free: float) -> dict:
    """A budgeted cell's quality vs AR, worse the more the cap bites."""
    bite = max(0.0, 1.0 - c["EB"] / e_free)
    return {
        "budget_error_rate": 0.08 * bite,
        "matches_ar": max(0.0, 1.0 - 1.5 * bite),
        "first_divergence": 64 * (1 - bite),
    }


def _prompts(summary: dict, cfg: dict, rng: np.random.Generator) -> list[dict]:
    """Two prompt rows (a real record has one per prompt turn; two keep the files small)."""
    rows = []
    for i in range(2):
        n = min(cfg["max_new_tokens"], 16)
        steps = max(1, round(n / summary["alpha"]))
        rows.append(
            {
                "id": f"{cfg['dataset']['name']}/{i}",
                "turn": 0,
                "prompt_tokens": int(rng.integers(50, 400)),
                "tokens": rng.integers(3, 4096, n).tolist(),
                "n_tokens": n,
                "steps": steps,
                "accepted": n,
                "verified": steps * cfg["gamma"],
                "seconds": steps * summary["t_step_s"],
                "t_prefill_s": summary["t_prefill_s"],
                **{f"{p}_s": steps * summary[f"{p}_s"] for p in ("t_pred", "t_draft", "t_select", "t_verify")},
                "t_total_s": steps * summary["t_step_s"],
                "alpha": n / steps,
                "experts_per_layer": summary["experts_per_layer"],
                **({"matches_ar": True} if cfg["temperature"] == 0 else {}),
                "experts_by_layer": summary["experts_by_layer"],
            }
        )
    return rows


def _full_prompts(summary: dict, cfg: dict, rng: np.random.Generator) -> list[dict]:
    """One row per prompt as `experiment.metrics.public_row` stores it: its generated token ids (eos-truncated at
    a random length, at most max_new_tokens), step counts, phase seconds and per-layer experts."""
    dataset, gamma, top = cfg["dataset"]["name"], cfg["gamma"], cfg["max_new_tokens"]
    spread = 0.0 if cfg["method"]["name"] == AR else 0.1 * summary["experts_per_layer"]
    rows = []
    for i in range(cfg["num_prompts"]):
        n = int(rng.integers(max(1, top // 4), top + 1))
        steps = max(1, round(n / summary["alpha"]))
        phases = {f"{p}_s": steps * summary[f"{p}_s"] * float(rng.normal(1.0, 0.05)) for p in ("t_pred", "t_draft")}
        phases |= {f"{p}_s": steps * summary[f"{p}_s"] * float(rng.normal(1.0, 0.05)) for p in ("t_select", "t_verify")}
        seconds = sum(phases.values())
        by_layer = rng.normal(summary["experts_per_layer"], spread, summary["num_moe_layers"]).clip(summary["top_k"])
        rows.append(
            {
                "id": f"{dataset}/{i}",
                "turn": 0,
                "prompt_tokens": int(rng.integers(50, 400)),
                "tokens": rng.integers(3, 150_000, n).tolist(),
                "n_tokens": n,
                "steps": steps,
                "accepted": n,
                "verified": steps * gamma,
                "seconds": seconds,
                "t_prefill_s": summary["t_prefill_s"] * float(rng.normal(1.0, 0.05)),
                **phases,
                "t_total_s": seconds,
                "alpha": n / steps,
                "experts_per_layer": float(by_layer.mean()),
                **({"matches_ar": True} if cfg["temperature"] == 0 else {}),
                "experts_by_layer": by_layer.tolist(),
            }
        )
    return rows


def _ar_rows(summary: dict, cfg: dict, rng: np.random.Generator) -> list[dict]:
    """The AR baseline's timing rows, one per prompt (`experiment.cell.TIMING`), as a cell's `ar_prompts`."""
    rows = []
    for i in range(cfg["num_prompts"]):
        n = int(rng.integers(max(1, cfg["max_new_tokens"] // 4), cfg["max_new_tokens"] + 1))
        seconds = n * summary["ar_t_step_s"] * float(rng.normal(1.0, 0.03))
        rows.append(
            {
                "id": f"{cfg['dataset']['name']}/{i}",
                "turn": 0,
                "n_tokens": n,
                "seconds": seconds,
                "hf_tokens": n,
                "hf_seconds": seconds * float(rng.normal(1.05, 0.03)),
            }
        )
    return rows


def _load(summary: dict, rng: np.random.Generator) -> list[list[int]]:
    """[MoE layers][N] routed-token counts with a few hot experts per layer."""
    layers, n = summary["num_moe_layers"], summary["num_experts"]
    weights = rng.gamma(0.6, 1.0, (layers, n))
    total = summary["steps"] * summary["top_k"] * 3
    return (weights / weights.sum(axis=1, keepdims=True) * total).astype(np.int64).tolist()


TRACE_STEPS = 12  # verify passes per prompt in a traced synthetic record (2 prompts)
TREE = {"parents": [-1, 0, 0, 1], "depths": [0, 1, 1, 2]}  # γ = 4: the root, two children, a grandchild


def _next_routes(prev: np.ndarray, weights: np.ndarray, keep: float, rng: np.random.Generator) -> np.ndarray:
    """A token's expert sets [layers, k] after `prev`'s: each expert kept with probability `keep` (temporal
    overlap), the others drawn by the layer's expert weights (skewed loads)."""
    out = np.empty_like(prev)
    for layer, (experts, w) in enumerate(zip(prev, weights, strict=True)):
        kept = experts[rng.random(len(experts)) < keep]
        w = w.copy()
        w[kept] = 0.0
        out[layer, : len(kept)] = kept
        out[layer, len(kept) :] = rng.choice(len(w), len(experts) - len(kept), replace=False, p=w / w.sum())
    return out


def _trace(cfg: dict, cost, rng: np.random.Generator) -> list[dict]:
    """Verify-pass traces as run_cell stores them: per prompt, TRACE_STEPS passes over a committed sequence with
    temporal overlap (the same sequence for every greedy method, as in greedy SD); accepted paths drawn at random,
    rejected drafts routed after their parent."""
    dataset, layers, k, n = cfg["dataset"]["name"], cost.moe_layers, cost.top_k, cost.num_experts
    out = []
    for p in range(2):
        seq_seed = [p, zlib.crc32(dataset.encode())] + ([] if cfg["temperature"] == 0 else [int(rng.integers(1 << 30))])
        seq_rng = np.random.default_rng(seq_seed)
        weights = seq_rng.gamma(0.8, 1.0, (layers, n))
        seq = [np.stack([seq_rng.choice(n, k, replace=False) for _ in range(layers)])]
        for step in range(TRACE_STEPS):
            u = rng.random(2)
            path = [0, 1] + ([3] if u[1] < 0.5 else []) if u[0] < 0.55 else [0] + ([2] if u[1] < 0.3 else [])
            while len(seq) < len(path) + 1:
                seq.append(_next_routes(seq[-1], weights, 0.4, seq_rng))
            block: list = [None] * 4
            for j, i in enumerate(path):
                block[i] = seq[j]
            for i in range(1, 4):
                if block[i] is None:
                    block[i] = _next_routes(block[TREE["parents"][i]], weights, 0.4, rng)
            out.append(
                {
                    "prompt": f"{dataset}/{p}",
                    "turn": 0,
                    "step": step,
                    "tokens": rng.integers(3, 500, 4).tolist(),
                    **TREE,
                    "path": path,
                    "routes": np.stack(block, axis=1).tolist(),
                }
            )
            seq = seq[len(path) :]  # the bonus token, seq[len(path)], is the next pass's root
    return out


def synthetic_records(n: int, seed: int = 0) -> list[dict]:
    """`n` records: the grid's cells in order, then reruns of them (seed r, sweep `<name>_rerun<r>`), each
    finished a minute after the previous one; every 50th record is a failed cell."""
    return list(iter_records(n, seed))


def iter_records(n: int, seed: int = 0, full_rows: bool = False) -> Iterator[dict]:
    """`synthetic_records` one at a time. `full_rows`: each ok record carries a row per prompt (`num_prompts`)
    with its generated tokens, and the AR baseline's per-prompt timing rows (`ar_prompts`), as a real cell writes
    them, drawn from a stream of their own (every other field is the same)."""
    rng = np.random.default_rng(seed)
    grid = _grid()
    start = datetime(2026, 1, 1, tzinfo=UTC)
    for i in range(n):
        r, c = divmod(i, len(grid))
        c = grid[c]
        cfg = _config(c, seed=r)
        name = c["experiment"] + (f"_rerun{r}" if r else "")
        device = "cpu" if c["model"] == EMBEDDED else "cuda:0"
        hardware = CPU if device == "cpu" else BATCH_GPU if c["experiment"] == "batch" else GPU
        finished = start + timedelta(minutes=i)
        wall = float(rng.uniform(20, 900))
        rec = {
            "schema": SCHEMA,
            "cell_id": cell_id(cfg),
            "cell": cell_name(cell_config(cfg)),
            "experiment": name,
            "status": "running",
            "config": {**cfg, **RUN, "name": name},
            "started": (finished - timedelta(seconds=wall)).isoformat(timespec="seconds"),
            "env": {**ENV, "device": device, "hardware": hardware},
        }
        if i % 50 == 49:
            rec["status"] = "failed"
            rec["error"] = "RuntimeError: CUDA out of memory (synthetic)"
            rec["traceback"] = "Traceback (most recent call last):\nRuntimeError: CUDA out of memory (synthetic)\n"
        else:
            summary = _summary(c, cfg, rng, _model(c["model"])[1])
            rec["summary"] = summary
            rec["prompts"] = _prompts(summary, cfg, rng)
            if full_rows:
                rows_rng = np.random.default_rng([seed, i, 1])
                rec["ar_prompts"] = _ar_rows(summary, cfg, rows_rng)
                rec["prompts"] = _full_prompts(summary, cfg, rows_rng)
            rec["expert_load"] = _load(summary, rng)
            if r == 0 and c["experiment"] == "table1" and c["model"] == EMBEDDED and c["method"] != AR:
                rec["trace"] = _trace(cfg, _model(c["model"])[1], np.random.default_rng([seed, i]))  # own stream
            rec["status"] = "ok"  # keeps its place after `experiment`, as in run_cell
        rec["finished"] = finished.isoformat(timespec="seconds")
        rec["wall_s"] = wall
        yield rec
