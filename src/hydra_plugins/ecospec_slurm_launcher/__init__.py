"""Hydra launcher `ecospec_slurm`: hydra-submitit-launcher's Slurm launcher (one job array per sweep), plus what
chaining stages with Slurm job dependencies needs (`make paper`: traces -> predictor -> Table 1 -> tables):

- `after` (a top-level knob, not part of any cell): Slurm job ids the array waits for (`--dependency=afterok:`).
- `model.parallel=tp|ep` with `ranks=R`: one task per rank across nodes (`_rank_layout`); each task is a rank.
- `hydra.launcher.wait` (default true): wait for the array as hydra-submitit-launcher does; false submits it and
  returns at once, writing `<sweep dir>/submitted.json` ({"array_job_id", "job_ids", "jobs"}) for the next stage.

No `from __future__ import annotations` here: Hydra executes plugin modules outside sys.modules, where
dataclasses cannot resolve string annotations.
"""

import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any, List, Optional, Sequence  # noqa: UP035 - OmegaConf structured configs need typing generics

from hydra.core.config_store import ConfigStore
from hydra.core.singleton import Singleton
from hydra.core.utils import JobReturn, JobStatus, filter_overrides
from hydra_plugins.hydra_submitit_launcher.config import BaseQueueConf, SlurmQueueConf
from hydra_plugins.hydra_submitit_launcher.submitit_launcher import SlurmLauncher
from omegaconf import OmegaConf

log = logging.getLogger(__name__)
SUBMITTED = "submitted.json"


@dataclass
class EcospecSlurmConf(SlurmQueueConf):
    _target_: str = "hydra_plugins.ecospec_slurm_launcher.EcospecSlurmLauncher"
    wait: bool = True


ConfigStore.instance().store(group="hydra/launcher", name="ecospec_slurm", node=EcospecSlurmConf, provider="ecospec")


def _rank_layout(config, p: dict) -> dict:
    from ecospec.parallel import rank_layout_problem

    """A tensor/expert-parallel sweep (model.parallel=tp|ep, `ranks`=R): one Slurm task per rank, one per GPU,
    so R = nodes x tasks per node (tasks per node = the node's GPUs; on a CPU cluster all R on one node); the node's
    CPUs are shared out over its tasks. A one-process target (device_map) keeps one task per cell."""
    if config is None:
        return {}
    mode = OmegaConf.select(config, "model.parallel") or "device_map"
    ranks = int(OmegaConf.select(config, "ranks") or OmegaConf.select(config, "model.ranks") or 1)
    if mode == "device_map" or ranks < 2:
        return {}
    gpus = int(p.get("gpus_per_node") or 0)
    per_node = gpus if gpus else ranks
    problem = rank_layout_problem(ranks, per_node)  # also checked at validation, before any job is submitted
    if problem:
        raise ValueError(problem)
    cpus = max(1, int(p.get("cpus_per_task") or 1) // per_node) if gpus else int(p.get("cpus_per_task") or 1)
    return {"nodes": ranks // per_node, "tasks_per_node": per_node, "cpus_per_task": cpus}


class EcospecSlurmLauncher(SlurmLauncher):
    def __init__(self, wait: bool = True, **params: Any) -> None:
        super().__init__(**params)
        self.wait = wait

    def _executor(self, gpus: Optional[int] = None, after: Optional[str] = None):  # noqa: UP045
        """A submitit Slurm executor with this launcher's parameters (generic ones by name, the rest slurm_*);
        `gpus` and `after` stand in for the profile's GPUs per node and the sweep's `after` (a sweep's plan)."""
        import submitit

        p = dict(self.params)
        if gpus is not None:
            p["gpus_per_node"] = gpus
        if after is None:
            after = self.config.get("after") if self.config is not None else None
        if after:
            extra = dict(p.get("additional_parameters") or {})
            extra["dependency"] = f"afterok:{after}"
            p["additional_parameters"] = extra
        p.update(_rank_layout(self.config, p))
        executor = submitit.AutoExecutor(
            folder=p.pop("submitit_folder"), cluster="slurm", slurm_max_num_timeout=p.pop("max_num_timeout", 0)
        )
        generic = set(OmegaConf.structured(BaseQueueConf).keys())
        executor.update_parameters(**{k if k in generic else f"slurm_{k}": v for k, v in p.items()})
        return executor

    def launch(self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int) -> Sequence[JobReturn]:  # noqa: UP006
        return self.finish([self.submit(job_overrides, initial_job_idx)])

    def submit(
        self,
        job_overrides: Sequence[Sequence[str]],  # noqa: UP006
        initial_job_idx: int,
        gpus: Optional[int] = None,  # noqa: UP045
        after: Optional[str] = None,  # noqa: UP045
    ) -> tuple:
        """Submit one job array (its tasks' overrides); (overrides, submitit jobs, after) for `finish`."""
        Path(str(self.config.hydra.sweep.dir)).mkdir(parents=True, exist_ok=True)
        args: List[tuple] = []  # noqa: UP006
        for i, overrides in enumerate(job_overrides):
            idx = initial_job_idx + i
            log.info(f"\t#{idx} : {' '.join(filter_overrides(overrides))}")
            args.append((list(overrides), "hydra.sweep.dir", idx, f"job_id_for_{idx}", Singleton.get_state()))
        jobs = self._executor(gpus, after).map_array(self, *zip(*args, strict=True))
        if after is None:
            after = self.config.get("after")
        return list(job_overrides), jobs, None if after is None else str(after)

    def finish(self, arrays: List[tuple]) -> List[JobReturn]:  # noqa: UP006
        """Wait for the submitted arrays' results, or (wait=false) write `submitted.json` for a later stage: the
        arrays' ids joined by ":" (a Slurm dependency list) and return at once."""
        if self.wait:
            return [job.results()[0] for _, jobs, _ in arrays for job in jobs]
        sweep_dir = Path(str(self.config.hydra.sweep.dir))
        ids = [jobs[0].job_id.split("_")[0] for _, jobs, _ in arrays]
        afters = sorted({a for _, _, a in arrays if a})
        submitted = {
            "array_job_id": ":".join(ids),
            "job_ids": [job.job_id for _, jobs, _ in arrays for job in jobs],
            "jobs": [" ".join(filter_overrides(o)) for overrides, _, _ in arrays for o in overrides],
            "after": ":".join(afters) if afters else None,
        }
        (sweep_dir / SUBMITTED).write_text(json.dumps(submitted, indent=1))
        n = sum(len(jobs) for _, jobs, _ in arrays)
        print(f"submitted Slurm job array {submitted['array_job_id']} ({n} tasks): {sweep_dir / SUBMITTED}", flush=True)
        returns = []
        for overrides, _, _ in arrays:
            for o in overrides:
                ret = JobReturn(overrides=list(o), status=JobStatus.COMPLETED)
                ret.return_value = "submitted"
                returns.append(ret)
        return returns
