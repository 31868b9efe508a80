"""Run one cell of the grid, or a sweep with -m (Hydra 1.3; configs in the package: ecospec.conf_dir()).

On a laptop (CPU, tiny models, no network):

    python run.py                                   # one cell: tiny model, EcoSpec, HumanEval
    python run.py experiment=demo                   # make demo: EcoSpec, its baseline and AR, a table and a figure
    python run.py -m experiment=tiny_repro          # the EcoSpec paper's tables on the tiny model
    python run.py -m model=tiny_random method=ar,ecospec cluster=slurm   # the one-node CPU Slurm of the tests

On a Slurm GPU cluster (real checkpoints by HF id; set your site's partition and account: slurm/README.md):

    python run.py -m experiment=table1 model=qwen3,gptoss method=eagle3,ecospec cluster=slurm_gpu dry_run=true
    python run.py -m experiment=table1 model=qwen3,gptoss method=eagle3,ecospec cluster=slurm_gpu
    # Table 1's cells for those models and methods; where a predictor is missing, its traces and predictor jobs
    # are submitted first and the cells wait for them; dry_run=true prints every job and submits nothing

Each cell writes ${out_dir}/${name}/<cell>/result.json (see ecospec.experiment.records); reruns skip cells
whose ok record exists (force=true recomputes).
"""

from __future__ import annotations

import sys

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig

from ecospec import conf_dir
from ecospec.experiment.dispatch import run_any
from ecospec.experiment.kinds import one_line


@hydra.main(config_path=str(conf_dir()), config_name="config", version_base="1.3")
def main(cfg: DictConfig) -> str:
    if cfg.get("dry_run"):  # one cell: what it would run (a sweep's plan is printed by its sweeper)
        from ecospec.experiment.plan import CELLS, Job, describe

        print(describe([Job("cell", CELLS, "", (tuple(HydraConfig.get().overrides.task),), 0, None)]), flush=True)
        return "planned"
    out_dir = HydraConfig.get().runtime.output_dir
    record = run_any(cfg, out_dir)
    print(one_line(record), flush=True)
    if record["status"] == "ok" and cfg.get("demo"):  # experiment=demo: its table from the records just made or kept
        from ecospec.report.demo import write_demo  # the report package pulls in matplotlib: only for the demo

        print(write_demo(out_dir, cfg.demo.gpu), flush=True)
    if record["status"] != "ok" and HydraConfig.get().mode.name == "RUN":
        sys.exit(1)  # a single run reports failure by its exit code; a sweep goes on (see SweepTable)
    return record["status"]


if __name__ == "__main__":
    main()
