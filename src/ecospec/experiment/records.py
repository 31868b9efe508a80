"""Result records (docs/design.md "Result records"): one `result.json` per cell, written atomically; per-prompt
progress checkpointed in `progress.jsonl` so an interrupted (requeued) cell continues where it stopped.

A record's bulky parts (`ROW_KEYS`: per-prompt rows, expert loads, traces) live in a sidecar beside it,
`result.rows.jsonl`, so that a reader of the summary never reads them: its first line names the record it belongs
to and the parts it holds, then one line per part, `{"<key>":<value>}`, in `ROW_KEYS` order (the parts the report
reads come first). The expert load's line names a NumPy file beside it, `result.load-<link id>.npy` (int32, int64
where a count needs it: `np.load` reads it; the report reads thousands without parsing their numbers).
`result.json` keeps the rest and a `rows` link. `read_record` merges them back; records
written before the sidecar, with every part inside `result.json`, read the same."""

from __future__ import annotations

import json
import os
import platform
import secrets
import socket
import subprocess
import warnings
from collections.abc import Collection
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from ecospec.atomic import write_file, write_json

if TYPE_CHECKING:
    import torch

SCHEMA = 1
RESULT = "result.json"
FAILED = "failed.json"  # a failure beside an existing ok record, which is never overwritten
PROGRESS = "progress.jsonl"
ROWS_SUFFIX = ".rows.jsonl"  # the sidecar of <name>.json is <name>.rows.jsonl
# the parts a record keeps in its sidecar, in file order: what the report reads first, the per-prompt rows after
ROW_KEYS = ("expert_load", "trace", "routes", "prompts", "ar_prompts", "batches")


def now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


def write_json_atomic(path: Path, obj: dict) -> None:
    """A record written atomically with the umask's permissions (`ecospec.atomic`): readers see the old file or
    the whole new one."""
    write_json(path, obj, indent=1)


def rows_path(path: str | Path) -> Path:
    """The sidecar of the record file `path`: result.json -> result.rows.jsonl."""
    return Path(_rows_file(str(path)))


def _rows_file(path: str) -> str:
    return os.path.splitext(path)[0] + ROWS_SUFFIX  # strings: a report reads thousands (pathlib is slower)


def write_record_file(path: Path, record: dict) -> None:
    """`record` as `path` plus its sidecar (`ROW_KEYS`) and expert-load file, each atomically: the load file first,
    then the sidecar, then the record, so that no file links to one that is not there yet; then the files of the
    record it replaced go (a record without such parts leaves no sidecar)."""
    path = Path(path)
    record = {k: v for k, v in record.items() if k != "rows"}  # a link read raw from another file never carries over
    parts = [k for k in ROW_KEYS if k in record]
    replaced = _load_file_of(path)
    if not parts:
        write_json_atomic(path, record)
        rows_path(path).unlink(missing_ok=True)
        if replaced is not None:
            replaced.unlink(missing_ok=True)
        return
    link = {"id": secrets.token_hex(8), "keys": parts}  # the sidecar is found by name (`rows_path`)
    load = _load_matrix(record.get("expert_load"))
    if load is not None:
        write_file(Path(_load_file(str(path), link["id"])), lambda f: np.save(f, load, allow_pickle=False), text=False)

    def write(f) -> None:
        f.write(json.dumps({"record": link["id"], "keys": parts}) + "\n")
        for k in parts:
            f.write(f'{{"{k}":')
            if k == "expert_load" and load is not None:
                name = os.path.basename(_load_file(str(path), link["id"]))
                value = {"file": name, "dtype": load.dtype.str, "shape": list(load.shape)}
            else:
                value = record[k]
            json.dump(value, f, separators=(",", ":"))
            f.write("}\n")

    write_file(rows_path(path), write, text=True)
    write_json_atomic(path, {**{k: v for k, v in record.items() if k not in parts}, "rows": link})
    if replaced is not None:
        replaced.unlink(missing_ok=True)


LOAD_DTYPES = ("<i4", "<i8")


def _load_matrix(load) -> np.ndarray | None:
    """An expert load ([MoE layers][N] counts) as little-endian int32 (int64 where a count needs it); None for an
    empty or ragged one (it stays a JSON list in the sidecar)."""
    try:
        a = np.asarray(load, dtype=np.int64)
    except (TypeError, ValueError):
        return None
    if a.ndim != 2 or a.size == 0:
        return None
    return a.astype(LOAD_DTYPES[0] if -(2**31) <= a.min() and a.max() < 2**31 else LOAD_DTYPES[1])


def _load_file(path: str, link_id: str) -> str:
    return f"{os.path.splitext(path)[0]}.load-{link_id}.npy"


def _load_file_of(path: Path) -> Path | None:
    """The expert-load file the record now at `path` links to (None without one): the one a rewrite replaces. A
    record renamed aside keeps its load file, which its sidecar names."""
    try:
        link = json.loads(path.read_bytes()).get("rows")
    except (OSError, ValueError, AttributeError):
        return None
    return Path(_load_file(str(path), link["id"])) if isinstance(link, dict) and "id" in link else None


