"""What a cell's config means by its components: the embedded default's stage folders (`tiny.build.tiny_dirs`:
the release, or a cache build made first where missing), the predictor checkpoint it names, the engine and the
verify-cost profile. The loading itself is `ecospec.components.load`, which the tiny build's stages reach with
their own folders (`load_build`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from ecospec import sources
from ecospec.analysis.profiles import load_profile
from ecospec.components import Components, load
from ecospec.experiment.config import TINY_CHECKPOINTS, ConfigError, predictor_path
from ecospec.experiment.engines import CellEngine
from ecospec.experiment.records import hardware
from ecospec.experiment.spec import Method
from ecospec.methods import method as method_spec
from ecospec.sources import TinyDirs
from ecospec.tiny.build import tiny_dirs


@dataclass
class CellComponents(Components):
    """A cell's components: the loaded models and what the cell runs them with."""

    engine: CellEngine = field(default_factory=CellEngine)  # eager | compiled (shared by a job's methods)
    profile: Any = None  # the verify-cost profile of a method that prices passes in seconds (VerifyProfile)
    profile_ref: dict | None = None  # {"key", "hash"} of that profile: what the record names


def pick_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


def predictor_checkpoint(model: dict, dirs_of: TinyDirs) -> str | Path | None:
    """The learned predictor a model config names: "random", a tiny build's checkpoint folder, or a directory or hub
    id (`config.predictor_path`)."""
    name = predictor_path(model)
    if sources.builtin(model) and name in TINY_CHECKPOINTS:
        where = dirs_of(model)["predictor"] / name
        if not where.is_dir():
            raise ConfigError(f"model.predictor.checkpoint={name!r}: the tiny build saved no such checkpoint ({where})")
        return where
    return name


def load_components(
    model: dict,
    method: Method,
    engine: str,
    device: torch.device,
    loaded: CellComponents | None = None,
    dirs_of: TinyDirs = tiny_dirs,
) -> CellComponents:
    """Everything `method` needs of `model` on `engine` (eager | compiled), on `device` (or spread by the model's
    device_map); `loaded`: components whose target, tokenizer and engine to share (another method of the same job,
    interleaved); `dirs_of`: where the embedded default's stage folders are (`tiny_dirs`: the release or a cache
    build)."""
    predictor = None
    if method.predictor == "learned":
        predictor = predictor_checkpoint(model, dirs_of)
    elif method.predictor == "oracle":
        predictor = "oracle"
    comp = load(model, device, dirs_of, drafter=method.drafter, predictor=predictor, loaded=loaded)
    engine = loaded.engine if loaded is not None else CellEngine(engine)
    profile, ref = _profile(model["name"], method, engine.name, comp.target, device)
    return CellComponents(**vars(comp), engine=engine, profile=profile, profile_ref=ref)


def _profile(model: str, method: Method, engine: str, target, device: torch.device):
    """(profile, {"key", "hash"}) of this model, engine and machine when the method prices passes in seconds (else
    (None, None)); none measured stops the cell naming the command that makes it."""
    if not method.speculative or not method_spec(method.selector).cost_model:
        return None, None
    dtype = str(target.dtype).removeprefix("torch.")
    profile, digest = load_profile(model, engine, dtype, hardware(device))
    return profile, {"key": profile.key, "hash": digest}
