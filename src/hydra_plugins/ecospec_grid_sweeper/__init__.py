"""Hydra sweeper over a union of grids (`hydra.sweeper.grids`, a list of {key: "v1,v2"} mappings, each expanded
as Hydra's basic sweeper expands `params`, a cartesian product; `params` counts as one more grid), which checks
every job before launching any. conf/config.yaml makes it the sweeper of every multirun.

Why a union: one preset (e.g. `experiment=tiny_repro`) reproduces several tables whose cells are different
products; the basic sweeper can only express one. Command-line sweeps and overrides apply to every grid; a cell
(same overrides) listed by two grids runs once.

Why checking first: a job whose config cannot run (a bad value, a missing predictor) gets its `failed` record
written here, in this process, and is never launched, so no Slurm job (or process group) starts for it; the
other jobs run. A sweep submitted to run after other Slurm jobs (`after=<job id>`) does not require what those
make (the predictor) at submission; each job checks again when it starts.

No `from __future__ import annotations` here: Hydra executes plugin modules outside sys.modules, where
dataclasses cannot resolve string annotations.
"""

import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Optional  # noqa: UP035 - OmegaConf structured configs need typing generics

from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
from hydra.core.config_store import ConfigStore
from hydra.core.override_parser.overrides_parser import OverridesParser
from omegaconf import OmegaConf

log = logging.getLogger(__name__)


@dataclass
class GridSweeperConf:
    _target_: str = "hydra_plugins.ecospec_grid_sweeper.GridSweeper"
    max_batch_size: Optional[int] = None  # noqa: UP045
    params: Optional[Dict[str, str]] = None  # noqa: UP006, UP045
    grids: List[Dict[str, str]] = field(default_factory=list)  # noqa: UP006


ConfigStore.instance().store(group="hydra/sweeper", name="ecospec_grid", node=GridSweeperConf, provider="ecospec")


class GridSweeper(BasicSweeper):
    def __init__(
        self,
        max_batch_size: Optional[int] = None,  # noqa: UP045
        grids: Optional[List[Dict[str, str]]] = None,  # noqa: UP006, UP045
        params: Optional[Dict[str, str]] = None,  # noqa: UP006, UP045
    ) -> None:
        super().__init__(max_batch_size=max_batch_size, params=None)
        self.grids = [dict(g) for g in (grids or [])] + ([dict(params)] if params else [])
        self.grids = self.grids or [{}]

    def jobs(self, arguments: List[str]) -> List[List[str]]:  # noqa: UP006
        """Every cell's override list: each grid's product with the command line applied, duplicates dropped."""
        parser = OverridesParser.create(config_loader=self.hydra_context.config_loader if self.hydra_context else None)
        seen = set()
        out = []
        for grid in self.grids:
            params = [f"{k}={v}" for k, v in grid.items()] + list(arguments)
            for job in self.split_arguments(parser.parse_overrides(params), None)[0]:
                key = tuple(sorted(job))
                if key not in seen:
                    seen.add(key)
                    out.append(job)
        return out

    def checked(self, jobs: List[List[str]]) -> List[List[str]]:  # noqa: UP006
        """The jobs whose config can run; each other job gets its failed record now and is dropped."""
        from ecospec.experiment.config import ConfigError, validate_job
        from ecospec.experiment.dispatch import run_any

        runnable = []
        for overrides in jobs:
            cfg = self.hydra_context.config_loader.load_sweep_config(self.config, list(overrides))
            try:
                validate_job(cfg, awaiting=bool(cfg.get("after")))
            except ConfigError as err:
                job_dir = Path(str(cfg.hydra.sweep.dir)) / str(cfg.hydra.sweep.subdir)
                log.error(f"not launched: {' '.join(overrides)}: {err}")
                run_any(cfg, job_dir)  # validates again and writes the failed record; loads nothing
                continue
            runnable.append(overrides)
        return runnable

    def sweep(self, arguments: List[str]) -> Any:  # noqa: UP006
        jobs = self.jobs(arguments)
        sweep_dir = Path(self.config.hydra.sweep.dir)
        sweep_dir.mkdir(parents=True, exist_ok=True)
        OmegaConf.save(self.config, sweep_dir / "multirun.yaml")
        runnable = self.checked(jobs)
        log.info(f"{len(self.grids)} grids, {len(jobs)} distinct jobs, {len(jobs) - len(runnable)} not launched")
        self.overrides = list(self.split_overrides_to_chunks(runnable, self.max_batch_size)) if runnable else []
        returns = []
        start = 0
        while not self.is_done():
            batch = self.get_job_batch()
            results = self.launcher.launch(batch, initial_job_idx=start)
            for r in results:
                _ = r.return_value  # re-raise a job's exception, as the basic sweeper does
            start += len(batch)
            returns.append(results)
        return returns
