"""gto: an EAGLE-3 head trained further with Group Tree Optimization, then measured (`experiment.gto_job`)."""

from ecospec.drafters.kind_gto import NAME
from ecospec.experiment.config import validate_gto
from ecospec.experiment.kinds import JobKind, register
from ecospec.experiment.kinds.cell import line
from ecospec.identity import GTO_KEYS


def run(cfg, job_dir):
    from ecospec.experiment.gto_job import run_gto

    return run_gto(cfg, job_dir)


def model(model) -> dict:
    """The head GTO starts from and the prompt format it trains on."""
    head = ((model.get("drafters") or {}).get("eagle3") or {}).get("path")
    return {"head": head, "chat_template": model.get("chat_template")}


KIND = register(
    JobKind(
        name=NAME,
        validate=lambda job, awaiting: validate_gto(job.config),
        run=run,
        line=line,
        blocks=lambda d: {"gto": {k: (d.get("gto") or {}).get(k) for k in GTO_KEYS}},
        model=model,
        order=40,
    )
)
