"""Result records -> one pandas DataFrame, a row per readable `result.json` (failed cells included, with NaN
metrics, so the index can count them), read by `experiment.records.load_record` with only the sidecar parts the
report uses (`READ_PARTS`). A corrupt or partial file (or sidecar) is skipped with a warning naming it.

Columns (the tables and figures read only these): experiment, cell, cell_id, path, status, finished (UTC
datetime), the cell's axes (model, method, dataset, temperature, top_p, gamma, depth, topk, batch_size,
max_new_tokens, num_prompts, split, seed, expert_budget), batch_buffer ("sequence" at B = 1), budget_policy (None
without a budget), selector, drafter (the kind used: `default` resolved to the model's), drafter_path,
predictor_checkpoint (learned predictors only), hardware, device, backend (hf or vllm), backend_tp, quantization
(vLLM records: what the server reports), the summary metrics (alpha, E =
experts_per_layer, experts_by_layer, t_pred_s, t_draft_s, t_select_s, t_verify_s, t_step_s, tokens, steps,
tokens_per_s, ar_tokens_per_s, ar_t_step_s, speedup, matches_ar, hbm_bytes_per_verify, predictor_accuracy, top_k,
num_experts, num_moe_layers, rho, passes, ar_experts_per_layer; budgeted cells also budget_error_rate,
first_divergence, loglik_per_token, ar_loglik_per_token; ar_source; vLLM records tpot_s, ttft_s, ar_tpot_s,
ar_ttft_s, acceptance_by_position, requests; clock: the cell's clock, `wall` or `thread_cpu`, None before the
knob; intervals: the cell's bootstrap intervals and per-unit columns, `experiment.intervals`, None before them),
expert_load ([MoE layers, N] integer array or None) and
trace (the record's verify-pass traces, a list of dicts, or None; `analysis.traces` reads them) and routes (a vLLM
record's committed sequences with vLLM's own routing, `vllm_backend.routes`, or None).
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from ecospec import sources
from ecospec.experiment.records import RESULT, SCHEMA, load_record
from ecospec.report.write import page_markdown, write_page

AXES = (
    "temperature",
    "top_p",
    "gamma",
    "depth",
    "topk",
    "batch_size",
    "max_new_tokens",
    "num_prompts",
    "split",
    "seed",
    "expert_budget",
)
SUMMARY = (
    "alpha",
    "experts_by_layer",
    "t_pred_s",
    "t_draft_s",
    "t_select_s",
    "t_verify_s",
    "t_step_s",
    "tokens",
    "steps",
    "tokens_per_s",
    "ar_tokens_per_s",
    "ar_t_step_s",
    "speedup",
    "matches_ar",
    "hbm_bytes_per_verify",
    "predictor_accuracy",
    "top_k",
    "num_experts",
    "num_moe_layers",
    "rho",
    "passes",
    "batches",
    "prompts",
    "ar_experts_per_layer",
    "budget_error_rate",
    "first_divergence",
    "loglik_per_token",
    "ar_loglik_per_token",
    "ar_source",
    "tpot_s",
    "ttft_s",
    "ar_tpot_s",
    "ar_ttft_s",
    "acceptance_by_position",
    "requests",
    "clock",
    "intervals",
    "mean_block",
    "speculating",
)
COLUMNS = (
    "experiment",
    "cell",
    "cell_id",
    "path",
    "status",
    "finished",
    "model",
    "method",
    "dataset",
    *AXES,
    "model_gamma",
    "batch_buffer",
    "budget_policy",
    "selector",
    "drafter",
    "drafter_path",
    "predictor_checkpoint",
    "hardware",
    "device",
    "backend",
    "backend_tp",
    "engine",
    "compile_s",
    "quantization",
    "alpha",
    "E",
    *SUMMARY[1:],
    "expert_load",
    "trace",
    "routes",
    "profile",
    "demo_gpu",
    "interleaved_in",
)


@dataclass
class Records:
    """The frame plus what the index and the cost model need besides it."""

    frame: pd.DataFrame
    skipped: list[str] = field(default_factory=list)  # unreadable or partial files (warned)
    model_configs: dict[str, dict] = field(default_factory=dict)  # model -> its newest ok record's config.model
    storages: dict[str, dict] = field(default_factory=dict)  # model -> env.storage of its newest ok HF record
    logger: dict = field(default_factory=dict)  # the newest record's W&B logger setting ({} where none logged there)


def _problem(rec) -> str | None:
    """Why a parsed record cannot be used, or None."""
    if not isinstance(rec, dict) or rec.get("schema") != SCHEMA or "status" not in rec:
        return f"not an ecospec schema-{SCHEMA} record"
    cfg = rec.get("config")
    if not isinstance(cfg, dict) or not all(isinstance(cfg.get(k), dict) for k in ("model", "method", "dataset")):
        return "no cell config (partial record)"
    if rec["status"] == "ok" and not isinstance(rec.get("summary"), dict):
        return "an ok record without its summary (partial record)"
    return None


def _row(rec: dict, path: str | Path) -> dict:
    cfg = rec["config"]
    model, method = cfg["model"], cfg["method"]
    drafter = method.get("drafter")
    drafter = model.get("default_drafter") if drafter == "default" else drafter
    drafter_cfg = (model.get("drafters") or {}).get(drafter) or {}
    ok = rec["status"] == "ok"
    s = rec.get("summary") if ok else None
    s = s or {}
    env = rec.get("env") or {}
    row = {
        "experiment": rec.get("experiment"),
        "cell": rec.get("cell"),
        "cell_id": rec.get("cell_id"),
        "path": str(path),
        "status": rec["status"],
        "finished": rec.get("finished") or rec.get("started"),
        "model": model.get("name"),
        "method": method.get("name"),
        "dataset": cfg["dataset"].get("name"),
        **{k: cfg.get(k) for k in AXES},
        "model_gamma": model.get("gamma"),  # the model's own gamma (records from before model.gamma: none)
        "split": cfg.get("split") or "all",  # records from before the split knob ran on every prompt
        # EcoSpec's expert buffer at B > 1: one per sequence (the paper; every record before the knob) or one shared
        "batch_buffer": (cfg.get("batch_buffer") or "sequence") if (cfg.get("batch_size") or 1) > 1 else "sequence",
        # MoE-Spec's cap: the policy only where a budget is set (the knob's default rides along elsewhere)
        "budget_policy": (cfg.get("budget_policy") or "truncate") if cfg.get("expert_budget") is not None else None,
        "selector": method.get("selector"),
        "drafter": drafter,
        "drafter_path": drafter_cfg.get("path"),
        "predictor_checkpoint": (model.get("predictor") or {}).get("checkpoint")
        if method.get("predictor") == "learned"
        else None,
        "hardware": env.get("hardware"),
        "device": env.get("device"),
        # the engine: ours (hf; every record before the knob) or vLLM, with its tensor parallelism and quantization
        "backend": (cfg.get("backend") or {}).get("name") or "hf",
        "backend_tp": (cfg.get("backend") or {}).get("tp"),
        "engine": cfg.get("engine") or "eager",  # our engine's forward: eager (every record before the knob) | compiled
        "compile_s": env.get("compile_s"),  # a compiled cell's warm-up (outside its timings)
        "quantization": (env.get("storage") or {}).get("quantization"),
        "E": s.get("experts_per_layer"),
        **{k: s.get(k) for k in SUMMARY},
        "expert_load": rec.get("expert_load") if ok else None,
        "trace": (rec.get("trace") or None) if ok else None,
        "routes": (rec.get("routes") or None) if ok else None,
        "profile": rec.get("profile"),  # the verify-cost profile a cost-model method priced with ({key, hash})
        "demo_gpu": (cfg.get("demo") or {}).get("gpu"),  # make demo's cells (their own page, in no paper table)
        "interleaved_in": (rec.get("interleaved") or {}).get("in"),  # the cell a companion was decoded beside
    }
    if isinstance(row["expert_load"], list):  # a record given as a dict rather than read from a file
        row["expert_load"] = np.asarray(row["expert_load"], dtype=np.int64) if row["expert_load"] else None
    return row


def find_files(dirs: Iterable[str | Path]) -> list[Path]:
    """Every `result.json` under the given sweep directories (or the files themselves), sorted."""
    out: set[str] = set()
    for d in map(str, dirs):
        if os.path.isfile(d):
            out.add(d)
        else:
            _scan(d, out)
    return [Path(p) for p in sorted(out)]


def _scan(folder: str, out: set[str]) -> None:
    """`result.json` files under `folder` (os.scandir: a fraction of os.walk's time over thousands of cell
    directories; symlinked folders are not entered, as os.walk does not; unreadable ones are passed over)."""
    try:
        entries = list(os.scandir(folder))
    except OSError:
        return
    for e in entries:
        if e.is_dir(follow_symlinks=False):
            _scan(e.path, out)
        elif e.name == RESULT:
            out.add(e.path)


NUMERIC = (
    "temperature",
    "top_p",
    "alpha",
    "E",
    "t_pred_s",
    "t_draft_s",
    "t_select_s",
    "t_verify_s",
    "t_step_s",
    "tokens_per_s",
    "ar_tokens_per_s",
    "ar_t_step_s",
    "speedup",
    "matches_ar",
    "hbm_bytes_per_verify",
    "predictor_accuracy",
    "rho",
    "ar_experts_per_layer",
    "tpot_s",
    "ttft_s",
    "ar_tpot_s",
    "ar_ttft_s",
    "mean_block",
    "speculating",
)


def frame_of(rows: list[dict]) -> pd.DataFrame:
    """The typed frame of `_row` dicts (also for an empty list)."""
    df = pd.DataFrame(rows, columns=list(COLUMNS))
    df["finished"] = pd.to_datetime(df["finished"], utc=True, errors="coerce", format="ISO8601")
    for k in NUMERIC:
        df[k] = pd.to_numeric(df[k], errors="coerce").astype(float)
    return df


def records_frame(records: Iterable[tuple[dict | None, str | Path]]) -> Records:
    """Records already in memory (dicts in the result.json schema, each with the path it stands for; None for a
    file that could not be read, already warned about)."""
    rows, skipped, newest, stored, logged = [], [], {}, {}, ("", {})
    for rec, path in records:
        if isinstance(rec, dict) and rec.get("kind", "cell") != "cell":
            continue  # a traces or predictor job's record: not a cell of any table
        problem = "unreadable" if rec is None else _problem(rec)
        if problem:
            if rec is not None:
                warnings.warn(f"skipping result file {path}: {problem}", stacklevel=2)
            skipped.append(str(path))
            continue
        row = _row(rec, path)
        rows.append(row)
        if row["status"] == "ok" and (row["finished"] or "") >= newest.get(row["model"], ("",))[0]:
            newest[row["model"]] = (row["finished"], rec["config"]["model"])
        logger = rec["config"].get("logger") or {}
        if logger.get("name") == "wandb" and (row["finished"] or "") >= logged[0]:
            logged = (row["finished"] or "", logger)
        storage = (rec.get("env") or {}).get("storage") or {}
        later = (row["finished"] or "") >= stored.get(row["model"], ("",))[0]
        if row["status"] == "ok" and "experts" in storage and later:
            stored[row["model"]] = (row["finished"], storage)  # what loaded (HF cells say; vLLM's do not)
    configs = {name: cfg for name, (_, cfg) in newest.items()}
    return Records(frame_of(rows), skipped, configs, {name: st for name, (_, st) in stored.items()}, logged[1])


READ_PARTS = ("expert_load", "trace", "routes")  # of a record's sidecar parts, the ones the report reads


def read_one(path: str | Path) -> dict:
    """One record as the report reads it (the parts it uses, the expert load as an array); ValueError naming the
    file, or its sidecar, when it cannot be read."""
    return load_record(path, READ_PARTS, arrays=True)


def _read(paths: list[Path]):
    for path in paths:
        try:
            yield read_one(path), path
        except ValueError as e:  # names the file: the record, or its sidecar
            warnings.warn(f"skipping {e}", stacklevel=2)
            yield None, path


def load_records(dirs: Iterable[str | Path], since: str | pd.Timestamp | None = None) -> Records:
    """Read every result file under `dirs` (newest last); `since` keeps records finished at or after it."""
    paths = find_files(dirs)
    out = records_frame(_read(paths))
    if since is not None:
        ts = pd.Timestamp(since)
        ts = ts.tz_localize("UTC") if ts.tzinfo is None else ts.tz_convert("UTC")
        out.frame = out.frame[out.frame["finished"] >= ts].reset_index(drop=True)
        kept = set(out.frame.loc[out.frame["status"] == "ok", "model"])
        out.model_configs = {m: c for m, c in out.model_configs.items() if m in kept}
        out.storages = {m: s for m, s in out.storages.items() if m in kept}
    return out


def conf_defaults(model_configs: dict[str, dict]) -> dict[str, dict]:
    """Per model: its default drafter, drafter path per kind and predictor checkpoint, as conf/model/<name>.yaml
    says (the main tables' cells use these); a model without a conf file takes its newest record's config."""
    from ecospec import conf_dir
    from ecospec.analysis.model_config import load_model_config

    out = {}
    for name, cfg in model_configs.items():
        if (conf_dir() / "model" / f"{name}.yaml").exists():
            cfg = load_model_config(name)
        out[name] = {
            "default_drafter": cfg.get("default_drafter"),
            "drafters": {k: (v or {}).get("path") for k, v in (cfg.get("drafters") or {}).items()},
            "predictor": (cfg.get("predictor") or {}).get("checkpoint"),
            "gamma": cfg.get("gamma"),  # the gamma the tables hold fixed for this model (None: the paper's 4)
        }
    return out


def model_costs(model_configs: dict[str, dict], storages: dict[str, dict] | None = None) -> dict:
    """`analysis.weight_bytes.model_cost` of each model that can be counted offline (conf/model facts, a tiny preset or
    recipe), in the format its newest record says loaded (`storages`: env.storage; the checkpoint's where none
    says); the others are left out with a warning rather than fetched from the Hub."""
    from ecospec import conf_dir
    from ecospec.analysis.model_config import load_model_config
    from ecospec.analysis.weight_bytes import loaded_formats, model_cost

    out = {}
    for name, cfg in model_configs.items():
        facts = cfg.get("facts")
        if facts is None and (conf_dir() / "model" / f"{name}.yaml").exists():
            facts = load_model_config(name).get("facts")
        if sources.real(cfg) and not (facts or {}).get("hf_config"):
            warnings.warn(
                f"model {name}: no facts.hf_config in conf/model, left out of Table 13 and modeled.md", stacklevel=2
            )
            continue
        try:
            out[name] = model_cost(cfg, loaded_formats((storages or {}).get(name)))
        except (ValueError, OSError, KeyError, ImportError) as e:
            warnings.warn(
                f"model {name}: cannot count its parameters ({e}); left out of Table 13 and modeled.md", stacklevel=2
            )
    return out


def mean_positions(values, depth: int = 5) -> list[float]:
    """Per-position acceptance averaged over cells (`summary.acceptance_by_position` lists; a position a cell never
    drafted is absent from its mean), at most `depth` positions."""
    rows = [r for r in values if isinstance(r, list) and r]
    if not rows:
        return []
    return [float(np.mean([r[i] for r in rows if len(r) > i])) for i in range(min(depth, max(map(len, rows))))]


def render_cli(prog: str, doc: str, records: str, build_page, argv=None, with_out: bool = False) -> int:
    """The command line of a one-page report (`report.engines`, `report.moe_methods`): the page `build_page(frame)`
    makes of the records under `--records`, printed, and written to `--out` by the report's writer when given
    (`with_out`: `build_page(frame, out)` writes its own figures there)."""
    import argparse

    p = argparse.ArgumentParser(prog=prog, description=doc.split("\n\n")[0])
    p.add_argument("--records", type=Path, default=Path(records))
    p.add_argument("--out", type=Path, default=None, help="write the page there (else print)")
    a = p.parse_args(argv)
    frame = load_records([a.records]).frame
    page = build_page(frame, a.out) if with_out else build_page(frame)
    if a.out:
        write_page(page, a.out)
    print(page_markdown(page))
    return 0
