"""W&B mirror of result records: offline runs on disk, mode rules, the expert-load figure."""

import json
import struct
import time
from pathlib import Path

import pandas as pd
import pytest
import wandb
from wandb.proto import wandb_internal_pb2

from ecospec.experiment import tracking
from ecospec.experiment.heatmap import expert_load_figure
from ecospec.experiment.job import write_record
from ecospec.experiment.records import RESULT, read_record, rows_path
from ecospec.experiment.tracking import log_cell, wandb_mode

WANDB = {"name": "wandb", "project": "ecospec", "entity": None, "mode": None, "dir": None}


def make_record(status: str = "ok") -> dict:
    config = {
        "model": {"name": "tiny"},
        "method": {"name": "ecospec"},
        "dataset": {"name": "humaneval"},
        "temperature": 0.0,
        "gamma": 4,
        "depth": 3,
        "topk": 2,
        "batch_size": 1,
        "max_new_tokens": 64,
        "num_prompts": 2,
        "seed": 0,
    }
    record = {
        "schema": 1,
        "cell_id": "3f2a9c0d1e2b",
        "experiment": "table1",
        "status": status,
        "cell": "tiny_random/ecospec/humaneval/T0-g4-d3-k2-b1",
        "config": config,
        "env": {"host": "laptop", "device": "cpu", "git_commit": "abc", "slurm_job_id": None},
        "summary": {},
        "prompts": [],
        "expert_load": [],
    }
    if status == "ok":
        record["summary"] = {"alpha": 2.3, "experts_per_layer": 9.8, "experts_by_layer": [9.1, 10.5], "speedup": 1.2}
        record["prompts"] = [
            {
                "id": f"humaneval/{i}",
                "turn": 0,
                "tokens": [5, 6, 7],
                "n_tokens": 3,
                "alpha": 2.0 + i,
                "matches_ar": True,
            }
            for i in range(2)
        ]
        record["expert_load"] = [[10, 0, 3, 7, 1, 1, 2, 0], [4, 4, 4, 4, 2, 2, 2, 2]]
    else:
        record["error"] = "RuntimeError: boom"
    return record


@pytest.fixture(scope="module", autouse=True)
def fresh_wandb():
    """Stop the W&B service and forget its settings (our tmp dirs) once this module is done."""
    yield
    wandb.teardown()


@pytest.fixture
def no_credentials(tmp_path, monkeypatch):
    """No API key anywhere, no WANDB_MODE, wandb's files under tmp: the default mode is offline."""
    for var in ("WANDB_API_KEY", "WANDB_IDENTITY_TOKEN_FILE", "WANDB_MODE", "WANDB_BASE_URL", "WANDB_DIR"):
        monkeypatch.delenv(var, raising=False)
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("NETRC", str(home / ".netrc"))
    monkeypatch.setenv("WANDB_CONFIG_DIR", str(home / "wandb-config"))
    monkeypatch.setenv("WANDB_CACHE_DIR", str(home / "wandb-cache"))
    monkeypatch.setenv("WANDB_DATA_DIR", str(home / "wandb-data"))
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(tracking, "_offline_reason", None)
    return home


def read_records(run_dir: str) -> list:
    """The protobuf records of a run's .wandb file: a header, then the LevelDB log format (32 KiB blocks
    of chunks with a 7-byte header: crc32c, little-endian length, type FULL=1 FIRST=2 MIDDLE=3 LAST=4)."""
    (path,) = Path(run_dir).glob("*.wandb")
    data = path.read_bytes()
    assert data[:4] == b":W&B"[: len(data)]
    records, chunk, pos, block = [], b"", 7, 32768
    while pos + 7 <= len(data):
        if block - pos % block < 7:  # block trailer too small for a chunk header: zero padding
            pos += block - pos % block
            continue
        _, length, kind = struct.unpack("<IHB", data[pos : pos + 7])
        if pos + 7 + length > len(data):  # the service is still writing this chunk
            break
        chunk += data[pos + 7 : pos + 7 + length]
        pos += 7 + length
        if kind in (1, 4):
            records.append(wandb_internal_pb2.Record.FromString(chunk))
            chunk = b""
    return records


