"""Which code made a study's result: every file a study writes names the commit it ran at."""

from __future__ import annotations

import subprocess
from pathlib import Path

HERE = Path(__file__).resolve().parent


def run_commit() -> str:
    """`git rev-parse HEAD` of the checkout the study runs from, `+dirty` when tracked files differ from it (the
    result then belongs to no commit), or `unknown` outside a git checkout."""
    git = ["git", "-C", str(HERE)]
    head = subprocess.run([*git, "rev-parse", "HEAD"], capture_output=True, text=True)
    if head.returncode != 0:
        return "unknown"
    dirty = subprocess.run([*git, "diff", "--quiet", "HEAD"], capture_output=True).returncode != 0
    return head.stdout.strip() + ("+dirty" if dirty else "")
