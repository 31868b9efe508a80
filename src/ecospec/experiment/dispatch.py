"""run.py's one entry: the job a config names, on the engine it names. Only this module knows every job kind, so the
job modules import `job.run_job` and nothing imports them back (no import circle)."""

from __future__ import annotations

from pathlib import Path

from ecospec.experiment.config import job_kind


def run_any(cfg, job_dir: str | Path) -> dict:
    """The job the config names (`job`: cell, traces, predictor, gto or fig1a); a cell on `backend` hf or vllm."""
    kind = job_kind(cfg)
    if kind == "traces":
        from ecospec.experiment.traces_job import run_traces

        return run_traces(cfg, job_dir)
    if kind == "predictor":
        from ecospec.experiment.predictor_job import run_predictor

        return run_predictor(cfg, job_dir)
    if kind == "gto":
        from ecospec.experiment.gto_job import run_gto

        return run_gto(cfg, job_dir)
    if kind == "fig1a":
        from ecospec.experiment.fig1a_job import run_fig1a

        return run_fig1a(cfg, job_dir)
    if ((cfg.get("backend") or {}).get("name") or "hf") == "vllm":
        from ecospec.experiment.vllm_cell import run_vllm_cell

        return run_vllm_cell(cfg, job_dir)
    from ecospec.experiment.cell import run_cell

    return run_cell(cfg, job_dir)