def _read_load_file(path: str, value: dict) -> np.ndarray:
    """The expert load a sidecar line names (`{"file", "dtype", "shape"}`), read whole and viewed past the .npy
    header (what `np.load` would return, without its header parsing); ValueError naming what is wrong."""
    try:
        name, dtype, shape = value["file"], value["dtype"], [int(n) for n in value["shape"]]
        if dtype not in LOAD_DTYPES or os.path.basename(name) != name:
            raise ValueError(f"dtype {dtype!r} or file {name!r}")
        with open(os.path.join(os.path.dirname(path), name), "rb") as f:
            data = f.read()
    except (KeyError, TypeError, ValueError, OSError) as e:
        raise ValueError(f"its expert load file is missing or unreadable ({e})") from None
    offset = 10 + int.from_bytes(data[8:10], "little") if data[:8] == b"\x93NUMPY\x01\x00" else -1
    count = int(np.prod(shape))
    if offset < 0 or len(data) - offset != count * np.dtype(dtype).itemsize:
        raise ValueError(f"its expert load file {name} is not a {dtype} {shape} array")
    return np.frombuffer(data, dtype=dtype, offset=offset).reshape(shape)


def _load_part(path: str, text: bytes, arrays: bool):
    """The expert load of a sidecar line: the NumPy file it names or, in records written before, a JSON list of
    lists; an integer array (None when empty) with `arrays`, else lists."""
    if text.startswith(b"{"):
        load = _read_load_file(path, json.loads(text))
        return load if arrays else load.tolist()
    return _int_matrix(text) if arrays else json.loads(text)


def _int_matrix(text: bytes) -> np.ndarray | None:
    """`[[int, ...], ...]` as a 2-D int64 array by numpy's text parser (faster than `json` for an
    expert load); ValueError if it is anything else."""
    if text == b"[]":
        return None
    if not text.startswith(b"[[") or not text.endswith(b"]]"):
        raise ValueError("expert_load is not a list of lists")
    with warnings.catch_warnings():
        warnings.simplefilter("error", DeprecationWarning)  # numpy warns (not raises) on trailing garbage
        flat = np.fromstring(text.translate(None, b"[]"), dtype=np.int64, sep=",")
    rows, width = text.count(b"[") - 1, text.count(b",", 0, text.find(b"]")) + 1
    if flat.size != rows * width:
        raise ValueError("expert_load is not a [MoE layers][N] matrix")
    return flat.reshape(rows, width)


def _read_parts(path: str, link: dict, wanted: Collection[str], arrays: bool) -> dict:
    """The `wanted` parts of a record's sidecar; ValueError naming the sidecar when it is missing, belongs to
    another record or is cut short or corrupt. Reading stops after the last wanted part."""
    side = _rows_file(path)
    wanted = [k for k in link["keys"] if k in wanted]
    out = {}
    try:
        with open(side, "rb") as f:
            if json.loads(f.readline()) != {"record": link["id"], "keys": link["keys"]}:
                raise ValueError(f"it belongs to another record than {os.path.basename(path)}")
            while wanted:
                line = f.readline()
                key = line[2 : line.find(b'"', 2)].decode()
                if key not in link["keys"] or not line.startswith(b'{"%s":' % key.encode()) or line[-2:] != b"}\n":
                    raise ValueError("a line is not one of its parts (cut short?)")
                if key in wanted:
                    text = line[len(key) + 4 : -2]
                    out[key] = _load_part(path, text, arrays) if key == "expert_load" else json.loads(text)
                    wanted.remove(key)
    except (OSError, ValueError) as e:
        raise ValueError(f"corrupt or missing record sidecar {side}: {e}") from None
    return out


def load_record(path: Path, parts: bool | Collection[str] = True, arrays: bool = False) -> dict:
    """The record in `path` as one dict, its sidecar merged back: with every part (`parts=True`), none (False: the
    summary, config, env and status) or the named ones (the others left out, in either format); `arrays`: the
    expert load as an integer array (int32 or int64 as stored; None when empty). ValueError naming the file when it
    is unreadable or not a schema record, or naming its sidecar when that is missing, another record's, cut short or
    corrupt."""
    path = str(path)
    try:
        with open(path, "rb") as f:
            rec = json.loads(f.read())
    except (OSError, ValueError) as e:
        raise ValueError(f"unreadable result file {path}: {e}") from None
    if not isinstance(rec, dict) or rec.get("schema") != SCHEMA or "status" not in rec:
        raise ValueError(f"result file {path}: not an ecospec schema-{SCHEMA} record")
    wanted = ROW_KEYS if parts is True else () if parts is False else tuple(parts)
    link = rec.pop("rows", None)
    for k in ROW_KEYS:  # a record from before the sidecar: the parts inside
        if k not in wanted:
            rec.pop(k, None)
    if isinstance(link, dict) and wanted:
        rec.update(_read_parts(path, link, wanted, arrays))
    elif arrays and isinstance(rec.get("expert_load"), list):
        try:
            rec["expert_load"] = np.asarray(rec["expert_load"], dtype=np.int64) if rec["expert_load"] else None
        except (TypeError, ValueError) as e:
            raise ValueError(f"result file {path}: expert_load is not a [MoE layers][N] matrix ({e})") from None
    return rec


def read_record(path: Path, parts: bool | Collection[str] = True) -> dict | None:
    """`load_record`, or None with a warning naming the file (the record or its sidecar) when it cannot be read."""
    try:
        return load_record(path, parts)
    except ValueError as e:
        warnings.warn(f"skipping {e}", stacklevel=2)
        return None


def is_done(cell_dir: Path, cid: str) -> bool:
    """An ok record for this very cell exists (a rerun skips it)."""
    path = Path(cell_dir) / RESULT
    if not path.exists():
        return False
    rec = read_record(path, parts=False)
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
