"""Several methods in one job, interleaved prompt by prompt (`interleave=[eagle3,oracle]` beside the cell's own
method): each prompt is decoded by the cell's method, then by each listed method, then by AR, so a machine that
slows down slows them all alike and a method-against-method ratio is a ratio of one run (paired; `make demo`
is one such job).

Each listed method gets the record it would have had run alone, in its own cell directory (the same cell id: the
knob is no part of any cell's identity), and every record of the group carries `summary.intervals.run`, the
run's id, by which the reports know two cells were measured together (`report.compare`: paired; otherwise weakly
paired). A listed method whose ok record exists is not rerun (force=true reruns it), so nothing is overwritten.
Batch 1, our engine, no expert budget: where the methods share everything but their drafter, selector and
predictor.
"""

from __future__ import annotations

from pathlib import Path

from omegaconf import OmegaConf

from ecospec.analysis.cost import conf_dir
from ecospec.experiment.config import ConfigError, job_id, job_name, validate


def methods(d: dict) -> list[str]:
    """The listed methods' names (conf/method/<name>.yaml), [] without the knob."""
    names = d.get("interleave") or []
    if isinstance(names, str):
        names = [n for n in names.split(",") if n]
    return list(names)


def method_config(name: str) -> dict:
    path = conf_dir() / "method" / f"{name}.yaml"
    if not path.exists():
        have = ", ".join(sorted(p.stem for p in (conf_dir() / "method").glob("*.yaml")))
        raise ConfigError(f"interleave: unknown method {name!r} (conf/method has: {have})")
    return OmegaConf.to_container(OmegaConf.load(path), resolve=True)


def companion(d: dict, name: str) -> dict:
    """The config of listed method `name`'s own cell: the cell's, with its method (and no interleave)."""
    return {**d, "method": method_config(name), "interleave": None}


def validate_interleave(d: dict) -> None:
    """One line for what the knob cannot do; each listed method is validated as its own cell."""
    names = methods(d)
    if not names:
        return
    main = d["method"]["name"]
    if d.get("batch_size", 1) != 1:
        raise ConfigError(f"interleave={','.join(names)}: batch_size 1 only (batch_size={d['batch_size']})")
    if d.get("expert_budget") is not None:
        raise ConfigError("interleave: not with expert_budget (the budget is a method's own setting)")
    if (d.get("backend") or {}).get("name", "hf") != "hf":
        raise ConfigError("interleave: our engine only (backend=hf)")
    if "ar" in names or main == "ar":
        raise ConfigError("interleave: AR is decoded beside every method already; list SD methods only")
    if main in names or len(set(names)) < len(names):
        raise ConfigError(f"interleave={','.join(names)}: each method once, not the cell's own ({main})")
    for name in names:
        validate(companion(d, name))


def companion_dir(job_dir: Path, d: dict, name: str) -> tuple[Path, str, str]:
    """(directory, cell id, cell name) of listed method `name`'s cell: a sibling of the running cell's."""
    c = companion(d, name)
    return job_dir.parent / job_name(c), job_id(c), job_name(c)
