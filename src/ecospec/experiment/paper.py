"""`make paper MODEL=qwen3`: from nothing to the paper's Table 1 for one model, then its tables.

On Slurm (`--cluster slurm|slurm_gpu|<site>`) it is one sweep and one job:

    python run.py -m experiment=table1 model=M cluster=C hydra.launcher.wait=false   (traces -> predictor -> cells)
    python -m ecospec.report --records <out_dir> --out <reports>                    (a job after the cells: afterany)

The sweep plans what a missing predictor needs (`experiment.plan`): the model's traces array (one task per
benchmark), its predictor job after it (afterok) and the Table 1 cells after the predictor, all submitted at once;
the tables job runs when the cells have ended, however they went. The command returns once everything is queued.
`--dry-run` prints the sweep's plan (its `dry_run=true`) and submits nothing.

With `--cluster local` the stages run here one after another and stop at the first that fails (a laptop's sweep
refuses a missing predictor instead of planning it):

    1. traces     python run.py -m experiment=traces model=M dataset=<the seven>        (one job per dataset)
    2. predictor  python run.py -m experiment=predictor model=M
    3. table1     python run.py -m experiment=table1 model=M                             (baseline vs EcoSpec cells)
    4. tables     python -m ecospec.report --records <out_dir> --out <reports>           (make tables)

Work whose results exist is skipped by the jobs themselves (ok records, finished traces, published predictors), so
running the command again continues where it stopped.

    python -m ecospec.experiment.paper --model qwen3 [--cluster slurm_gpu] [--datasets gsm8k,humaneval]
        [--temperatures 0.0] [--out-dir experiments] [--reports reports] [--set KEY=VALUE ...]
        [--traces-set ...] [--predictor-set ...] [--table-set ...] [--dry-run]
"""

from __future__ import annotations

import argparse
import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from ecospec.data import DATASETS
from ecospec.experiment.plan import ROOT, submit_sweep


@dataclass
class Stage:
    name: str  # the sweep name (the experiment preset's `name`): records go to <out_dir>/<name>/
    args: list[str]  # run.py -m overrides


def stages(a: argparse.Namespace) -> list[Stage]:
    """The three run.py stages of a model with the command line's choices applied (`--cluster local`)."""
    datasets = ",".join(a.datasets)
    common = [f"model={a.model}", f"cluster={a.cluster}", f"out_dir={a.out_dir}", *a.set]
    return [
        Stage("traces", ["experiment=traces", f"dataset={datasets}", *common, *a.traces_set]),
        Stage("predictor", ["experiment=predictor", f"training.datasets=[{datasets}]", *common, *a.predictor_set]),
        table_stage(a),
    ]


def table_stage(a: argparse.Namespace) -> Stage:
    """The Table 1 sweep; on Slurm it carries the traces' and the predictor's overrides for the jobs it plans."""
    planned = [
        f"prerequisites.{kind}=[{','.join(repr(o) for o in extra)}]"
        for kind, extra in (("traces", a.traces_set), ("predictor", a.predictor_set))
        if extra and a.cluster != "local"
    ]
    args = [
        "experiment=table1",
        f"model={a.model}",
        f"dataset={','.join(a.datasets)}",
        f"temperature={','.join(a.temperatures)}",
        f"cluster={a.cluster}",
        f"out_dir={a.out_dir}",
        *a.set,
        *a.table_set,
        *planned,
    ]
    return Stage("table1", args)


def _sweep_name(stage: Stage) -> str:
    """The sweep directory's name: the preset's, unless the overrides set `name=`."""
    names = [x.split("=", 1)[1] for x in stage.args if x.startswith("name=")]
    return names[-1] if names else stage.name


def _run(cmd: list[str], dry: bool) -> int:
    print("+ " + shlex.join(cmd), flush=True)
    return 0 if dry else subprocess.run(cmd).returncode


