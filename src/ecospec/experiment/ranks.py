"""One job over several ranks (model.parallel=tp|ep), SPMD: every rank runs the same job on the same prompts with
the same seeds; the target is sharded over the ranks, drafter and predictor are replicated; rank 0 alone writes the
record, checkpoints, W&B run and logs.

Two ways in:

* ``cluster=local ranks=N``: the job's process validates the job, then starts N processes (torchrun-style:
  RANK / WORLD_SIZE / LOCAL_RANK / MASTER_ADDR / MASTER_PORT on 127.0.0.1), waits for them and reads rank 0's
  record. A rank that fails exits non-zero, the others are stopped, and the job gets a `failed` record naming
  every rank's error (`spawn_ranks`).
* under Slurm (``cluster=slurm*``: one task per GPU across nodes) or ``torchrun``: the process is already one rank
  (`in_group_env`); `run_job` joins the group the environment describes.

Every collective has a timeout (`dist_timeout_s`), so a rank that died never leaves the others waiting forever; a
rank's error goes to ``<job dir>/.rank<r>.error`` so that rank 0's record can name it.
"""

from __future__ import annotations

import os
import socket
from pathlib import Path

from ecospec.parallel import env_world

ERROR_FILE = ".rank{rank}.error"


def in_group_env() -> bool:
    """Whether this process was started as one rank of several (torchrun, or a Slurm job with several tasks)."""
    return env_world() > 1


def rank_errors(job_dir: Path) -> list[str]:
    """Errors the ranks of a job left (rank order)."""
    out = []
    for path in sorted(Path(job_dir).glob(ERROR_FILE.format(rank="*"))):
        out.append(path.read_text().strip())
    return out


def clear_rank_errors(job_dir: Path) -> None:
    for path in Path(job_dir).glob(ERROR_FILE.format(rank="*")):
        path.unlink(missing_ok=True)


def write_rank_error(job_dir: Path, rank: int, text: str) -> None:
    path = Path(job_dir) / ERROR_FILE.format(rank=rank)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"rank {rank}: {text}\n")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _rank_main(rank: int, d: dict, job_dir: str, world: int, port: int, run_job, body, made) -> None:
    """One spawned rank: the torchrun environment, then the job's body through `run_job` (which joins the group)."""
    os.environ.update(
        RANK=str(rank),
        LOCAL_RANK=str(rank),
        WORLD_SIZE=str(world),
        LOCAL_WORLD_SIZE=str(world),
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
    )
    record = run_job({**d, "progress": bool(d.get("progress", True)) and rank == 0}, job_dir, body, made)
    if record["status"] != "ok":
        raise SystemExit(1)  # the others are stopped by the spawner


def spawn_ranks(d: dict, job_dir: Path, world: int, run_job, body, made=None) -> str | None:
    """Run the job (`run_job(d, job_dir, body, made)`, all module-level functions: they are pickled) on `world` local
    processes; None when every rank finished, else the error (every rank's that left one, or how they ended)."""
    import torch.multiprocessing as mp

    clear_rank_errors(job_dir)
    port = _free_port()
    try:
        mp.start_processes(
            _rank_main,
            args=(d, str(job_dir), world, port, run_job, body, made),
            nprocs=world,
            join=True,
            start_method="spawn",
        )
    except Exception as e:  # noqa: BLE001 - a rank that failed (or was killed): the job's error
        errors = rank_errors(job_dir)
        return "; ".join(errors) if errors else f"{type(e).__name__}: {e}"
    return None
