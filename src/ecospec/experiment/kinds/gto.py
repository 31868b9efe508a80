"""gto: an EAGLE-3 head trained further with Group Tree Optimization, then measured (`experiment.gto_job`)."""

from collections.abc import Mapping

from ecospec.drafters.kind_gto import NAME
from ecospec.experiment.config import bad, positive_ints, validate_datasets, validate_model, validate_parallel
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


def validate_gto(d: Mapping) -> None:
    validate_model(d["model"])
    validate_parallel(d)
    g = d.get("gto") or {}
    if not g.get("data"):
        validate_datasets(
            g.get("datasets"), "gto.datasets", "a non-empty list of datasets (their train split), or set gto.data"
        )
    positive_ints(
        g,
        (
            ("steps", 1),
            ("batch_size", 1),
            ("seq_len", 8),
            ("groups", 1),
            ("group_size", 2),
            ("depth", 1),
            ("topk", 1),
            ("response_tokens", 1),
            ("save_every", 1),
            ("batch_size_generate", 1),
        ),
        "gto.",
    )
    lr = g.get("lr")
    if isinstance(lr, bool) or not isinstance(lr, int | float) or lr <= 0:
        raise bad("gto.lr", lr, "must be a number > 0")
    eagle = (d["model"].get("drafters") or {}).get("eagle3")
    if eagle is None:
        raise bad("model.drafters.eagle3", None, f"model={d['model']['name']} has no EAGLE-3 head to start GTO from")


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
