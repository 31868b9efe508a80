"""predictor: the expert predictor trained on a target's stored traces (`experiment.predictor_job`); it never loads
the target."""

from ecospec.experiment.config import validate_training
from ecospec.experiment.kinds import JobKind, register
from ecospec.identity import TRAINING_KEYS


def run(cfg, job_dir):
    from ecospec.experiment.predictor_job import run_predictor

    return run_predictor(cfg, job_dir)


def line(record: dict) -> str:
    s = record["summary"]
    return (
        f"held-out top-k accuracy {s['final_accuracy']:.3f} "
        f"(chance {s['chance']:.3f}); published {', '.join(s['published'])} -> {s['store']}"
    )


KIND = register(
    JobKind(
        name="predictor",
        validate=lambda job, awaiting: validate_training(job.config),
        run=run,
        line=line,
        blocks=lambda d: {"training": {k: (d.get("training") or {}).get(k) for k in TRAINING_KEYS}},
        model=lambda model: {"backbone": (model.get("predictor") or {}).get("backbone")},
        ranks=False,
        checks_memory=False,
        order=30,
    )
)
