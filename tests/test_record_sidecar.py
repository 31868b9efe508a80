"""A record's per-prompt rows, expert load and traces in its sidecar (`experiment.records`): written beside
result.json and merged back by the one reader, records from before the sidecar read the same, the tables give the
same numbers from either format, and a bad sidecar is one error naming it."""

from __future__ import annotations

import json
import warnings

import numpy as np
import pandas as pd
import pytest

from ecospec.experiment.job import write_record
from ecospec.experiment.records import (
    RESULT,
    ROW_KEYS,
    load_record,
    read_record,
    rows_path,
    write_record_file,
)
from ecospec.report.records import conf_defaults, load_records, model_costs
from ecospec.report.synthetic import iter_records
from ecospec.report.tables import build_tables


@pytest.fixture(scope="module")
def recs() -> list[dict]:
    """The tiny model's records of the synthetic grid (one round) with a row per prompt: some traced, some
    failed."""
    out = [r for r in iter_records(842, seed=0, full_rows=True) if r["config"]["model"]["name"] == "tiny"]
    assert any("trace" in r for r in out) and any(r["status"] == "failed" for r in out)
    return out


def _traced(recs) -> dict:
    return next(r for r in recs if "trace" in r)


def _as_json(rec: dict) -> dict:
    return json.loads(json.dumps(rec))


def test_a_record_round_trips_through_its_sidecar(recs, tmp_path):
    rec = _traced(recs)
    write_record(tmp_path, rec)
    head = json.loads((tmp_path / RESULT).read_text())
    assert not set(ROW_KEYS) & set(head) - {"expert_load"} and head["summary"] == _as_json(rec)["summary"]  # no rows
    assert rows_path(tmp_path / RESULT).name == "result.rows.jsonl"
    assert load_record(tmp_path / RESULT) == _as_json(rec)
    summary_only = load_record(tmp_path / RESULT, parts=False)
    assert summary_only == {k: v for k, v in _as_json(rec).items() if k not in ROW_KEYS}
    some = load_record(tmp_path / RESULT, parts=("expert_load", "trace"), arrays=True)
    assert some["trace"] == _as_json(rec)["trace"] and "prompts" not in some and "ar_prompts" not in some
    assert some["expert_load"].dtype == np.int32 and some["expert_load"].tolist() == rec["expert_load"]


def test_the_expert_load_is_a_numpy_file_and_a_listed_one_still_reads(recs, tmp_path):
    rec = _traced(recs)
    write_record(tmp_path, rec)
    named = json.loads((tmp_path / RESULT).read_text())["expert_load"]  # result.json names the file
    assert named["dtype"] == "<i4" and named["shape"] == list(np.shape(rec["expert_load"]))
    assert np.load(tmp_path / named["file"]).tolist() == rec["expert_load"]  # a plain .npy: numpy reads it
    assert '"expert_load"' not in rows_path(tmp_path / RESULT).read_text()
    kept = (tmp_path / named["file"]).read_bytes()
    (tmp_path / named["file"]).unlink()
    with pytest.raises(ValueError, match=f"{tmp_path / RESULT}.*expert load file is missing"):
        load_record(tmp_path / RESULT)
    assert load_record(tmp_path / RESULT, parts=("trace",))["trace"] == _as_json(rec)["trace"]  # not read for that
    (tmp_path / named["file"]).write_bytes(kept[:-4])  # cut short
    with pytest.raises(ValueError, match="is not a <i4"):
        load_record(tmp_path / RESULT)
    # records written before: the load as a line of lists in the sidecar reads the same, in both forms
    head = json.loads((tmp_path / RESULT).read_text())
    side = rows_path(tmp_path / RESULT)
    lines = side.read_text().splitlines()
    keys = ["expert_load", *head["rows"]["keys"]]
    first = json.dumps({"record": head["rows"]["id"], "keys": keys})
    listed = json.dumps({"expert_load": rec["expert_load"]}, separators=(",", ":"))
    side.write_text("\n".join([first, listed, *lines[1:]]) + "\n")
    head["rows"]["keys"] = keys
    del head["expert_load"]
    (tmp_path / RESULT).write_text(json.dumps(head))
    (tmp_path / named["file"]).unlink()  # such a record has no load file
    assert load_record(tmp_path / RESULT) == _as_json(rec)
    arrays = load_record(tmp_path / RESULT, parts=("expert_load",), arrays=True)
    assert arrays["expert_load"].tolist() == rec["expert_load"]
    # a count past int32 is stored as int64; a rewrite leaves only the new record's load file
    big = [[2**40, 1], [0, 3]]
    write_record_file(tmp_path / RESULT, {**_as_json(rec), "expert_load": big})
    write_record_file(tmp_path / RESULT, {**_as_json(rec), "expert_load": big})
    assert load_record(tmp_path / RESULT)["expert_load"] == big
    (only,) = tmp_path.glob("result.load-*.npy")
    assert np.load(only).dtype == np.int64
    write_record_file(tmp_path / RESULT, {k: v for k, v in _as_json(rec).items() if k != "expert_load"})
    assert not list(tmp_path.glob("result.load-*.npy"))


