"""Run one cell: validate, load prompts and components, decode every prompt (checkpointed), measure or reuse
the AR baseline, and write `result.json`. A failure becomes a `failed` record; it never raises, so the
other cells of a sweep go on, and it never overwrites an ok record."""

from __future__ import annotations

import time
from dataclasses import asdict
from pathlib import Path

import torch
from tqdm.auto import tqdm

import ecospec
from ecospec.analysis.cost import verify_hbm_bytes
from ecospec.cache import digest
from ecospec.data import encode_turn, load_prompts
from ecospec.experiment.components import Components, load_components
from ecospec.experiment.job import run_job
from ecospec.experiment.metrics import expert_load, prompt_row, public_row, step_traces, summarize
from ecospec.experiment.records import SCHEMA, Progress, now, read_record, write_json_atomic
from ecospec.models import moe_info

AR_CACHE = "ar_cache"


AR_METHOD = {"name": "ar", "selector": "confidence"}


def _decode_prompt(comp: Components, p, cfg: dict, progress: Progress, method: dict, trace_left: int) -> list[dict]:
    """Every turn of prompt `p` with `method`'s drafter/selector/predictor (AR when its name is 'ar'); rows
    already in `progress` are reused. `trace_left`: verify passes whose traces may still be kept."""
    ar = method["name"] == "ar"
    rows, answers = [], []
    for turn in range(len(p.turns)):
        key = f"{method['name']}/{p.id}/{turn}"
        row = progress.rows.get(key)
        if row is None:
            ids = encode_turn(comp.tokenizer, p.turns, answers, p.completion, cfg["model"].get("chat_template", True))
            t0 = time.perf_counter()
            res = ecospec.generate(
                comp.target, torch.tensor([ids]), drafter=None if ar else comp.drafter,
                selector=method["selector"], predictor=None if ar else comp.predictor, gamma=cfg["gamma"],
                depth=cfg["depth"], topk=cfg["topk"], temperature=cfg["temperature"], top_p=cfg["top_p"],
                max_new_tokens=cfg["max_new_tokens"], seed=cfg["seed"], trace=not ar and trace_left > 0,
            )  # fmt: skip
            seconds = time.perf_counter() - t0
            row = prompt_row(p.id, turn, len(ids), res, seconds, not ar and comp.predictor == "oracle")
            if not ar and trace_left > 0:
                row["trace"] = [asdict(st.trace) for st in res.steps[:trace_left]]
            progress.add(key, row)
        rows.append(row)
        trace_left -= len(row.get("trace", ()))
        answers.append(comp.tokenizer.decode(row["tokens"], skip_special_tokens=True))
    return rows


def _decode_prompts(comp: Components, prompts, cfg: dict, progress: Progress, interleave_ar: bool):
    """(the method's rows, AR's rows or None): every prompt with the cell's method and, when `interleave_ar`, with
    AR right after it (so a machine that slows down slows both alike: the speedup is a ratio of one run)."""
    method = cfg["method"]
    trace_left = 0 if method["name"] == "ar" else int(cfg.get("trace_steps") or 0)  # over the whole cell
    rows, ar_rows = [], [] if interleave_ar else None
    name = method["name"] + (" + ar" if interleave_ar else "")
    bar = tqdm(prompts, desc=f"{name} {cfg['dataset']['name']}", unit="prompt", disable=not cfg.get("progress", True))
    for p in bar:
        new = _decode_prompt(comp, p, cfg, progress, method, trace_left)
        trace_left -= sum(len(r.get("trace", ())) for r in new)
        rows += new
        if interleave_ar:
            ar_rows += _decode_prompt(comp, p, cfg, progress, AR_METHOD, 0)
    return rows, ar_rows


def ar_key(cfg: dict, hardware: str) -> dict:
    """What makes two AR baselines interchangeable: target, prompts, decoding settings, hardware."""
    model = {k: v for k, v in cfg["model"].items() if k not in ("drafters", "default_drafter", "predictor", "facts")}
    keys = ("dataset", "temperature", "top_p", "batch_size", "num_prompts", "split", "max_new_tokens", "seed")
    return {"model": model, **{k: cfg.get(k, "heldout" if k == "split" else None) for k in keys}, "hardware": hardware}


