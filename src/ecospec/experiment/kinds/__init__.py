"""The job kinds run.py runs (`job=`: cell, traces, predictor, gto, fig1a), one record each in a module of this
package: how a kind validates its config, what identifies it and names its directory, how it runs, and what its
record says in one line. A new job kind is its module here (and the job module it runs), nothing else: validation
(`config.validate_job`), naming (`config.job_name`), identity, dispatch and the sweep's table read these records."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from omegaconf import DictConfig, OmegaConf

from ecospec.identity import JOB_BLOCKS, cell_config, config_id, job_kind, resolved, store_identity
from ecospec.registry import Registry


@dataclass(frozen=True)
class JobKind:
    name: str  # the config's `job`
    validate: Callable[[dict, bool], None]  # (config, awaiting: it runs after the jobs that make its inputs)
    run: Callable[[Any, Any], dict]  # (config, job directory) -> its record
    line: Callable[[dict], str]  # what an ok record says, after its name (the sweep's table, run.py's output)
    # its own identity blocks from the resolved `identity.JOB_BLOCKS` (beside the job and its target); None: a
    # cell, identified by `identity.cell_config` whole
    blocks: Callable[[dict], dict] | None = None
    model: Callable[[Mapping], dict] = field(default=lambda model: {})  # what of its target identifies it too
    directory: Callable[[dict], str] | None = None  # its directory name from its identity; None: <kind>-<model>-<id>
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


def of(cfg: DictConfig | Mapping) -> JobKind:
    """The record of the job `cfg` names."""
    return kind(job_kind(cfg))


def job_config(cfg: DictConfig | Mapping) -> dict:
    """The keys that identify a job: a cell's `cell_config`; for the other kinds the job, its target's identity
    (the store's, its name, what the kind adds) and the kind's own blocks."""
    k = of(cfg)
    if k.blocks is None:
        return cell_config(cfg)
    d = {b: resolved(cfg.get(b)) for b in JOB_BLOCKS}  # not `hydra`
    model = {"name": d["model"].get("name"), **store_identity(d["model"]), **k.model(d["model"])}
    return {"job": k.name, "model": model, **k.blocks(d)}


def job_id(cfg: DictConfig | Mapping) -> str:
    return config_id(job_config(cfg))


def job_name(cfg: DictConfig | Mapping, identity: dict | None = None) -> str:
    """A job's directory name: its kind's (`JobKind.directory`: a cell's `config.cell_name`, traces'
    `traces-<model>-<dataset>[-part<i>of<n>]-<hash>`), else `<kind>-<model>-<hash>` (`identity`: the job's
    `job_config` when the caller already holds it)."""
    k = of(cfg)
    c = job_config(cfg) if identity is None else identity
    if k.directory is not None:
        return k.directory(c)
    return f"{k.name}-{c['model']['name']}-{config_id(c)[:6]}"


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
