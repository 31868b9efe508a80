"""fig1a: the verify-latency benchmark (`ecospec.bench.verify_latency`), the EcoSpec paper's Figure 1(a)."""

from collections.abc import Mapping

from ecospec.bench import SETTINGS as FIG1A_KEYS
from ecospec.bench import settings_problem
from ecospec.experiment.config import ConfigError, validate_model
from ecospec.experiment.kinds import JobKind, register


def run(cfg, job_dir):
    from ecospec.experiment.fig1a_job import run_fig1a

    return run_fig1a(cfg, job_dir)


def line(record: dict) -> str:
    s = record["summary"]
    impls = ", ".join(s["impls"])
    return f"{s['points']} verify-latency points ({impls}) -> {s['out']}"


def validate_fig1a(d: Mapping) -> None:
    """The verify-latency benchmark's target and its settings (`ecospec.bench.settings_problem`)."""
    validate_model(d["model"])
    problem = settings_problem(d.get("fig1a") or {})
    if problem:
        raise ConfigError(f"fig1a.{problem}")


KIND = register(
    JobKind(
        name="fig1a",
        validate=lambda job, awaiting: validate_fig1a(job.config),
        run=run,
        line=line,
        blocks=lambda d: {"fig1a": {k: (d.get("fig1a") or {}).get(k) for k in FIG1A_KEYS}},
        checks_memory=False,
        order=50,
    )
)
