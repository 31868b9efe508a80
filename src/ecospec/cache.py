"""Where ecospec caches what it builds or fetches, and how cache keys are made (stdlib only, so data and
report tools can use it without importing torch)."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

ENV_CACHE = "ECOSPEC_CACHE"


def cache_root() -> Path:
    """``$ECOSPEC_CACHE``, else ``~/.cache/ecospec``."""
    env = os.environ.get(ENV_CACHE)
    return Path(env).expanduser() if env else Path.home() / ".cache" / "ecospec"


def sha256_file(path: Path) -> str:
    """The sha256 of a file's bytes (hex), read in 1 MiB chunks."""
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def digest(obj: Any, n: int = 12) -> str:
    """First `n` hex digits of the sha256 of `obj` as canonical JSON (sorted keys; str() for other types)."""
    return hashlib.sha256(json.dumps(obj, sort_keys=True, default=str).encode()).hexdigest()[:n]
