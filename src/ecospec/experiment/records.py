"""Result records (docs/design.md "Result records"): one `result.json` per cell, written atomically; per-prompt
progress checkpointed in `progress.jsonl` so an interrupted (requeued) cell continues where it stopped.

A record's bulky parts (`ROW_KEYS`) live beside it, so that a reader of the summary never reads them: the expert
load in a NumPy file, `result.load-<id>.npy` (int32, int64 where a count needs it; `np.load` reads it, and the
report reads thousands without parsing their numbers), which `result.json`'s `expert_load` names with its dtype and
shape; per-prompt rows and traces in a sidecar, `result.rows.jsonl`, which `result.json`'s `rows` link names the
parts of: its first line names the record it belongs to and the parts it holds, then one line per part,
`{"<key>":<value>}`, in `ROW_KEYS` order (the parts the report reads come first). `read_record` merges them back;
records written before (every part inside `result.json`, or the expert load as a line of the sidecar) read the
same."""

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
    """`record` as `path` plus its expert-load file and sidecar (`ROW_KEYS`), each atomically: the load file and
    the sidecar first, so that a record never names a file that is not there yet; then the files of the record it
    replaced go (a record without such parts leaves no sidecar)."""
    path = Path(path)
    record = {k: v for k, v in record.items() if k != "rows"}  # a link read raw from another file never carries over
    replaced = _load_file_of(path)
    head = {k: v for k, v in record.items() if k not in ROW_KEYS}
    link_id = secrets.token_hex(8)
    if "expert_load" in record:
        load = _load_matrix(record["expert_load"])
        if load is None:  # an empty or ragged load stays in the record as it is
            head["expert_load"] = record["expert_load"]
        else:
            name = f"{os.path.splitext(path.name)[0]}.load-{link_id}.npy"
            write_file(path.with_name(name), lambda f: np.save(f, load, allow_pickle=False), text=False)
            head["expert_load"] = {"file": name, "dtype": load.dtype.str, "shape": list(load.shape)}
    parts = [k for k in ROW_KEYS if k in record and k != "expert_load"]
    if parts:

        def write(f) -> None:
            f.write(json.dumps({"record": link_id, "keys": parts}) + "\n")
            for k in parts:
                f.write(f'{{"{k}":')
                json.dump(record[k], f, separators=(",", ":"))
                f.write("}\n")

        write_file(rows_path(path), write, text=True)
        head["rows"] = {"id": link_id, "keys": parts}  # the sidecar is found by name (`rows_path`)
    write_json_atomic(path, head)
    if not parts:
        rows_path(path).unlink(missing_ok=True)
    if replaced is not None and replaced.name != _load_name(head):
        replaced.unlink(missing_ok=True)


LOAD_DTYPES = ("<i4", "<i8")


def _load_matrix(load) -> np.ndarray | None:
    """An expert load ([MoE layers][N] counts) as little-endian int32 (int64 where a count needs it); None for an
    empty or ragged one."""
    try:
        a = np.asarray(load, dtype=np.int64)
    except (TypeError, ValueError):
        return None
    if a.ndim != 2 or a.size == 0:
        return None
    return a.astype(LOAD_DTYPES[0] if -(2**31) <= a.min() and a.max() < 2**31 else LOAD_DTYPES[1])


def _load_name(record: dict) -> str | None:
    ref = record.get("expert_load")
    return ref.get("file") if isinstance(ref, dict) else None


def _load_file_of(path: Path) -> Path | None:
    """The expert-load file the record now at `path` names (None without one): the one a rewrite replaces. A record
    renamed aside keeps its load file, which it names."""
    try:
        name = _load_name(json.loads(path.read_bytes()))
    except (OSError, ValueError, AttributeError):
        return None
    return path.with_name(name) if name else None


def _read_load_file(path: str, ref: dict) -> np.ndarray:
    """The expert load `ref` (`{"file", "dtype", "shape"}`, in the record at `path`) names, read whole and viewed
    past the .npy header (what `np.load` returns, without its header parsing); ValueError naming what is wrong."""
    try:
        name, dtype, shape = ref["file"], ref["dtype"], [int(n) for n in ref["shape"]]
        if dtype not in LOAD_DTYPES or os.path.basename(name) != name:
            raise ValueError(f"dtype {dtype!r} or file {name!r}")
        with open(os.path.join(os.path.dirname(path), name), "rb") as f:
            data = f.read()
    except (KeyError, TypeError, ValueError, OSError) as e:
        raise ValueError(f"result file {path}: its expert load file is missing or unreadable ({e})") from None
    offset = 10 + int.from_bytes(data[8:10], "little") if data[:8] == b"\x93NUMPY\x01\x00" else -1
    if offset < 0 or len(data) - offset != int(np.prod(shape)) * np.dtype(dtype).itemsize:
        raise ValueError(f"result file {path}: its expert load file {name} is not a {dtype} {shape} array")
    return np.frombuffer(data, dtype=dtype, offset=offset).reshape(shape)


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
                    if key == "expert_load":  # a record from before the load file: a line of lists
                        out[key] = _int_matrix(text) if arrays else json.loads(text)
                    else:
                        out[key] = json.loads(text)
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
    for k in ROW_KEYS:  # the summary alone; a record from before the sidecar holds its parts inside
        if k not in wanted:
            rec.pop(k, None)
    if isinstance(link, dict) and any(k in link.get("keys", ()) for k in wanted):
        rec.update(_read_parts(path, link, wanted, arrays))
    load = rec.get("expert_load")
    if isinstance(load, dict):
        load = _read_load_file(path, load)
        rec["expert_load"] = load if arrays else load.tolist()
    elif arrays and isinstance(load, list):
        try:
            rec["expert_load"] = np.asarray(load, dtype=np.int64) if load else None
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
