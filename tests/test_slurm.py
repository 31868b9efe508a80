"""Dispatch to a real Slurm: the one-node cluster of slurm/local-cluster.sh (`make test-slurm`, needs root).

The module brings the cluster up if it is not running and takes it down again at the end.
"""

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import cloudpickle
import pytest
import submitit

pytestmark = pytest.mark.slurm

ROOT = Path(__file__).resolve().parents[1]
CLUSTER = ROOT / "slurm" / "local-cluster.sh"


@pytest.fixture(scope="module")
def slurm_cluster():
    running = subprocess.run([CLUSTER, "status"], capture_output=True).returncode == 0
    if not running:
        up = subprocess.run([CLUSTER, "up"], capture_output=True, text=True, timeout=900)
        assert up.returncode == 0, f"slurm/local-cluster.sh up failed:\n{up.stdout[-3000:]}\n{up.stderr[-3000:]}"
    yield
    if not running:
        subprocess.run([CLUSTER, "down"], check=True, timeout=300)


def _job_facts(_task: int) -> dict:
    """What a job of the array sees: its Slurm ids, its python, its working directory."""
    return {
        "job_id": os.environ.get("SLURM_JOB_ID"),
        "array_task": os.environ.get("SLURM_ARRAY_TASK_ID"),
        "python": sys.executable,
        "cwd": os.getcwd(),
    }


def _results(jobs: list, timeout_s: float) -> list:
    """Each job's result; cancels the jobs and fails after `timeout_s` (without accounting, submitit cannot
    tell a job that died without a result from one still running)."""
    deadline = time.monotonic() + timeout_s
    while not all(job.done() for job in jobs):
        if time.monotonic() > deadline:
            for job in jobs:
                job.cancel(check=False)
            pytest.fail(f"Slurm jobs {[job.job_id for job in jobs]} not done after {timeout_s:.0f}s")
        time.sleep(0.5)
    return [job.result() for job in jobs]


def test_submitit_array_runs_under_slurm(slurm_cluster, tmp_path):
    executor = submitit.AutoExecutor(folder=tmp_path / "%j", cluster="slurm")
    executor.update_parameters(slurm_partition="debug", timeout_min=5, cpus_per_task=1, mem_gb=1)
    cloudpickle.register_pickle_by_value(sys.modules[__name__])  # the job cannot import this test module
    try:
        jobs = executor.map_array(_job_facts, [0, 1])
    finally:
        cloudpickle.unregister_pickle_by_value(sys.modules[__name__])
    facts = _results(jobs, timeout_s=180)
    assert [f["array_task"] for f in facts] == ["0", "1"]
    for f in facts:
        assert f["job_id"], "the function did not run inside a Slurm job"
        assert f["python"] == sys.executable
        assert f["cwd"] == os.getcwd()  # sbatch starts the job where it was submitted


def test_run_py_sweep_on_slurm(slurm_cluster, tmp_path):
    out = tmp_path / "exp"
    cmd = [
        sys.executable, "run.py", "-m", "model=tiny_random", "method=ar,ecospec", "dataset=humaneval",
        "num_prompts=1", "max_new_tokens=8", "cluster=slurm", f"out_dir={out}", "name=slurmtest", "logger=none",
    ]  # fmt: skip
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=900)
    job_logs = "\n".join(f"---- {p}\n{p.read_text()[-2000:]}" for p in sorted(out.rglob(".submitit/*/*_log.err")))
    assert proc.returncode == 0, f"{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}\n{job_logs}"

    paths = sorted((out / "slurmtest").rglob("result.json"))
    assert len(paths) == 2 and paths[0].parent != paths[1].parent, paths
    records = [json.loads(p.read_text()) for p in paths]
    for record in records:
        assert record["status"] == "ok", record.get("error")
        assert record["env"]["slurm_job_id"]
        assert record["summary"]["tokens"] > 0
    assert sorted(r["config"]["method"]["name"] for r in records) == ["ar", "ecospec"]
