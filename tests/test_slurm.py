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
        sys.executable,
        "run.py",
        "-m",
        "model=tiny_random",
        "method=ar,ecospec",
        "dataset=humaneval",
        "num_prompts=1",
        "max_new_tokens=8",
        "cluster=slurm",
        f"out_dir={out}",
        "name=slurmtest",
        "logger=none",
    ]
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


def test_tensor_parallel_cell_is_one_job_with_a_task_per_rank(slurm_cluster, tmp_path):
    """model.parallel=tp ranks=2 under cluster=slurm: one job of 2 tasks (submitit sets up the process group from
    the Slurm environment), rank 0 alone writes the record, outputs equal AR. No `logger=`: cluster runs log to W&B
    by default (offline here), one run per cell, written by rank 0 alone."""
    out, env = tmp_path / "exp", {**_store_env(tmp_path), "WANDB_MODE": "offline"}
    cmd = [
        sys.executable,
        "run.py",
        "-m",
        "model=tiny_random",
        "model.parallel=tp",
        "ranks=2",
        "method=ecospec",
        "num_prompts=2",
        "max_new_tokens=8",
        "cluster=slurm",
        f"out_dir={out}",
        "name=tp",
        "progress=false",
    ]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=900, env=env)
    assert proc.returncode == 0, f"{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}\n{_job_logs(out)}"
    (path,) = sorted((out / "tp").rglob("result.json"))
    record = json.loads(path.read_text())
    assert record["status"] == "ok", record.get("error")
    assert record["env"]["ranks"] == 2 and record["env"]["slurm_job_id"]
    assert record["summary"]["matches_ar"] == 1.0
    assert len(list(path.parent.glob("wandb/offline-run-*"))) == 1, sorted(path.parent.rglob("*"))


# ------------------------------------------------------------------------------- the predictor's jobs on Slurm


def _store_env(tmp_path: Path) -> dict:
    """A fresh $ECOSPEC_CACHE (inherited by the jobs through the profile's setup lines) that still sees the
    vendored benchmark copies of the real one."""
    from ecospec.cache import cache_root

    cache = tmp_path / "cache"
    cache.mkdir()
    if (cache_root() / "data").is_dir():
        (cache / "data").symlink_to(cache_root() / "data")
    return {**os.environ, "ECOSPEC_CACHE": str(cache), "OMP_NUM_THREADS": "1"}


def _job_logs(out: Path) -> str:
    return "\n".join(f"---- {p}\n{p.read_text()[-2000:]}" for p in sorted(out.rglob(".submitit/*/*_log.err")))


def test_a_sweep_submits_the_predictor_jobs_before_the_cells_that_need_them(slurm_cluster, tmp_path):
    """The user's command shape on a cluster (`run.py -m ... method=ar,ecospec cluster=slurm`) with no predictor in
    the store: the sweep submits the model's traces and predictor jobs first and its cells after them (afterok),
    waits for the cells, and every job ends ok (`experiment.plan`)."""
    out, env = tmp_path / "exp", _store_env(tmp_path)
    cmd = [
        sys.executable,
        "run.py",
        "-m",
        "model=tiny_random",
        "method=ar,ecospec",
        "dataset=humaneval",
        "num_prompts=2",
        "max_new_tokens=8",
        "model.predictor.checkpoint=final",
        "cluster=slurm",
        f"out_dir={out}",
        "progress=false",
        "prerequisites.traces=['num_prompts=30','traces.response_tokens=6']",
        "prerequisites.predictor=['training.epochs=3','training.window=256','training.lr=1e-3']",
    ]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=900, env=env)
    assert proc.returncode == 0, f"{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}\n{_job_logs(out)}"
    submitted = {s: json.loads((out / s / "submitted.json").read_text()) for s in ("traces", "predictor")}
    assert submitted["predictor"]["after"] == submitted["traces"]["array_job_id"]
    records = {}
    for p in out.rglob("result.json"):
        r = json.loads(p.read_text())
        records.setdefault(r.get("kind"), []).append(r)
    assert all(r["status"] == "ok" for rs in records.values() for r in rs), _job_logs(out)
    (traces,), (predictor,) = records["traces"], records["predictor"]
    assert sorted(r["config"]["method"]["name"] for r in records["cell"]) == ["ar", "ecospec"]
    assert traces["finished"] <= predictor["started"]
    assert all(predictor["finished"] <= r["started"] for r in records["cell"])  # the cells ran after it


