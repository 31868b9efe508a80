"""Atomic writes keep the permissions the umask gives a new file: a teammate on a shared project directory reads a
record under umask 022, nobody else does under 077."""

import json
import os
import stat
from contextlib import contextmanager

import pytest

from ecospec.atomic import replace_dir, temp_dir, write_file, write_json
from ecospec.experiment.records import write_json_atomic


@contextmanager
def umask(mask: int):
    old = os.umask(mask)
    try:
        yield
    finally:
        os.umask(old)


def mode(path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


@pytest.mark.parametrize(("mask", "file_mode", "dir_mode"), [(0o022, 0o644, 0o755), (0o077, 0o600, 0o700)])
def test_modes_come_from_the_umask(tmp_path, mask, file_mode, dir_mode):
    with umask(mask):
        write_json_atomic(tmp_path / "cell" / "result.json", {"status": "ok"})
        write_json(tmp_path / "summary.json", {"a": 1})
        write_file(tmp_path / "blob.bin", b"\x00\x01")
        write_file(tmp_path / "text.md", "# t\n")
        tmp = temp_dir(tmp_path / "store")
        (tmp / "weights").write_bytes(b"w")
        replace_dir(tmp, tmp_path / "store")
    assert mode(tmp_path / "cell" / "result.json") == file_mode
    for name in ("summary.json", "blob.bin", "text.md", "store/weights"):
        assert mode(tmp_path / name) == file_mode, name
    assert mode(tmp_path / "store") == dir_mode
    assert mode(tmp_path / "cell") == dir_mode
    assert json.loads((tmp_path / "cell" / "result.json").read_text()) == {"status": "ok"}


def test_a_failed_write_keeps_the_old_file_and_leaves_no_temp(tmp_path):
    path = tmp_path / "result.json"
    write_json(path, {"a": 1})

    def boom(f):
        f.write("{half")
        raise RuntimeError("killed mid-write")

    with pytest.raises(RuntimeError):
        write_file(path, boom, text=True)
    assert json.loads(path.read_text()) == {"a": 1}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["result.json"]


def test_replace_dir_swaps_a_whole_directory(tmp_path):
    final = tmp_path / "head"
    final.mkdir()
    (final / "old.bin").write_bytes(b"old")
    tmp = temp_dir(final)
    (tmp / "new.bin").write_bytes(b"new")
    replace_dir(tmp, final)
    assert sorted(p.name for p in final.iterdir()) == ["new.bin"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["head"]  # neither the temp nor the old copy is left