def run_local(a: argparse.Namespace) -> int:
    for stage in stages(a):
        rc = _run([sys.executable, str(ROOT / "run.py"), "-m", *stage.args], a.dry_run)
        if rc:
            print(
                f"make paper: stage {stage.name} failed (exit {rc}); fix it and run the same command again "
                "(finished jobs are skipped)",
                file=sys.stderr,
            )
            return rc
    return _run([sys.executable, "-m", "ecospec.report", "--records", a.out_dir, "--out", a.reports], a.dry_run)


def submit_tables(a: argparse.Namespace, after: str) -> str:
    """A one-CPU Slurm job that runs `make tables` once the grid has ended (afterany), in this directory."""
    import submitit

    folder = Path(a.out_dir) / "paper" / ".submitit" / "%j"
    ex = submitit.AutoExecutor(folder=folder, cluster="slurm")
    ex.update_parameters(
        timeout_min=60,
        cpus_per_task=2,
        mem_gb=8,
        name=f"tables-{a.model}",
        slurm_additional_parameters={"dependency": f"afterany:{after}"},
        **({"slurm_partition": a.partition} if a.partition else {}),
    )
    report = [sys.executable, "-m", "ecospec.report", "--records", a.out_dir, "--out", a.reports]
    job = ex.submit(subprocess.run, report, check=True, cwd=str(Path.cwd()))
    return job.job_id


def run_slurm(a: argparse.Namespace) -> int:
    stage = table_stage(a)
    if a.dry_run:
        rc = _run([sys.executable, str(ROOT / "run.py"), "-m", *stage.args, "dry_run=true"], False)
        print(f"+ (a Slurm job after the cells) python -m ecospec.report --records {a.out_dir} --out {a.reports}")
        return rc
    shown = [sys.executable, str(ROOT / "run.py"), "-m", *stage.args, "hydra.launcher.wait=false"]
    print("+ " + shlex.join(shown), flush=True)
    done, after = submit_sweep(stage.args, Path(a.out_dir) / _sweep_name(stage), capture=False)
    if after is None:
        print(f"make paper: the Table 1 sweep was not submitted (exit {done.returncode})", file=sys.stderr)
        return done.returncode or 1
    print(f"make paper: table1 -> Slurm job array {after}", flush=True)
    tables = submit_tables(a, after)
    print(f"make paper: tables -> Slurm job {tables} (writes {a.reports}/ when the grid has ended)", flush=True)
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m ecospec.experiment.paper", description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", required=True, help="a conf/model name, e.g. qwen3, gptoss, deepseek")
    ap.add_argument("--cluster", default="slurm_gpu", help="a conf/cluster profile: local, slurm, slurm_gpu, ...")
    ap.add_argument("--datasets", default=",".join(DATASETS), help="comma-separated; default: the seven")
    ap.add_argument("--temperatures", default="0.0,1.0", help="Table 1's temperatures; default 0.0,1.0")
    ap.add_argument("--out-dir", default="experiments", help="run.py's out_dir for every stage")
    ap.add_argument("--reports", default="reports", help="where make tables writes")
    ap.add_argument("--partition", default=None, help="Slurm partition of the tables job (default: the site's)")
    for flag, what in (
        ("--set", "every stage"),
        ("--traces-set", "the traces stage"),
        ("--predictor-set", "the predictor stage"),
        ("--table-set", "the Table 1 stage"),
    ):
        ap.add_argument(flag, nargs="*", default=[], metavar="KEY=VALUE", help=f"run.py overrides for {what}")
    ap.add_argument("--dry-run", action="store_true", help="print the commands, run nothing")
    a = ap.parse_args(argv)
    a.datasets = [d for d in a.datasets.split(",") if d]
    unknown = [d for d in a.datasets if d not in DATASETS]
    if unknown or not a.datasets:
        ap.error(f"--datasets {','.join(unknown) or '(none)'}: choose from {', '.join(DATASETS)}")
    a.temperatures = [t for t in a.temperatures.split(",") if t]
    return run_local(a) if a.cluster == "local" else run_slurm(a)


if __name__ == "__main__":
    sys.exit(main())