def test_traces_job_is_one_array_task_per_dataset(slurm_cluster, tmp_path):
    out, env = tmp_path / "exp", _store_env(tmp_path)
    cmd = [
        sys.executable,
        "run.py",
        "-m",
        "experiment=traces",
        "model=tiny_random",
        "dataset=humaneval,math500",
        "num_prompts=6",
        "traces.response_tokens=4",
        "cluster=slurm",
        f"out_dir={out}",
        "progress=false",
    ]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=900, env=env)
    assert proc.returncode == 0, f"{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}\n{_job_logs(out)}"
    records = [json.loads(p.read_text()) for p in sorted((out / "traces").rglob("result.json"))]
    assert [r["kind"] for r in records] == ["traces", "traces"] and all(r["status"] == "ok" for r in records)
    assert len({r["env"]["slurm_job_id"] for r in records}) == 1  # one array
    assert sorted(r["env"]["slurm_array_task_id"] for r in records) == ["0", "1"]
    for r in records:
        manifest = json.loads((Path(r["summary"]["trace_dir"]) / "manifest.json").read_text())
        assert manifest["complete"] and manifest["samples"] == 6
        assert str(tmp_path / "cache") in r["summary"]["trace_dir"]  # the jobs wrote to the launcher's store


def _manifest_samples(path: Path) -> int:
    try:
        return json.loads(path.read_text())["samples"]
    except (OSError, ValueError):
        return 0


def test_requeued_traces_task_continues_without_duplicates(slurm_cluster, tmp_path):
    out, env = tmp_path / "exp", _store_env(tmp_path)
    cmd = [
        sys.executable,
        "run.py",
        "-m",
        "experiment=traces",
        "model=tiny_random",
        "dataset=humaneval",
        "num_prompts=100",
        "traces.response_tokens=64",
        "traces.batch_size=2",
        "traces.shard_size=2",
        "cluster=slurm",
        f"out_dir={out}",
        "progress=false",
    ]
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    manifests = tmp_path / "cache" / "store"
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        found = list(manifests.rglob("manifest.json"))
        if found and 4 <= _manifest_samples(found[0]) < 50:  # requeued well before the end: the task must resume
            break
        time.sleep(0.2)
    else:
        proc.kill()
        pytest.fail("the traces task never got half-way")
    jobs = subprocess.run(["squeue", "-h", "-o", "%i", "-n", "run"], capture_output=True, text=True).stdout.split()
    assert jobs, "no running Slurm job to requeue"
    subprocess.run(["scontrol", "requeue", jobs[0]], check=True)
    before = _manifest_samples(found[0])
    stdout, _ = proc.communicate(timeout=900)
    assert proc.returncode == 0, f"{stdout[-3000:]}\n{_job_logs(out)}"
    (record,) = [json.loads(p.read_text()) for p in (out / "traces").rglob("result.json")]
    assert record["status"] == "ok" and record["summary"]["resumed_samples"] >= before >= 4
    from ecospec.data import load_prompts
    from ecospec.predictor.trace_files import load_traces

    assert load_traces(found[0].parent).ids == [p.id for p in load_prompts("humaneval", 100)]  # once each, in order


def test_make_paper_chains_the_stages_with_slurm_dependencies(slurm_cluster, tmp_path):
    out, rep, env = tmp_path / "exp", tmp_path / "reports", _store_env(tmp_path)
    args = (
        f"--temperatures 0.0 --out-dir {out} --reports {rep} --set progress=false "
        "--traces-set num_prompts=30 traces.response_tokens=6 "
        "--predictor-set training.epochs=3 training.window=256 training.lr=1e-3 "
        "--table-set num_prompts=2 max_new_tokens=8 model.predictor.checkpoint=final"
    )
    t0 = time.monotonic()
    proc = subprocess.run(
        [
            "make",
            "-s",
            "paper",
            "MODEL=tiny_random",
            "CLUSTER=slurm",
            "DATASETS=humaneval",
            f"PYTHON={sys.executable}",
            f"ARGS={args}",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
    )
    assert proc.returncode == 0, f"{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    submitted = {s: json.loads((out / s / "submitted.json").read_text()) for s in ("traces", "predictor", "table1")}
    assert submitted["predictor"]["after"] == submitted["traces"]["array_job_id"]
    assert submitted["table1"]["after"] == submitted["predictor"]["array_job_id"]
    assert "tables -> Slurm job" in proc.stdout
    while not (rep / "README.md").exists():  # written by the last job, after the grid
        if time.monotonic() - t0 > 900:
            pytest.fail(f"make tables never ran\n{proc.stdout[-2000:]}\n{_job_logs(out)}")
        time.sleep(1)
    records = {}
    for p in out.rglob("result.json"):
        r = json.loads(p.read_text())
        records.setdefault(r.get("kind"), []).append(r)
    assert all(r["status"] == "ok" for rs in records.values() for r in rs), _job_logs(out)
    (traces,), (predictor,) = records["traces"], records["predictor"]
    assert {r["config"]["method"]["name"] for r in records["cell"]} == {"baseline", "ecospec"}
    assert traces["finished"] <= predictor["started"]  # afterok, not just submitted in order
    assert all(predictor["finished"] <= r["started"] for r in records["cell"])