def test_a_record_from_before_the_sidecar_reads_the_same(recs, tmp_path):
    rec = _traced(recs)
    (tmp_path / "old").mkdir()
    (tmp_path / "old" / RESULT).write_text(json.dumps(rec, indent=1))  # every part inside result.json
    write_record(tmp_path, rec)
    for parts in (True, False, ("expert_load", "trace")):
        old = load_record(tmp_path / "old" / RESULT, parts, arrays=True)
        new = load_record(tmp_path / RESULT, parts, arrays=True)
        assert old.keys() == new.keys()
        for k in old:
            assert np.array_equal(old[k], new[k]) if k == "expert_load" else old[k] == new[k], k


def test_the_tables_give_the_same_numbers_from_either_format(recs, tmp_path):
    for fmt in ("old", "new"):
        for r in recs:
            cell = tmp_path / fmt / r["experiment"] / r["cell"]
            cell.mkdir(parents=True)
            if fmt == "old":
                (cell / RESULT).write_text(json.dumps(r, indent=1))
            else:
                write_record(cell, r)
    old, new = load_records([tmp_path / "old"]), load_records([tmp_path / "new"])
    assert not old.skipped and not new.skipped and len(new.frame) == len(recs)
    plain = [c for c in old.frame.columns if c not in ("path", "expert_load", "trace", "experts_by_layer")]
    pd.testing.assert_frame_equal(old.frame[plain], new.frame[plain])
    assert all(map(np.array_equal, old.frame["expert_load"].dropna(), new.frame["expert_load"].dropna()))
    assert old.frame["trace"].tolist() == new.frame["trace"].tolist()
    costs = model_costs(new.model_configs, new.storages)
    tables_old, _ = build_tables(old.frame, conf_defaults(old.model_configs), costs)
    tables_new, _ = build_tables(new.frame, conf_defaults(new.model_configs), costs)
    assert [t.name for t in tables_old] == [t.name for t in tables_new] and tables_new
    for a, b in zip(tables_old, tables_new, strict=True):
        pd.testing.assert_frame_equal(a.frame, b.frame)


def test_a_bad_sidecar_is_one_error_naming_it(recs, tmp_path):
    rec = _traced(recs)
    side = rows_path(tmp_path / RESULT)
    write_record(tmp_path, rec)
    good = side.read_text()
    other = tmp_path / "other"
    write_record(other, rec)  # the same record written again: another sidecar id
    bad = {
        "cut short": good[: len(good) // 2],
        "corrupt": good.replace('"trace":[', '"trace":[x', 1),
        "another record's": rows_path(other / RESULT).read_text(),
        "missing": None,
    }
    for why, text in bad.items():
        side.unlink(missing_ok=True)
        if text is not None:
            side.write_text(text)
        with pytest.raises(ValueError, match=str(side)):
            load_record(tmp_path / RESULT)
        with pytest.warns(UserWarning, match=str(side)):
            assert read_record(tmp_path / RESULT) is None, why
    with warnings.catch_warnings(record=True) as caught:  # the report skips the record, naming the sidecar
        warnings.simplefilter("always")
        loaded = load_records([tmp_path])
    assert loaded.skipped == [str(tmp_path / RESULT)] and any(str(side) in str(w.message) for w in caught)
    side.write_text(good)
    assert load_record(tmp_path / RESULT, parts=False)["status"] == "ok"  # the summary never reads the sidecar


def test_a_record_without_rows_leaves_no_stale_sidecar(recs, tmp_path):
    rec, failed = _traced(recs), next(r for r in recs if r["status"] == "failed")
    write_record_file(tmp_path / RESULT, rec)
    assert rows_path(tmp_path / RESULT).exists()
    write_record_file(tmp_path / RESULT, {**failed, "cell_id": rec["cell_id"]})
    assert not rows_path(tmp_path / RESULT).exists() and load_record(tmp_path / RESULT)["status"] == "failed"
    raw = json.loads((tmp_path / RESULT).read_text())  # a record read raw (no sidecar parts), written elsewhere
    write_record_file(tmp_path / "copy" / RESULT, {**raw, "rows": {"id": "stale", "keys": ["prompts"]}})
    assert load_record(tmp_path / "copy" / RESULT) == raw  # its link to another file's sidecar does not carry over