def run_contents(run_dir: str) -> dict:
    """Config, summary (last value per key), exit code and run metadata of an offline run.

    `run.finish()` returns before the W&B service has written out the file: wait for the exit record."""
    deadline = time.monotonic() + 10
    while not (records := read_records(run_dir)) or records[-1].WhichOneof("record_type") != "exit":
        assert time.monotonic() < deadline, "the run's .wandb file has no exit record"
        time.sleep(0.01)
    out = {"config": {}, "summary": {}, "exit_code": None, "run": None}
    for rec in records:
        kind = rec.WhichOneof("record_type")
        if kind == "run":
            out["run"] = rec.run
            out["config"] = {item.key: json.loads(item.value_json) for item in rec.run.config.update}
        elif kind == "summary":
            for item in rec.summary.update:
                *parents, key = item.nested_key or [item.key]
                node = out["summary"]
                for parent in parents:
                    node = node.setdefault(parent, {})
                node[key] = json.loads(item.value_json)
        elif kind == "exit":
            out["exit_code"] = rec.exit.exit_code
    return out


@pytest.mark.parametrize("stored", [False, True], ids=["in memory", "read back from its sidecar"])
def test_ok_record_writes_offline_run(no_credentials, tmp_path, stored):
    record = make_record()
    if stored:  # written by the cells' writer (rows and load in the sidecar), then read back whole
        write_record(tmp_path / "cell", record)
        assert rows_path(tmp_path / "cell" / RESULT).exists()
        record = read_record(tmp_path / "cell" / RESULT)
    run_dir = log_cell(record, WANDB, tmp_path / "cell")
    assert run_dir is not None
    run_dir = Path(run_dir)
    assert run_dir.parent == tmp_path / "cell" / "wandb"
    assert run_dir.name.startswith("offline-run-") and run_dir.name.endswith("-table1-3f2a9c0d1e2b")

    got = run_contents(run_dir)
    assert got["run"].run_id == "table1-3f2a9c0d1e2b"
    assert got["run"].display_name == record["cell"]
    assert got["run"].run_group == "table1" and got["run"].job_type == "ecospec"
    assert list(got["run"].tags) == ["tiny", "ecospec", "humaneval"]
    assert {key: got["config"][key] for key in record["config"]} == record["config"]
    summary = got["summary"]
    assert summary["alpha"] == 2.3 and summary["speedup"] == 1.2 and summary["status"] == "ok"
    assert summary["env/device"] == "cpu" and summary["cell_id"] == "3f2a9c0d1e2b"
    assert "experts_by_layer" not in summary
    assert summary["prompts"]["_type"] == "table-file" and summary["expert_load"]["_type"] == "image-file"
    assert got["exit_code"] == 0

    (table,) = (run_dir / "files" / "media" / "table").glob("prompts_*.table.json")
    table = json.loads(table.read_text())
    assert table["columns"] == ["id", "turn", "n_tokens", "alpha", "matches_ar"]
    assert len(table["data"]) == 2
    (image,) = (run_dir / "files" / "media" / "images").glob("expert_load_*.png")
    assert image.stat().st_size > 10_000


def test_failed_record_exits_nonzero(no_credentials, tmp_path):
    run_dir = log_cell(make_record("failed"), WANDB, tmp_path / "cell")
    got = run_contents(run_dir)
    assert got["exit_code"] == 1
    assert got["summary"]["status"] == "failed"
    assert got["summary"]["error"] == "RuntimeError: boom"
    assert not (Path(run_dir) / "files" / "media").exists()


def test_logger_none_writes_nothing(no_credentials, tmp_path):
    assert log_cell(make_record(), {"name": "none"}, tmp_path / "cell") is None
    assert not (tmp_path / "cell").exists()


