"""What every job of run.py shares (cells, traces, predictor training): skip a finished job, validate before
anything loads, pin the device and threads, turn an exception into a `failed` record (a sweep goes on), and
write the record atomically without ever replacing an ok one."""

from __future__ import annotations

import os
import time
import traceback
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from ecospec import sources
from ecospec.experiment import kinds
from ecospec.experiment.components import pick_device
from ecospec.experiment.config import ConfigError
from ecospec.experiment.kinds import Job
from ecospec.experiment.ranks import in_group_env, rank_errors, spawn_ranks, write_rank_error
from ecospec.experiment.records import (
    FAILED,
    RESULT,
    SCHEMA,
    environment,
    is_done,
    now,
    read_record,
    rows_path,
    write_record_file,
)
from ecospec.identity import aside_name, record_stands, weights_tag
from ecospec.parallel import env_rank, env_world, init_group, mode_of, world
from ecospec.tiny.build import tiny_weights

RUN_KEYS = (
    "name",
    "out_dir",
    "device",
    "threads",
    "force",
    "progress",
    "logger",
    "ar_baseline",
    "ar_peer",
    "ranks",
    "clock",
    "interleave",
    "memory_check",
    "demo",  # make demo's page settings: a demo cell's record says it is one (the report keeps it out of the tables)
)

# body(what the job's validation returned: a cell's `Cell`, else its resolved config; job_dir, device, record):
# does the job's work and fills the record (summary and the rest)
Body = Callable[[Any, Path, torch.device, dict], None]


def setup_device(d: dict, ranks: int = 1) -> torch.device:
    """The job's device (a rank of several: its local GPU), and torch's CPU threads: explicit > Slurm's allocation
    (no cgroups: jobs see every core) > the model's CPU default."""
    device = pick_device(d.get("device", "auto"))
    if ranks > 1 and device.type == "cuda":
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", os.environ.get("SLURM_LOCALID", "0"))))
    threads = d.get("threads") or os.environ.get("SLURM_CPUS_PER_TASK")
    if not threads and device.type == "cpu":
        threads = d["model"].get("cpu_threads")
    if threads:
        torch.set_num_threads(int(threads))
    return device


