"""Hydra sweeper over a union of grids: `hydra/sweeper=ecospec_grid` with `hydra.sweeper.grids`, a list of
{key: "v1,v2"} mappings, each expanded as Hydra's basic sweeper expands `params` (a cartesian product).

Why: one preset (e.g. `experiment=tiny_repro`) reproduces several tables whose cells are different
products; the basic sweeper can only express one. Command-line sweeps and overrides apply to every
grid; a cell (same overrides) listed by two grids runs once.

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
    grids: List[Dict[str, str]] = field(default_factory=list)  # noqa: UP006


ConfigStore.instance().store(group="hydra/sweeper", name="ecospec_grid", node=GridSweeperConf, provider="ecospec")


class GridSweeper(BasicSweeper):
    def __init__(self, max_batch_size: int | None = None, grids: list[dict[str, str]] | None = None) -> None:
        super().__init__(max_batch_size=max_batch_size, params=None)
        self.grids = [dict(g) for g in (grids or [{}])]

    def jobs(self, arguments: list[str]) -> list[list[str]]:
        """Every cell's override list: each grid's product with the command line applied, duplicates dropped."""
        parser = OverridesParser.create(config_loader=self.hydra_context.config_loader if self.hydra_context else None)
        seen: set[tuple[str, ...]] = set()
        out: list[list[str]] = []
        for grid in self.grids:
            params = [f"{k}={v}" for k, v in grid.items()] + list(arguments)
            for job in self.split_arguments(parser.parse_overrides(params), None)[0]:
                key = tuple(sorted(job))
                if key not in seen:
                    seen.add(key)
                    out.append(job)
        return out

    def sweep(self, arguments: list[str]) -> Any:
        jobs = self.jobs(arguments)
        log.info(f"{len(self.grids)} grids, {len(jobs)} distinct cells")
        sweep_dir = Path(self.config.hydra.sweep.dir)
        sweep_dir.mkdir(parents=True, exist_ok=True)
        OmegaConf.save(self.config, sweep_dir / "multirun.yaml")
        self.overrides = list(self.split_overrides_to_chunks(jobs, self.max_batch_size))
        returns = []
        start = 0
        while not self.is_done():
            batch = self.get_job_batch()
            self.validate_batch_is_legal(batch)
            results = self.launcher.launch(batch, initial_job_idx=start)
            for r in results:
                _ = r.return_value  # re-raise a job's exception, as the basic sweeper does
            start += len(batch)
            returns.append(results)
        return returns
