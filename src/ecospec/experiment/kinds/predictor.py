"""predictor: the expert predictor trained on a target's stored traces (`experiment.predictor_job`); it never loads
the target."""

from collections.abc import Mapping

from ecospec.experiment.config import bad, positive_ints, validate_datasets, validate_model
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


def validate_training(d: Mapping) -> None:
    validate_model(d["model"])
    t = d.get("training") or {}
    validate_datasets(t.get("datasets"), "training.datasets", "a non-empty list of datasets whose traces to learn from")
    if (t.get("epochs") is None) == (t.get("steps") is None):
        raise bad("training.epochs", t.get("epochs"), "set exactly one of training.epochs and training.steps")
    e = t.get("epochs")
    if e is not None and (isinstance(e, bool) or not isinstance(e, int | float) or e <= 0):
        raise bad("training.epochs", e, "must be a number > 0")
    if t.get("steps") is not None:
        positive_ints(t, (("steps", 1),), "training.")
    positive_ints(t, (("batch_size", 1), ("window", 2)), "training.")
    lr = t.get("lr")
    if isinstance(lr, bool) or not isinstance(lr, int | float) or lr <= 0:
        raise bad("training.lr", lr, "must be a number > 0")
    for name, level in (t.get("levels") or {}).items():
        if isinstance(level, bool) or not isinstance(level, int | float) or not 0 < level < 1:
            raise bad(f"training.levels.{name}", level, "an accuracy in (0, 1)")
    if not (d["model"].get("predictor") or {}).get("backbone"):
        raise bad("model.predictor.backbone", None, "an HF id / directory of a base decoder, or a config mapping")


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