def machine_ram() -> float:
    """This machine's memory in bytes, or its cgroup's limit where that is smaller (a Slurm job's allocation)."""
    ram = float(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    try:
        limit = Path("/sys/fs/cgroup/memory.max").read_text().strip()
    except OSError:
        return ram
    return min(ram, float(limit)) if limit.isdigit() else ram


def check_memory(d: dict, device: torch.device, ranks: int = 1) -> None:
    """Refuse, in one line and before any download, a real target whose weights cannot fit in what this job has:
    this machine's RAM on the CPU, every visible GPU under device_map, one rank's GPU under tp/ep
    (`analysis.sizing.memory_problem`). A target without sizing facts goes on with a warning;
    `memory_check=false` skips the check (not part of a cell's identity)."""
    model = d["model"]
    if not d.get("memory_check", True) or not sources.real(model) or (d.get("backend") or {}).get("name") == "vllm":
        return
    from ecospec.analysis.sizing import local_weight_bytes, memory_problem

    if not (model.get("facts") or {}).get("hf_config") and local_weight_bytes(model.get("target")) is None:
        warnings.warn(
            f"model={model.get('name')}: no sizing facts (facts.hf_config), its memory is not checked before loading",
            stacklevel=2,
        )
        return
    mode = mode_of(model)
    if device.type == "cuda" and mode == "device_map" and model.get("device_map"):
        n = torch.cuda.device_count()
        have = sum(torch.cuda.get_device_properties(i).total_memory for i in range(n))
        where = f"{n} visible GPU{'s' if n != 1 else ''}"
    elif device.type == "cuda":
        have, where = torch.cuda.get_device_properties(device).total_memory, f"one GPU ({device})"
    else:
        have, where = machine_ram(), "this machine's RAM"
    problem = memory_problem(model, mode, ranks, device.type, float(have), where)
    if problem:
        raise ConfigError(problem)


def write_record(job_dir: Path, record: dict) -> Path:
    """result.json and its sidecar (`records.write_record_file`), unless this is a failure and an ok record is
    already there (then failed.json)."""
    path = job_dir / RESULT
    if path.exists():
        old = read_record(path, parts=False)
        if old is None:  # unreadable: keep it for inspection rather than overwrite it
            path.rename(path.with_name(f"{RESULT}.corrupt-{int(time.time())}"))
        elif record["status"] != "ok" and old["status"] == "ok":
            path = job_dir / FAILED
    write_record_file(path, record)
    if record["status"] == "ok":
        (job_dir / FAILED).unlink(missing_ok=True)
    return path


def run_job(cfg, job_dir: str | Path, body: Body, made: Callable[[dict], bool] | None = None) -> dict:
    """Run (or skip) one job (a `Job`, or a composed config) and return its record. A job with an ok record is
    skipped, unless what it makes outside its directory (`made(config)`: e.g. traces in the store) is gone."""
    job = kinds.job(cfg)
    d = job.config
    job_dir = Path(job_dir)
    rec = kept(job_dir, job, made)
    if rec is not None:
        rec["skipped"] = True
        return rec
    ranks = job.ranks
    if ranks > 1 and not in_group_env():
        return _run_spawned(job, job_dir, ranks, body, made)
    record = record_head(job)
    weights = _weights(d) if job.record.measures else None
    t0 = time.perf_counter()
    try:
        checked = job.validate()
        device = setup_device(d, ranks)
        if job.record.checks_memory:
            check_memory(d, device, ranks)  # before any Hub call: a target that cannot fit never starts a download
        if ranks > 1:
            join_group(d, device, ranks)
        record["env"] = environment(device)
        record["env"]["ranks"] = world()
        if weights is not None:  # which embedded default ran: the release (its identity) or a cache build
            record["env"]["tiny"] = weights
        body(checked, job_dir, device, record)
        record["status"] = "ok"
    except Exception as e:  # noqa: BLE001 - a failed job is data; the sweep goes on
        record["status"] = "failed"
        record["error"] = f"{type(e).__name__}: {e}"
        record["traceback"] = traceback.format_exc()
        if ranks > 1:  # so that rank 0's record (or the spawner's) can name every rank's error
            write_rank_error(job_dir, env_rank(), record["error"])
            others = [x for x in rank_errors(job_dir) if not x.startswith(f"rank {env_rank()}:")]
            if others:
                record["error"] += " [" + "; ".join(others) + "]"
    record["finished"] = now()
    record["wall_s"] = time.perf_counter() - t0
    if ranks > 1:
        leave_group()
    if ranks > 1 and env_rank() != 0:  # rank 0 alone writes the record and the W&B run
        return record
    finish_record(job_dir, job, record)
    return record


def kept(job_dir: Path, job: Job, made: Callable[[dict], bool] | None = None) -> dict | None:
    """The job's ok record, when it has one that still stands (force=false, what it made outside its directory
    still there, made with the embedded-default weights in use; one made with others is set aside), else None."""
    d = job.config
    weights = _weights(d) if job.record.measures else None
    if not is_done(job_dir, job.id) or d.get("force") or (made is not None and not made(d)):
        return None
    rec = read_record(job_dir / RESULT)
    if rec is None:  # its sidecar is unreadable (warned): the job runs again
        return None
    if record_stands(rec, weights):
        return rec
    _set_aside(job_dir, rec, weights)
    return None


def record_head(job: Job) -> dict:
    """A new record of `job`: what identifies it, its config and start time (status running)."""
    d = job.config
    record = {
        "schema": SCHEMA,
        "kind": job.kind,
        "cell_id": job.id,
        "cell": job.name,
        "experiment": d.get("name"),
        "status": "running",
        "config": {**job.identity, **{k: d.get(k) for k in RUN_KEYS}},
        "started": now(),
    }
    if job.record.measures and d["model"].get("gamma") is not None:
        # the model's own gamma: not identity, but the tables hold each model at it (report.frame); a copy, so that
        # the identity stays what identifies the job
        record["config"]["model"] = {**job.identity["model"], "gamma": d["model"]["gamma"]}
    return record


def finish_record(job_dir: Path, job: Job, record: dict) -> None:
    """Write the record (`write_record`) and, for a cell with a logger, its W&B run: the record as written, read
    back whole (sidecar merged), so that W&B mirrors the files."""
    path = write_record(job_dir, record)
    logger = job.config.get("logger") or {}
    if job.record.measures and logger.get("name", "none") != "none":
        from ecospec.experiment.tracking import log_cell

        log_cell(read_record(path) or record, logger, job_dir)


def _weights(d: dict) -> dict | None:
    """The embedded default a tiny job would decode with (None for other models, or a budget or $ECOSPEC_TINY that
    validation is about to refuse with its own message)."""
    if not sources.builtin(d.get("model") or {}):
        return None
    try:
        return tiny_weights(d["model"])
    except (KeyError, ValueError):
        return None


def _set_aside(job_dir: Path, old: dict, weights: dict) -> None:
    """A kept record that no longer stands (`identity.record_stands`) is renamed (`identity.aside_name`), never
    overwritten, and the cell runs again."""
    aside = job_dir / aside_name(old)
    if rows_path(job_dir / RESULT).exists():  # its sidecar first: the record links to it by name
        rows_path(job_dir / RESULT).rename(rows_path(aside))
    (job_dir / RESULT).rename(aside)
    was = weights_tag((old.get("env") or {}).get("tiny") or {})
    print(
        f"{job_dir.name}: the kept record was made with other embedded-default weights ({was}, now "
        f"{weights_tag(weights)}); kept as {aside.name}, running again"
    )


def join_group(d: dict, device: torch.device, ranks: int) -> None:
    """Join the job's process group (collectives time out after `dist_timeout_s`); the environment's world must be
    the job's `ranks`."""
    if env_world() != ranks:
        raise ValueError(f"ranks={ranks}, but this job was started with {env_world()} processes (tasks)")
    init_group(float(d.get("dist_timeout_s") or 600), device.type)


def leave_group() -> None:
    import torch.distributed as dist

    if dist.is_initialized():
        dist.destroy_process_group()


def _run_spawned(job: Job, job_dir: Path, ranks: int, body: Body, made: Callable[[dict], bool] | None) -> dict:
    """`ranks` local processes run the job (rank 0 writes its record); validation first, before any of them
    starts. A rank that fails stops the others, and the job's record says why."""
    t0 = time.perf_counter()
    record = {**record_head(job), "status": "failed", "env": {"ranks": ranks}}
    try:
        job.validate()
    except Exception as e:  # noqa: BLE001 - one clear line, and no process started
        record["error"] = f"{type(e).__name__}: {e}"
    else:
        error = spawn_ranks(job.config, job_dir, ranks, run_job, body, made)
        if error is None:
            written = read_record(job_dir / RESULT)
            if written is not None and written.get("started", "") >= record["started"]:
                return written
            error = "rank 0 ended without writing its record"
        record["error"] = f"a rank failed: {error}"
    record["finished"] = now()
    record["wall_s"] = time.perf_counter() - t0
    write_record(job_dir, record)
    return record
