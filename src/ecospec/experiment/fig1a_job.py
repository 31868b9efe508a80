"""`experiment=fig1a` (run.py): the verify-latency benchmark (`ecospec.bench.verify_latency`) as a job with its own
record (skipped when done, a failure recorded); the points go to `fig1a.out` (null: ${out_dir}/fig1a)."""

from __future__ import annotations

from pathlib import Path

import torch

from ecospec.bench import SETTINGS
from ecospec.bench.verify_latency import run
from ecospec.experiment.job import run_job


def _fig1a(d: dict, job_dir: Path, device: torch.device, record: dict) -> None:
    s = d["fig1a"]
    out = Path(s.get("out") or Path(d.get("out_dir") or "experiments") / "fig1a")
    recs = run(d["model"], device=device, out=out, **{k: s.get(k) for k in SETTINGS if s.get(k) is not None})
    record["summary"] = {"points": len(recs), "out": str(out), "impls": sorted({r["impl"] for r in recs})}


def run_fig1a(cfg, job_dir: str | Path) -> dict:
    return run_job(cfg, job_dir, _fig1a)