def _ar_baseline(comp, prompts, cfg, progress, hardware: str, own_rows) -> dict:
    """The AR record of this cell's key: from the cache, or measured now (and cached)."""
    key = ar_key(cfg, hardware)
    path = Path(cfg["out_dir"]) / AR_CACHE / f"{digest(key, 16)}.json"
    if own_rows is None and path.exists():
        cached = read_record(path)
        if cached and cached.get("key") == key:
            return cached
    if own_rows is not None:
        rows = own_rows
    else:
        rows = [
            r for p in prompts for r in _decode_prompt(comp, p, {**cfg, "method": AR_METHOD}, progress, AR_METHOD, 0)
        ]
    summary = summarize(rows)
    ar = {
        "schema": SCHEMA,
        "status": "ok",
        "key": key,
        "created": now(),
        "tokens_per_s": summary["tokens_per_s"],
        "t_step_s": summary["t_step_s"],
        "outputs": {f"{r['id']}/{r['turn']}": r["tokens"] for r in rows},
    }
    write_json_atomic(path, ar)
    return ar


def _summary(comp: Components, cfg: dict, rows: list[dict], ar: dict) -> dict:
    s = summarize(rows)
    s["ar_tokens_per_s"] = ar["tokens_per_s"]
    s["ar_t_step_s"] = ar["t_step_s"]
    s["speedup"] = s["tokens_per_s"] / ar["tokens_per_s"] if s["tokens_per_s"] and ar["tokens_per_s"] else None
    if cfg["temperature"] == 0:
        same = [r["tokens"] == ar["outputs"].get(f"{r['id']}/{r['turn']}") for r in rows]
        s["matches_ar"] = sum(same) / len(same)
        for r, m in zip(rows, same, strict=True):
            r["matches_ar"] = m
    else:
        s["matches_ar"] = None
    info = moe_info(comp.target)
    s["hbm_bytes_per_verify"] = verify_hbm_bytes(cfg["model"], s["experts_per_layer"] or 0.0)
    s["predictor_accuracy"] = comp.predictor_accuracy
    s["top_k"] = info.top_k
    s["num_experts"] = info.num_experts
    s["num_moe_layers"] = info.num_moe_layers
    return s


def _decode_cell(d: dict, cell_dir: Path, device: torch.device, record: dict) -> None:
    """The cell's work: prompts, components, every prompt decoded (checkpointed), the AR baseline, the summary."""
    ds = d["dataset"]
    # fails fast, before any model; counted within the split (heldout: the 20 % no predictor trained on)
    prompts = load_prompts(ds["name"], d["num_prompts"], ds.get("source"), split=d.get("split", "heldout"))
    record["data_source"] = prompts.source  # hub:, hf-cache:, vendored:, local: or package:
    comp = load_components(d, device)
    progress = Progress(cell_dir, record["cell_id"], fresh=bool(d.get("force")))
    # the AR baseline: measured here, prompt by prompt beside the method (CPU: noisy, shared machines), or taken
    # from the AR cache (GPU: stable, and AR is the most expensive decoder)
    mode = d.get("ar_baseline") or "auto"
    interleave = d["method"]["name"] != "ar" and (mode == "interleaved" or (mode == "auto" and device.type == "cpu"))
    rows, ar_rows = _decode_prompts(comp, prompts, d, progress, interleave)
    own = rows if d["method"]["name"] == "ar" else ar_rows
    ar = _ar_baseline(comp, prompts, d, progress, record["env"]["hardware"], own)
    record["summary"] = _summary(comp, d, rows, ar)
    record["prompts"] = [public_row(r) for r in rows]
    record["expert_load"] = expert_load(rows)
    if d.get("trace_steps"):
        record["trace"] = step_traces(rows)
    progress.clear()


def run_cell(cfg, cell_dir: str | Path) -> dict:
    """Run (or skip) one cell and return its record."""
    return run_job(cfg, cell_dir, _decode_cell)


def one_line(record: dict) -> str:
    """α, E, speedup vs AR and estimated HBM per verify pass of a cell's record (what a traces or predictor job
    made), or its error."""
    if record["status"] != "ok":
        return f"{record['cell']}: FAILED {record.get('error', '')}"
    s = record["summary"]
    skipped = " (existing record)" if record.get("skipped") else ""
    if record.get("kind") == "traces":
        return f"{record['cell']}{skipped}: {s['samples']} samples, {s['tokens']:,} tokens traced -> {s['trace_dir']}"
    if record.get("kind") == "predictor":
        return (
            f"{record['cell']}{skipped}: held-out top-k accuracy {s['final_accuracy']:.3f} (chance {s['chance']:.3f}); "
            f"published {', '.join(s['published'])} -> {s['store']}"
        )
    clock = " (CPU wall clock)" if record.get("env", {}).get("device") == "cpu" else ""
    return (
        f"{record['cell']}{skipped}: alpha {s['alpha']:.2f}  E {s['experts_per_layer']:.2f}  "
        f"speedup {s['speedup']:.2f}x vs AR{clock}  HBM per verify pass {s['hbm_bytes_per_verify'] / 1e6:.2f} MB (est.)"
    )
