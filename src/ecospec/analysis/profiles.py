"""Where verify-cost profiles live and how a cell loads one (`analysis.verify_profile.VerifyProfile`); measuring them is
`bench.profile`'s job, whose command a missing profile names."""

from __future__ import annotations

import json
from pathlib import Path

from ecospec.analysis.verify_profile import PROFILE_VERSION, VerifyProfile, profile_key
from ecospec.cache import cache_root


class ProfileMissing(ValueError):
    """No verify-cost profile for this model, engine and machine."""


def profiles_dir() -> Path:
    return cache_root() / "profiles"


def command(model: str, engine: str) -> str:
    """The command that measures the profile (`python -m ecospec.bench.profile`)."""
    return f"python -m ecospec.bench.profile --model {model} --engine {engine}"


def load_profile(model: str, engine: str, dtype: str, processor: str) -> tuple[VerifyProfile, str]:
    """(the profile, its hash) for this model, engine, dtype and processor; ProfileMissing names the command."""
    path = profiles_dir() / f"{profile_key(model, engine, dtype, processor)}.json"
    if not path.is_file():
        raise ProfileMissing(
            f"no verify-cost profile for model={model} engine={engine} on {processor} ({path}); "
            f"make it with: {command(model, engine)}"
        )
    data = json.loads(path.read_text())
    if data["profile"].get("version") != PROFILE_VERSION:
        raise ProfileMissing(
            f"the verify-cost profile {path} was made by another version of ecospec; make it again "
            f"with: {command(model, engine)}"
        )
    return VerifyProfile(**data["profile"]), data["hash"]
