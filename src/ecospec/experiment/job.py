"""What every job of run.py shares (cells, traces, predictor training): skip a finished job, validate before
anything loads, pin the device and threads, turn an exception into a `failed` record (a sweep goes on), and
write the record atomically without ever replacing an ok one."""

from __future__ import annotations

import os
import time
import traceback
from collections.abc import Callable
from pathlib import Path

import torch

from ecospec.experiment.components import pick_device
from ecospec.experiment.config import as_dict, job_config, job_id, job_kind, job_name, validate_job
from ecospec.experiment.records import FAILED, RESULT, SCHEMA, environment, is_done, now, read_record, write_json_atomic

RUN_KEYS = ("name", "out_dir", "device", "threads", "force", "progress", "logger", "ar_baseline")

# body(d, job_dir, device, record): does the job's work and fills the record (summary and the rest)
Body = Callable[[dict, Path, torch.device, dict], None]


def setup_device(d: dict) -> torch.device:
    """The job's device, and torch's CPU threads: explicit > Slurm's allocation (no cgroups: jobs see every core)
    > the model's CPU default."""
    device = pick_device(d.get("device", "auto"))
    threads = d.get("threads") or os.environ.get("SLURM_CPUS_PER_TASK")
    if not threads and device.type == "cpu":
        threads = d["model"].get("cpu_threads")
    if threads:
        torch.set_num_threads(int(threads))
    return device


def write_record(job_dir: Path, record: dict) -> Path:
    """result.json, unless this is a failure and an ok record is already there (then failed.json)."""
    path = job_dir / RESULT
    if path.exists():
        old = read_record(path)
        if old is None:  # unreadable: keep it for inspection rather than overwrite it
            path.rename(path.with_name(f"{RESULT}.corrupt-{int(time.time())}"))
        elif record["status"] != "ok" and old["status"] == "ok":
            path = job_dir / FAILED
    write_json_atomic(path, record)
    if record["status"] == "ok":
        (job_dir / FAILED).unlink(missing_ok=True)
    return path


def run_job(cfg, job_dir: str | Path, body: Body, made: Callable[[dict], bool] | None = None) -> dict:
    """Run (or skip) one job and return its record. A job with an ok record is skipped, unless what it makes
    outside its directory (`made(d)`: e.g. traces in the store) is gone."""
    d = as_dict(cfg)
    job_dir = Path(job_dir)
    jid = job_id(d)
    if is_done(job_dir, jid) and not d.get("force") and (made is None or made(d)):
        rec = read_record(job_dir / RESULT)
        rec["skipped"] = True
        return rec
    kind = job_kind(d)
    record = {
        "schema": SCHEMA,
        "kind": kind,
        "cell_id": jid,
        "cell": job_name(d),
        "experiment": d.get("name"),
        "status": "running",
        "config": {**job_config(d), **{k: d.get(k) for k in RUN_KEYS}},
        "started": now(),
    }
    t0 = time.perf_counter()
    try:
        validate_job(d)
        device = setup_device(d)
        record["env"] = environment(device)
        body(d, job_dir, device, record)
        record["status"] = "ok"
    except Exception as e:  # noqa: BLE001 - a failed job is data; the sweep goes on
        record["status"] = "failed"
        record["error"] = f"{type(e).__name__}: {e}"
        record["traceback"] = traceback.format_exc()
    record["finished"] = now()
    record["wall_s"] = time.perf_counter() - t0
    write_record(job_dir, record)
    if kind == "cell" and (d.get("logger") or {}).get("name", "none") != "none":
        from ecospec.experiment.tracking import log_cell

        log_cell(record, d["logger"], job_dir)
    return record


def run_any(cfg, job_dir: str | Path) -> dict:
    """The job the config names (`job`: cell, traces or predictor)."""
    kind = job_kind(cfg)
    if kind == "traces":
        from ecospec.experiment.traces_job import run_traces

        return run_traces(cfg, job_dir)
    if kind == "predictor":
        from ecospec.experiment.predictor_job import run_predictor

        return run_predictor(cfg, job_dir)
    from ecospec.experiment.cell import run_cell

    return run_cell(cfg, job_dir)
