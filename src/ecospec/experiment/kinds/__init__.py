"""The job kinds run.py runs (`job=`: cell, traces, predictor, gto, fig1a), one record each in a module of this
package: how a kind validates its config, what identifies it and names its directory, how it runs, and what its
record says in one line. A new job kind is its module here (and the job module it runs), nothing else.

A composed config becomes a `Job` once (`job(cfg)`): its kind, its config as plain data, what identifies it, its id
and its directory name. Validation (`Job.validate`, which turns a cell into its typed `experiment.spec.Cell`),
naming, dispatch, the job runner and the sweep's table read the `Job`, never the composed config again."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from omegaconf import DictConfig, OmegaConf

from ecospec.identity import JOB_BLOCKS, cell_config, config_id, resolved, store_identity
from ecospec.parallel import PARALLEL, job_ranks, mode_of
from ecospec.registry import Registry


@dataclass(frozen=True)
class JobKind:
    name: str  # the config's `job`
    # (job, awaiting: it runs after the jobs that make its inputs) -> what its body reads: a cell's typed `Cell`;
    # None: the resolved config (the other kinds)
    validate: Callable[[Job, bool], Any]
    run: Callable[[Job, Any], dict]  # (job, job directory) -> its record
    line: Callable[[dict], str]  # what an ok record says, after its name (the sweep's table, run.py's output)
    # its own identity blocks from the resolved `identity.JOB_BLOCKS` (beside the job and its target); None: a
    # cell, identified by `identity.cell_config` whole
    blocks: Callable[[dict], dict] | None = None
    model: Callable[[Mapping], dict] = field(default=lambda model: {})  # what of its target identifies it too
    # its directory name from its identity and id; None: <kind>-<model>-<id[:6]>
    directory: Callable[[dict, str], str] | None = None
    ranks: bool = True  # runs on the model's ranks (tensor / expert parallel); else one process
    checks_memory: bool = True  # loads the target: the memory check runs before any download
    measures: bool = False  # a measurement cell: its record keeps the model's own γ, names its weights, logs to W&B
    order: int = 50


REGISTRY = Registry(
    "job kind",
    __name__,
    lambda name, names: ValueError(f"job={name!r}: unknown job kind; allowed: {', '.join(names)}"),
)
register = REGISTRY.register
kinds = REGISTRY.all
names = REGISTRY.names
kind = REGISTRY.get


def job_kind(cfg: DictConfig | Mapping) -> str:
    """The kind a config names (`job`), a cell by default."""
    return cfg.get("job") or "cell"


@dataclass(frozen=True)
class Job:
    """A job as run.py composed it, resolved once. `config`: the config as plain data (no `hydra` node; read it, never
    write it); `identity`: what identifies it (`job_config`), `id` its hash, `name` its directory."""

    kind: str
    config: dict
    identity: dict
    id: str
    name: str

    @property
    def record(self) -> JobKind:
        return kind(self.kind)

    def validate(self, awaiting: bool = False) -> Any:
        """What the job's body reads, once its config is checked (`JobKind.validate`; ConfigError names the first
        bad value). `awaiting`: it runs after the jobs that make its inputs, so those need not exist yet."""
        out = self.record.validate(self, awaiting)
        return self.config if out is None else out

    @property
    def ranks(self) -> int:
        """Processes it runs on: `ranks` (else the model config's) under model.parallel=tp|ep, else 1."""
        model = self.config.get("model") or {}
        if not self.record.ranks or mode_of(model) == PARALLEL[0]:
            return 1
        return job_ranks(self.config.get("ranks"), model)


def plain(cfg: DictConfig | Mapping) -> dict:
    """The config as plain resolved data, without Hydra's own `hydra` node (which only resolves inside a run)."""
    if not isinstance(cfg, DictConfig):
        return {k: v for k, v in dict(cfg).items() if k != "hydra"}
    return {k: resolved(cfg[k]) for k in cfg if k != "hydra"}


def job(cfg: Job | DictConfig | Mapping) -> Job:
    """The `Job` of a composed config (a `Job` as it is). An unknown kind raises its one-line ValueError."""
    if isinstance(cfg, Job):
        return cfg
    k = kind(job_kind(cfg))
    identity = _identity(k, cfg)
    jid = config_id(identity)
    name = k.directory(identity, jid) if k.directory is not None else f"{k.name}-{identity['model']['name']}-{jid[:6]}"
    return Job(k.name, plain(cfg), identity, jid, name)


def _identity(k: JobKind, cfg: DictConfig | Mapping) -> dict:
    if k.blocks is None:
        return cell_config(cfg)
    d = {b: resolved(cfg.get(b)) for b in JOB_BLOCKS}  # not `hydra`
    model = {"name": d["model"].get("name"), **store_identity(d["model"]), **k.model(d["model"])}
    return {"job": k.name, "model": model, **k.blocks(d)}


def job_config(cfg: DictConfig | Mapping) -> dict:
    """The keys that identify a job: a cell's `cell_config`; for the other kinds the job, its target's identity
    (the store's, its name, what the kind adds) and the kind's own blocks."""
    return _identity(kind(job_kind(cfg)), cfg)


def job_id(cfg: Job | DictConfig | Mapping) -> str:
    return job(cfg).id


def job_name(cfg: Job | DictConfig | Mapping) -> str:
    """A job's directory name: its kind's (`JobKind.directory`: a cell's `config.cell_name`, traces'
    `traces-<model>-<dataset>[-part<i>of<n>]-<hash>`), else `<kind>-<model>-<hash>`."""
    return job(cfg).name


def _job_resolver(*, _root_: DictConfig) -> str:
    return job_name(_root_)


if not OmegaConf.has_resolver("ecospec_cell"):  # conf/config.yaml names each job's directory with it
    OmegaConf.register_new_resolver("ecospec_cell", _job_resolver)


def one_line(record: dict) -> str:
    """A record in one line: its name, then what its job measured or made, or its error."""
    if record["status"] != "ok":
        return f"{record['cell']}: FAILED {record.get('error', '')}"
    skipped = " (existing record)" if record.get("skipped") else ""
    return f"{record['cell']}{skipped}: {kind(record.get('kind') or 'cell').line(record)}"
