"""Result records (docs/design.md "Result records"): one `result.json` per cell, written atomically; per-prompt
progress checkpointed in `progress.jsonl` so an interrupted (requeued) cell continues where it stopped."""

from __future__ import annotations

import json
import os
import platform
import socket
import subprocess
import warnings
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING

from ecospec.atomic import write_json

if TYPE_CHECKING:
    import torch

SCHEMA = 1
RESULT = "result.json"
FAILED = "failed.json"  # a failure beside an existing ok record, which is never overwritten
PROGRESS = "progress.jsonl"


def now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


def write_json_atomic(path: Path, obj: dict) -> None:
    """A record written atomically with the umask's permissions (`ecospec.atomic`): readers see the old file or
    the whole new one."""
    write_json(path, obj, indent=1)


def read_record(path: Path) -> dict | None:
    """A record, or None with a warning naming the file when it is missing fields or not valid JSON."""
    try:
        rec = json.loads(Path(path).read_text())
    except (OSError, ValueError) as e:
        warnings.warn(f"skipping unreadable result file {path}: {e}", stacklevel=2)
        return None
    if not isinstance(rec, dict) or rec.get("schema") != SCHEMA or "status" not in rec:
        warnings.warn(f"skipping result file {path}: not an ecospec schema-{SCHEMA} record", stacklevel=2)
        return None
    return rec


def is_done(cell_dir: Path, cid: str) -> bool:
    """An ok record for this very cell exists (a rerun skips it)."""
    path = Path(cell_dir) / RESULT
    if not path.exists():
        return False
    rec = read_record(path)
    return bool(rec) and rec["status"] == "ok" and rec.get("cell_id") == cid


def _git_commit() -> str | None:
    try:
        out = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=Path(__file__).parent, capture_output=True, text=True, timeout=5
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() or None


def hardware(device: torch.device) -> str:
    """What the timings ran on (part of the AR cache key): GPU name, or CPU model and torch threads."""
    import torch  # here, not at module level: the reports read records without torch

    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"{cpu} ({torch.get_num_threads()} threads)"


def environment(device: torch.device) -> dict:
    import torch
    import transformers

    from ecospec import __version__

    return {
        "host": socket.gethostname(),
        "device": str(device),
        "hardware": hardware(device),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "ecospec": __version__,
        "git_commit": _git_commit(),
        "slurm_job_id": os.environ.get("SLURM_ARRAY_JOB_ID", os.environ.get("SLURM_JOB_ID")),
        "slurm_array_task_id": os.environ.get("SLURM_ARRAY_TASK_ID"),
    }


class Progress:
    """Finished prompt rows of one cell, appended one JSON line each (flushed and fsynced), keyed by cell_id:
    rows of another cell_id (a changed config) are discarded rather than mixed in."""

    def __init__(self, cell_dir: Path, cid: str, fresh: bool = False, write: bool = True):
        self.path = Path(cell_dir) / PROGRESS
        self.cid = cid
        self.rows: dict[str, dict] = {}
        self.write = write  # ranks other than 0 read the checkpoint but never touch it
        if fresh:
            if write:
                self.path.unlink(missing_ok=True)
        elif self.path.exists():
            lines = self.path.read_text().splitlines()
            for line in lines:
                try:
                    row = json.loads(line)
                except ValueError:
                    break  # a torn last line of a killed job
                if row.get("cell_id") != cid:
                    self.rows.clear()
                    break
                self.rows[row["key"]] = row["row"]
            if len(self.rows) != len(lines) and write:  # drop what was not kept, so appends follow valid lines
                self.path.write_text("".join(json.dumps(self._line(k, r)) + "\n" for k, r in self.rows.items()))

    def _line(self, key: str, row: dict) -> dict:
        return {"cell_id": self.cid, "key": key, "row": row}

    def add(self, key: str, row: dict) -> None:
        self.rows[key] = row
        if not self.write:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.path, "a") as f:
            f.write(json.dumps(self._line(key, row)) + "\n")
            f.flush()
            os.fsync(f.fileno())

    def clear(self) -> None:
        if self.write:
            self.path.unlink(missing_ok=True)
