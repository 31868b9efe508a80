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


def cpu_key() -> str:
    """A short key of this CPU's model and instruction-set flags: what is built for one CPU (the engine's kernels,
    inductor's graphs) is never loaded on another that shares `$ECOSPEC_CACHE` (a cluster's home directory)."""
    import platform

    try:
        info = Path("/proc/cpuinfo").read_text()
        lines = [ln for ln in info.splitlines() if ln.startswith(("model name", "flags"))][:2]
    except OSError:
        lines = []
    text = platform.machine() + platform.processor() + "\n".join(lines)
    return hashlib.sha1(text.encode()).hexdigest()[:12]


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
