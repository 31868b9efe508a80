"""A sweep's plan: every job it submits, in order, with its tasks, dependencies, GPUs and time limit, made before
anything is submitted (the grid sweeper's; `run.py -m ... dry_run=true` prints it and submits nothing).

    python run.py -m experiment=table1 model=qwen3,gptoss method=eagle3,ecospec cluster=slurm_gpu dry_run=true

On a cluster's launcher (Slurm) the plan holds, beside the cells:
- the prerequisites of a model one of whose cells needs a learned predictor that is not there yet: its traces job
  (one array task per benchmark those cells decode) and its predictor job after it, once per model; that model's
  cells run after the predictor job (a Slurm afterok dependency) and check for the predictor when they start;
- one array of cells per model, each task asking for the GPUs the model needs (`analysis.sizing`: its weights and
  KV cache on the profile's `gpu_type`, in the format that runs with `gpu_kernels`), where the profile asks for GPUs
  and the model runs in one process (model.parallel=device_map, no `ranks`); otherwise the profile's.
On a laptop (Hydra's basic launcher) the plan is its cells, one job, and a missing predictor stays the one-line
refusal of validation.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ecospec import sources
from ecospec.experiment.config import as_dict, missing_predictor
from ecospec.parallel import PARALLEL, mode_of

ROOT = Path(__file__).resolve().parents[3]  # where run.py is (an editable install of the repository)
CELLS, TRACES, PREDICTOR = "cell", "traces", "predictor"
# What the predictor job asks of a GPU profile: it trains a small backbone, one GPU and a share of the node, not the
# node a target needs.
PREDICTOR_GPUS = 1
PREDICTOR_LAUNCHER = ("hydra.launcher.cpus_per_task=16", "hydra.launcher.mem_gb=256")


@dataclass(frozen=True)
class Cluster:
    """What a plan needs of the launcher: whether it submits to Slurm, and the profile's resources."""

    slurm: bool
    gpus_per_node: int = 0
    timeout_min: int | None = None
    gpu_type: str | None = None  # the profile's GPU (analysis.sizing.GPU_MEMORY), for the cells' GPUs
    gpu_kernels: bool = True  # whether the site keeps quantized weights as stored (transformers' `kernels`)

    @classmethod
    def of(cls, cfg: Mapping[str, Any]) -> Cluster:
        """From a composed sweep config (its `hydra.launcher` node and the cluster knobs)."""
        launcher = (cfg.get("hydra") or {}).get("launcher") or {}
        slurm = "ecospec_slurm" in str(launcher.get("_target_", ""))
        return cls(
            slurm=slurm,
            gpus_per_node=int(launcher.get("gpus_per_node") or 0),
            timeout_min=launcher.get("timeout_min"),
            gpu_type=cfg.get("gpu_type"),
            gpu_kernels=bool(cfg.get("gpu_kernels", True)),
        )


@dataclass(frozen=True)
class Job:
    """One submission: an array of `tasks` (each its run.py overrides), run after the jobs named in `after`."""

    name: str
    kind: str  # cell | traces | predictor
    model: str
    tasks: tuple[tuple[str, ...], ...]
    gpus: int  # GPUs a task asks for (0: none)
    timeout_min: int | None
    after: tuple[str, ...] = ()
    command: tuple[str, ...] = field(default=())  # a prerequisite's run.py -m overrides (the cells': their tasks')

    def describe(self) -> str:
        after = f", after {' and '.join(self.after)}" if self.after else ""
        limit = "no time limit" if self.timeout_min is None else f"{self.timeout_min} min"
        head = f"{self.name}: {len(self.tasks)} task{'s' * (len(self.tasks) != 1)}, {self.gpus} GPU a task, {limit}"
        lines = [head + after]
        if self.command:
            lines.append("    python run.py -m " + " ".join(self.command))
        lines += [] if self.command else [f"    {' '.join(task)}" for task in self.tasks]
        return "\n".join(lines)


def cell_gpus(model: Mapping[str, Any], cluster: Cluster) -> int:
    """The GPUs a cell of `model` asks for: the profile's, or where the profile asks for GPUs of a known type and
    the model runs in one process from its facts, what `analysis.sizing` says its weights and KV cache need."""
    if not cluster.gpus_per_node or not cluster.gpu_type or not sources.real(model):
        return cluster.gpus_per_node
    if mode_of(model) != PARALLEL[0] or not (model.get("facts") or {}).get("hf_config"):
        return cluster.gpus_per_node
    from ecospec.analysis.sizing import size_model

    sized = size_model(dict(model), cluster.gpu_type, kernels=cluster.gpu_kernels)
    return min(sized.gpus, cluster.gpus_per_node) if sized.parallel == "device_map" else cluster.gpus_per_node