def test_failed_online_start_falls_back_to_offline(no_credentials, tmp_path, monkeypatch, caplog):
    real_init, modes = wandb.init, []

    def init(**kwargs):
        modes.append(kwargs["mode"])
        if kwargs["mode"] == "online":
            raise wandb.errors.CommError("no network")
        return real_init(**kwargs)

    monkeypatch.setenv("WANDB_API_KEY", "x" * 40)
    monkeypatch.setattr(wandb, "init", init)
    run_dir = log_cell(make_record(), WANDB, tmp_path / "cell")
    assert modes == ["online", "offline"]
    assert "no network" in caplog.text
    assert Path(run_dir).name.startswith("offline-run-")


def test_wandb_mode_rules(no_credentials, monkeypatch):
    assert wandb_mode(None) == "offline"
    (no_credentials / ".netrc").write_text("machine api.wandb.ai\n  login user\n  password " + "k" * 40 + "\n")
    assert wandb_mode(None) == "online"
    (no_credentials / ".netrc").unlink()
    monkeypatch.setenv("WANDB_API_KEY", "k" * 40)
    assert wandb_mode(None) == "online"
    monkeypatch.setenv("WANDB_MODE", "dryrun")
    assert wandb_mode(None) == "offline"
    assert wandb_mode("disabled") == "disabled"
    monkeypatch.delenv("WANDB_MODE")
    settings = no_credentials / "wandb-config" / "settings"
    settings.parent.mkdir()
    settings.write_text("[default]\nmode = disabled\n")
    assert wandb_mode(None) == "disabled"
    assert wandb_mode("online") == "online"


def test_expert_load_figure_has_labels():
    fig = expert_load_figure(make_record()["expert_load"], "some cell")
    heat, dist = fig.axes[:2]
    assert fig.get_suptitle() == "some cell"
    assert heat.get_title() and heat.get_xlabel() == "expert id" and heat.get_ylabel() == "MoE layer"
    assert heat.images[0].get_array().shape == (2, 8)
    assert dist.get_title() and dist.get_xlabel() and dist.get_ylabel() and dist.get_legend() is not None
    assert any(ax.get_ylabel() == "tokens routed" for ax in fig.axes[2:])
    with pytest.raises(ValueError):
        expert_load_figure([], "empty")


@pytest.mark.usefixtures("no_release_traces")
def test_tables_go_to_the_cells_project_as_one_run(no_credentials, tmp_path):
    """`python -m ecospec.report` with the cells' W&B logger (`--logger cells`, the default): one offline run,
    job_type tables, in the cells' project, beside the cells' runs, holding each table (its CSV) as a W&B table and
    each figure as an image; `--logger none`, or cells that logged nothing, make no run."""
    from ecospec.report.__main__ import main as report
    from ecospec.report.synthetic import synthetic_records

    records = tmp_path / "experiments"
    for rec in synthetic_records(150, seed=0):
        if rec["experiment"] == "table1" and rec["config"]["model"]["name"] != "tiny":
            rec["config"]["logger"] = dict(WANDB, project="cells-project")
            write_record(records / rec["experiment"] / rec["cell"], rec)
    out = tmp_path / "reports"
    assert report(["--records", str(records), "--out", str(out), "--logger", "none"]) == 0
    assert not (records / "wandb").exists()
    assert report(["--records", str(records), "--out", str(out)]) == 0
    (run_dir,) = (records / "wandb").glob("offline-run-*-tables-*")
    got = run_contents(run_dir)
    assert got["run"].project == "cells-project" and got["run"].job_type == "tables" and got["exit_code"] == 0
    tables = sorted(p.relative_to(out).with_suffix("").as_posix() for p in out.rglob("*.csv"))
    figures = sorted(p.relative_to(out).with_suffix("").as_posix() for p in out.rglob("*.png"))
    assert "table01_main" in tables and figures, (tables, figures)
    summary = got["summary"]
    assert summary["tables"] == len(tables) and summary["figures"] == len(figures)
    assert all(summary[key]["_type"] == "table-file" for key in tables)
    assert all(summary[key]["_type"] == "image-file" for key in figures)
    (table,) = (run_dir / "files" / "media" / "table").glob("table01_main_*.table.json")
    rows = json.loads(table.read_text())
    assert rows["columns"] == list(pd.read_csv(out / "table01_main.csv").columns) and rows["data"]
