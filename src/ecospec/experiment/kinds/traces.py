"""traces: the target's routing on a dataset's prompts, stored for the expert predictor (`experiment.traces_job`)."""

from collections.abc import Mapping

from ecospec.experiment.config import (
    MIX,
    bad,
    positive_ints,
    validate_dataset,
    validate_model,
    validate_num_prompts,
    validate_parallel,
)
from ecospec.experiment.kinds import JobKind, register
from ecospec.identity import TRACES_KEYS


def run(cfg, job_dir):
    from ecospec.experiment.traces_job import run_traces

    return run_traces(cfg, job_dir)


def blocks(d: dict) -> dict:
    t = d.get("traces") or {}
    return {"dataset": d["dataset"], "traces": {k: (d.get(k) if k == "num_prompts" else t.get(k)) for k in TRACES_KEYS}}


def directory(c: dict, cid: str) -> str:
    t = c["traces"]
    part = f"-part{t['part']}of{t['parts']}" if (t.get("parts") or 1) > 1 else ""
    return f"traces-{c['model']['name']}-{c['dataset']['name']}{part}-{cid[:6]}"


def line(record: dict) -> str:
    s = record["summary"]
    return f"{s['samples']} samples, {s['tokens']:,} tokens traced -> {s['trace_dir']}"


def validate_traces(d: Mapping) -> None:
    validate_model(d["model"])
    validate_parallel(d)
    if d["dataset"].get("name") == MIX:
        raise bad("dataset.name", MIX, "traces are collected per benchmark: name one (the predictor pools them)")
    validate_dataset(d["dataset"])
    validate_num_prompts(d)
    t = d.get("traces") or {}
    positive_ints(
        t, (("response_tokens", 0), ("batch_size", 1), ("shard_size", 1), ("parts", 1), ("part", 0)), "traces."
    )
    if t["part"] >= t["parts"]:
        raise bad("traces.part", t["part"], f"must be < traces.parts={t['parts']}")


KIND = register(
    JobKind(
        name="traces",
        validate=lambda job, awaiting: validate_traces(job.config),
        run=run,
        line=line,
        blocks=blocks,
        model=lambda model: {"chat_template": model.get("chat_template")},
        directory=directory,
        order=20,
    )
)
