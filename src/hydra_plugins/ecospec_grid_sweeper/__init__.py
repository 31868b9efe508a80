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
    # cells of a benchmark this machine cannot load (no Hub, no cache, no offline copy): skip (said once) | fail
    missing_data: str = "fail"
    # the paper's gamma protocol: {key: gamma, by: 2, upto: 12} adds `by` more values of `key` to every grid that
    # sweeps it while the best gamma (report.gamma.choose, from this sweep's records) sits at the upper end
    extend: Optional[Dict[str, Any]] = None  # noqa: UP006, UP045


ConfigStore.instance().store(group="hydra/sweeper", name="ecospec_grid", node=GridSweeperConf, provider="ecospec")


class GridSweeper(BasicSweeper):
    def __init__(
        self,
        max_batch_size: Optional[int] = None,  # noqa: UP045
        grids: Optional[List[Dict[str, str]]] = None,  # noqa: UP006, UP045
        params: Optional[Dict[str, str]] = None,  # noqa: UP006, UP045
        missing_data: str = "fail",
        extend: Optional[Dict[str, Any]] = None,  # noqa: UP006, UP045
    ) -> None:
        super().__init__(max_batch_size=max_batch_size, params=None)
        self.grids = [dict(g) for g in (grids or [])] + ([dict(params)] if params else [])
        self.grids = self.grids or [{}]
        if missing_data not in ("fail", "skip"):
            raise ValueError(f"hydra.sweeper.missing_data={missing_data!r}: allowed: fail, skip")
        self.missing_data = missing_data
        self.extend = dict(extend) if extend else None
        self._unavailable: Dict[str, Optional[str]] = {}  # noqa: UP006, UP045 - benchmark -> why it cannot load
        self._said: set = set()

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

    def checked(self, jobs: List[List[str]]) -> List[tuple]:  # noqa: UP006
        """The jobs whose config can run, each (overrides, composed config). With `missing_data=skip` a job whose
        benchmark this machine cannot load is dropped, said once per benchmark (no record: nothing ran, and a
        machine with the data runs it later); each other job that cannot run gets its failed record now (none on a
        dry run) and is dropped. On a cluster a cell whose predictor is missing runs after the jobs that make it
        (`experiment.plan`), so it is not refused for it."""
        from ecospec.experiment.config import ConfigError, missing_predictor, validate_job
        from ecospec.experiment.dispatch import run_any
        from ecospec.experiment.plan import Cluster

        slurm = Cluster.of(self.config).slurm
        runnable, skipped = [], {}
        for overrides in jobs:
            cfg = self.hydra_context.config_loader.load_sweep_config(self.config, list(overrides))
            missing = self._missing(cfg)
            if missing:
                skipped[missing] = skipped.get(missing, 0) + 1
                continue
            try:
                planned = slurm and cfg.get("job", "cell") == "cell" and missing_predictor(cfg)
                validate_job(cfg, awaiting=bool(cfg.get("after")) or planned)
            except ConfigError as err:
                job_dir = Path(str(cfg.hydra.sweep.dir)) / str(cfg.hydra.sweep.subdir)
                log.error(f"not launched: {' '.join(overrides)}: {err}")
                if not self.config.get("dry_run"):
                    run_any(cfg, job_dir)  # validates again and writes the failed record; loads nothing
                continue
            runnable.append((list(overrides), cfg))
        for name, n in skipped.items():
            if name not in self._said:
                self._said.add(name)
                log.warning(f"{name}: not available on this machine, its cells are skipped ({self._unavailable[name]})")
            log.info(f"{name}: {n} cells skipped")
        return runnable

    def _missing(self, cfg) -> Optional[str]:  # noqa: UP045
        """The benchmark of a job that `missing_data=skip` leaves out (it cannot be loaded here), else None; each
        benchmark is tried once per sweep."""
        if self.missing_data != "skip":
            return None
        from ecospec.data import DATASETS, unavailable

        name = cfg.dataset.get("name")
        if name not in DATASETS or cfg.dataset.get("source") is not None:
            return None
        if name not in self._unavailable:
            self._unavailable[name] = unavailable(name)
        return name if self._unavailable[name] else None

    def plan(self, jobs: List[List[str]]) -> List[Any]:  # noqa: UP006
        """The sweep's plan (`experiment.plan`) of the jobs that can run."""
        from ecospec.experiment.plan import Cluster, plan

        runnable = self.checked(jobs)
        log.info(f"{len(jobs)} distinct jobs, {len(jobs) - len(runnable)} not launched")
        extra = OmegaConf.to_container(self.config.get("prerequisites") or {}, resolve=True)
        return plan(runnable, Cluster.of(self.config), self._common(), extra)

    def _common(self) -> List[str]:  # noqa: UP006
        """The command line's overrides a prerequisite job takes too: where and how to submit, not what to decode."""
        keep = ("cluster", "out_dir", "logger", "progress", "force", "gpu_type", "gpu_kernels")
        out = []
        for o in OmegaConf.select(self.config, "hydra.overrides.task", default=[]) or []:
            key = str(o).split("=", 1)[0].lstrip("+~")
            if "," not in str(o) and (key in keep or key.startswith(("hydra.launcher.", "model."))):
                out.append(str(o))
        return out

    def run_jobs(self, jobs: List[List[str]], start: int) -> List[Any]:  # noqa: UP006
        from ecospec.experiment.plan import Cluster

        planned = self.plan(jobs)
        if Cluster.of(self.config).slurm:
            return [self._submit(planned, start)] if planned else []
        runnable = [list(task) for job in planned for task in job.tasks]
        self.overrides = list(self.split_overrides_to_chunks(runnable, self.max_batch_size)) if runnable else []
        self.batch_index = 0  # the basic sweeper's cursor: a second round starts at its own first batch
        returns = []
        while not self.is_done():
            batch = self.get_job_batch()
            results = self.launcher.launch(batch, initial_job_idx=start)
            for r in results:
                _ = r.return_value  # re-raise a job's exception, as the basic sweeper does
            start += len(batch)
            returns.append(results)
        return returns

    def _submit(self, planned: List[Any], start: int) -> List[Any]:  # noqa: UP006
        """Submit a cluster's plan in order: each prerequisite (traces, predictor) as its own `run.py -m` sweep that
        returns once submitted, then each model's cells as one array after its prerequisites, asking for its GPUs;
        then wait for the cells (or, wait=false, say where they were submitted)."""
        ids: Dict[str, str] = {}  # noqa: UP006
        arrays = []
        for job in planned:
            after = ":".join(ids[a] for a in job.after) or self.config.get("after")
            after = None if after is None else str(after)
            if job.command:  # a prerequisite: its own sweep
                ids[job.name] = self._submit_prerequisite(job, after)
                continue
            tasks = [list(t) for t in job.tasks]
            arrays.append(self.launcher.submit(tasks, start, gpus=job.gpus, after=after))
            start += len(tasks)
        return self.launcher.finish(arrays)

    def _submit_prerequisite(self, job: Any, after: Optional[str]) -> str:  # noqa: UP045
        """Submit a planned traces or predictor job (`run.py -m <its command>`, returning once submitted) and return
        its Slurm array id, from the `submitted.json` its sweep writes."""
        from ecospec.experiment.plan import submit_sweep

        overrides = [*job.command, f"hydra.launcher.gpus_per_node={job.gpus}"] + ([f"after={after}"] if after else [])
        log.info(f"submitting {job.name}: run.py -m {' '.join(overrides)}")
        # the preset's sweep name is its kind
        done, array = submit_sweep(overrides, Path(str(self.config.out_dir)) / job.kind)
        if array is None:
            raise RuntimeError(f"{job.name} was not submitted (exit {done.returncode}): {done.stderr[-2000:]}")
        log.info(f"{job.name} -> Slurm job array {array}")
        return array

    def extension(self, sweep_dir: Path) -> List[Dict[str, str]]:  # noqa: UP006
        """The grids to run next under `extend`: each grid that sweeps the key, with the next values (none when
        the protocol's best sits inside the swept range, or the range reached `upto`)."""
        from ecospec.report.gamma import chosen_gammas, extend_gammas
        from ecospec.report.records import conf_defaults, load_records

        key = self.extend.get("key", "gamma")
        swept = [g for g in self.grids if key in g]
        values = sorted({int(v) for g in swept for v in str(g[key]).split(",")})
        if not values:
            return []
        recs = load_records([sweep_dir])
        chosen = chosen_gammas(recs.frame, conf_defaults(recs.model_configs))
        more = extend_gammas(values, chosen, int(self.extend.get("by", 2)), int(self.extend.get("upto", 12)))
        for model, (g, at_end) in chosen.items():
            log.info(f"gamma protocol: {model}: best {key} = {g}{' (the upper end)' if at_end else ''} of {values}")
        if more:
            log.info(f"gamma protocol: extending {key} by {more}")
        return [{**g, key: ",".join(map(str, more))} for g in swept] if more else []

    def sweep(self, arguments: List[str]) -> Any:  # noqa: UP006
        sweep_dir = Path(self.config.hydra.sweep.dir)
        sweep_dir.mkdir(parents=True, exist_ok=True)
        OmegaConf.save(self.config, sweep_dir / "multirun.yaml")
        jobs = self.jobs(arguments)
        log.info(f"{len(self.grids)} grids")
        if self.config.get("dry_run"):
            from ecospec.experiment.plan import describe

            print(describe(self.plan(jobs)), flush=True)
            return []
        returns = self.run_jobs(jobs, 0)
        while self.extend:
            grids = self.extension(sweep_dir)
            if not grids:
                break
            self.grids = self.grids + grids
            seen = {tuple(sorted(j)) for j in jobs}
            new = [j for j in self.jobs(arguments) if tuple(sorted(j)) not in seen]
            jobs += new
            returns += self.run_jobs(new, sum(len(r) for r in returns))
        return returns