def plan(
    cells: list[tuple[list[str], Mapping[str, Any]]],
    cluster: Cluster,
    common: list[str],
    prerequisites: Mapping[str, list[str]] | None = None,
) -> list[Job]:
    """The jobs of a sweep whose cells are `cells` ((overrides, composed config) each), in submission order.
    `common`: the command line's overrides that every prerequisite takes too (cluster, out_dir, the launcher's);
    `prerequisites`: more overrides for the traces and the predictor jobs (the config's `prerequisites`)."""
    extra = {kind: list((prerequisites or {}).get(kind) or []) for kind in (TRACES, PREDICTOR)}
    if not cluster.slurm:
        tasks = tuple(tuple(o) for o, _ in cells)
        return [Job("cells", CELLS, "", tasks, cluster.gpus_per_node, cluster.timeout_min)] if tasks else []
    by_model: dict[str, list[tuple[list[str], dict]]] = {}
    for overrides, cfg in cells:
        d = as_dict(cfg)
        by_model.setdefault(d["model"]["name"], []).append((overrides, d))
    jobs = []
    for name, group in by_model.items():
        model = group[0][1]["model"]
        gpus = cell_gpus(model, cluster)
        after: tuple[str, ...] = ()
        needing = [d for _, d in group if d.get("job", CELLS) == CELLS and missing_predictor(d)]
        if needing:
            datasets = sorted({d["dataset"]["name"] for d in needing})
            traces = Job(
                f"traces {name}",
                TRACES,
                name,
                tuple((f"dataset={ds}",) for ds in datasets),
                gpus,
                cluster.timeout_min,
                command=("experiment=traces", f"model={name}", f"dataset={','.join(datasets)}", *common)
                + tuple(extra[TRACES]),
            )
            predictor = Job(
                f"predictor {name}",
                PREDICTOR,
                name,
                ((f"training.datasets=[{','.join(datasets)}]",),),
                PREDICTOR_GPUS if cluster.gpus_per_node else 0,
                cluster.timeout_min,
                after=(traces.name,),
                command=(
                    "experiment=predictor",
                    f"model={name}",
                    f"training.datasets=[{','.join(datasets)}]",
                    *common,
                    *(PREDICTOR_LAUNCHER if cluster.gpus_per_node else ()),
                    *extra[PREDICTOR],
                ),
            )
            jobs += [traces, predictor]
            after = (predictor.name,)
        tasks = tuple(tuple(o) for o, _ in group)
        kind = group[0][1].get("job", CELLS)  # a traces or predictor sweep plans its own tasks alone
        label = "cells" if kind == CELLS else kind
        jobs.append(Job(f"{label} {name}", kind, name, tasks, gpus, cluster.timeout_min, after))
    return jobs


def describe(jobs: list[Job]) -> str:
    """The plan as `dry_run=true` prints it: each job, its dependencies, GPUs and time limit, and its tasks."""
    n = sum(len(j.tasks) for j in jobs)
    head = f"{len(jobs)} job{'s' * (len(jobs) != 1)}, {n} task{'s' * (n != 1)}, nothing submitted (dry_run=true):"
    return "\n".join([head] + [j.describe() for j in jobs])


def submit_sweep(overrides: list[str], sweep_dir: Path, capture: bool = True):
    """Run `python run.py -m <overrides> hydra.launcher.wait=false`, which submits its Slurm arrays and returns, and
    return (the finished process, the arrays' ids from the `submitted.json` it wrote in `sweep_dir`, None where
    nothing was submitted). `capture`: keep its output (else it goes to this process's)."""
    submitted = Path(sweep_dir) / "submitted.json"
    submitted.unlink(missing_ok=True)
    cmd = [sys.executable, str(ROOT / "run.py"), "-m", *overrides, "hydra.launcher.wait=false"]
    done = subprocess.run(cmd, capture_output=capture, text=True)
    ok = not done.returncode and submitted.exists()
    return done, json.loads(submitted.read_text())["array_job_id"] if ok else None
