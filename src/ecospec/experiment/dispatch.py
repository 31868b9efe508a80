"""run.py's one entry: the job a config names, run by its kind's record (`experiment.kinds`), which imports its job
module when it runs; the job modules import `job.run_job` and nothing imports them back (no import circle)."""

from __future__ import annotations

from pathlib import Path

from ecospec.experiment import kinds


def run_any(cfg, job_dir: str | Path) -> dict:
    """The job the config names (`job`: a kind of `experiment.kinds`), run by its kind."""
    job = kinds.job(cfg)
    return job.record.run(job, job_dir)
