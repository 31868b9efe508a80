"""Atomic writes of files and directories, the one way the project replaces what a reader may be reading.

A reader sees the old file (or directory) or the whole new one, never a half-written one, and after a crash the
rename itself is durable: the data is fsynced before the rename and the directory after it. New files and
directories get the permissions the umask gives any new file (`tempfile.mkstemp` and `mkdtemp` would make them
0600 / 0700, so a teammate could not read a record on a shared project directory).
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import IO


def fsync_dir(path: Path) -> None:
    """Make a rename or a new entry in `path` durable (a no-op where directories cannot be opened)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _sibling(path: Path, tag: str) -> Path:
    """A hidden name beside `path` that no other process picks (pid plus a random token)."""
    return path.with_name(f".{path.name}.{tag}-{os.getpid()}-{secrets.token_hex(4)}")


def write_file(path: Path, write: Callable[[IO], None] | bytes | str, *, text: bool | None = None) -> None:
    """Write `path` atomically: `write(f)` (or the bytes / text given) into a new sibling, fsync, rename, fsync the
    directory. The file is created with mode 0666 less the umask, as `open` would create it."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    if text is None:
        text = isinstance(write, str)
    tmp = _sibling(path, "tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
    try:
        with os.fdopen(fd, "w" if text else "wb") as f:
            if callable(write):
                write(f)
            else:
                f.write(write)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    fsync_dir(path.parent)


def write_json(path: Path, obj, indent: int | None = 1, **kw) -> None:
    """`obj` as JSON into `path`, atomically (`write_file`)."""
    write_file(path, lambda f: json.dump(obj, f, indent=indent, **kw), text=True)


def temp_dir(final: Path) -> Path:
    """A fresh, empty hidden directory beside `final` to build it in (mode 0777 less the umask, unlike mkdtemp)."""
    final = Path(final)
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = _sibling(final, "tmp")
    tmp.mkdir()
    return tmp


def replace_dir(tmp: Path, final: Path) -> None:
    """Swap the finished directory `tmp` in as `final` (an old `final` is renamed aside, then deleted) and make the
    rename durable."""
    tmp, final = Path(tmp), Path(final)
    old = None
    if final.exists():
        old = _sibling(final, "old")
        os.rename(final, old)
    os.rename(tmp, final)
    fsync_dir(final.parent)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)
