"""A sweep's plan (`experiment.plan`), printed by `run.py -m ... dry_run=true` without submitting anything: the
paper's protocol by name on two models, the traces and predictor jobs a missing predictor needs before the cells
that need it, and each model's cells on the GPUs its facts need."""

import os
import re
import subprocess
import sys
from pathlib import Path

from ecospec.experiment.plan import Cluster, cell_gpus

ROOT = Path(__file__).resolve().parents[1]
# a job's head line: its name, tasks, GPUs a task, time limit and the jobs it waits for
HEAD = re.compile(r"^(\w+(?: \w+)?): (\d+) tasks?, (\d+) GPU a task, (\d+ min|no time limit)(?:, after (.+))?$")


def _dry_run(tmp_path: Path, *overrides: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "ECOSPEC_CACHE": str(tmp_path / "cache")}  # an empty store: no predictor is there yet
    cmd = [sys.executable, str(ROOT / "run.py"), "-m", *overrides, f"out_dir={tmp_path / 'exp'}", "dry_run=true"]
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    return done


def _jobs(out: str) -> dict[str, dict]:
    """Each planned job's head line parsed: tasks, GPUs a task, the jobs it waits for; and its task lines."""
    jobs, current = {}, None
    for line in out.splitlines():
        head = HEAD.match(line)
        if head:
            name, tasks, gpus, _, after = head.groups()
            current = jobs[name] = {"tasks": int(tasks), "gpus": int(gpus), "after": after, "lines": []}
        elif line.startswith("    ") and current is not None:
            current["lines"].append(line.strip())
    return jobs


def test_the_users_command_plans_table1_with_its_predictors_and_gpus(tmp_path):
    args = ("experiment=table1", "model=qwen3,gptoss", "method=eagle3,ecospec", "cluster=slurm_gpu")
    out = _dry_run(tmp_path, *args).stdout
    assert "nothing submitted (dry_run=true)" in out
    jobs = _jobs(out)
    order = list(jobs)
    assert order == [
        "traces qwen3",
        "predictor qwen3",
        "cells qwen3",
        "traces gptoss",
        "predictor gptoss",
        "cells gptoss",
    ], order
    for model in ("qwen3", "gptoss"):
        cells = jobs[f"cells {model}"]
        # Table 1's grid: the user's methods, the preset's seven benchmarks and two temperatures
        assert cells["tasks"] == 2 * 7 * 2 == len(cells["lines"])
        assert {re.search(r"method=(\w+)", t).group(1) for t in cells["lines"]} == {"eagle3", "ecospec"}
        assert all("experiment=table1" in t for t in cells["lines"])
        assert cells["after"] == f"predictor {model}" and jobs[f"predictor {model}"]["after"] == f"traces {model}"
        assert jobs[f"traces {model}"]["tasks"] == 7 and jobs[f"predictor {model}"]["gpus"] == 1
        assert f"experiment=predictor model={model}" in jobs[f"predictor {model}"]["lines"][0]
    assert jobs["cells gptoss"]["gpus"] == 1 < jobs["cells qwen3"]["gpus"] == 8  # MXFP4 with kernels: one H100
    assert not (tmp_path / "exp").exists() or not any((tmp_path / "exp").rglob("*.json"))  # nothing written


def test_a_laptop_plans_its_cells_and_still_refuses_a_missing_predictor(tmp_path):
    """Hydra's basic launcher: one job of cells, no traces or predictor jobs; a cell whose predictor is missing is
    not launched, with validation's one line naming the command that makes it."""
    done = _dry_run(tmp_path, "model=tiny_random", "method=ar,ecospec", "model.predictor.checkpoint=final")
    jobs = _jobs(done.stdout)
    assert list(jobs) == ["cells"] and jobs["cells"]["tasks"] == 1 and "method=ar" in jobs["cells"]["lines"][0]
    said = done.stdout + done.stderr
    assert "not launched" in said and "make it with: python run.py -m experiment=traces" in said
    assert not (tmp_path / "exp").exists() or not any((tmp_path / "exp").rglob("*.json"))  # no failed record either


def test_gpus_come_from_the_model_facts_only_where_the_profile_asks_for_gpus():
    from ecospec.analysis.model_config import load_model_config

    gpu = Cluster(slurm=True, gpus_per_node=8, gpu_type="H100")
    assert cell_gpus(load_model_config("gptoss"), gpu) == 1
    assert cell_gpus(load_model_config("gptoss"), Cluster(True, 8, gpu_type="H100", gpu_kernels=False)) == 4
    assert cell_gpus(load_model_config("qwen3"), gpu) == 8
    assert cell_gpus(load_model_config("gptoss"), Cluster(slurm=True, gpus_per_node=8)) == 8  # no GPU type: profile
    assert cell_gpus(load_model_config("gptoss"), Cluster(slurm=True)) == 0  # a CPU profile asks for none


def test_a_traces_sweep_plans_no_prerequisites_of_its_own(tmp_path):
    """The jobs a plan submits before cells are sweeps themselves: theirs plan only their own tasks."""
    out = _dry_run(
        tmp_path,
        "experiment=traces",
        "model=tiny_random",
        "dataset=humaneval,math500",
        "model.predictor.checkpoint=final",
        "cluster=slurm",
    ).stdout
    jobs = _jobs(out)
    assert list(jobs) == ["traces tiny_random"] and jobs["traces tiny_random"]["tasks"] == 2, out
