"""The methods that price passes in seconds as cells (`experiment=moe_methods`): the record names the profile it
used, a cell without one stops naming the command that makes it, and `report.moe_methods` turns the interleaved
records into the table with its goals."""

import json

from hydra import compose, initialize_config_dir

from ecospec import conf_dir
from ecospec.experiment.cell import run_cell
from ecospec.experiment.config import cell_name
from ecospec.experiment.records import RESULT

CONF = conf_dir()
FAST = ["model=tiny_random", "num_prompts=2", "max_new_tokens=12", "threads=1", "progress=false"]


def _cfg(tmp_path, *overrides):
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        cfg = compose("config", overrides=[*FAST, f"out_dir={tmp_path}", *overrides])
    return cfg, tmp_path / "exp" / cell_name(cfg)


def test_a_cost_model_cell_without_a_profile_stops_naming_the_command(tmp_path, monkeypatch):
    monkeypatch.setenv("ECOSPEC_CACHE", str(tmp_path / "cache"))
    cfg, cell_dir = _cfg(tmp_path, "method=evict")
    rec = run_cell(cfg, cell_dir)
    assert rec["status"] == "failed"
    assert "python -m ecospec.bench.profile --model tiny_random --engine eager" in rec["error"]


def test_cells_name_their_profile_and_the_report_checks_the_goals(tmp_path, monkeypatch):
    from ecospec.bench.profile import measure
    from ecospec.report.moe_methods_page import from_frame, page
    from ecospec.report.records import load_records
    from ecospec.report.write import page_markdown

    monkeypatch.setenv("ECOSPEC_CACHE", str(tmp_path / "cache"))
    path = measure("tiny_random", "eager", points=2, layers=2, gammas=(2, 4))
    saved = json.loads(path.read_text())
    for t in (0, 1):
        cfg, cell_dir = _cfg(tmp_path, "method=evict", "interleave=[eagle3,cascade]", f"temperature={t}")
        rec = run_cell(cfg, cell_dir)
        assert rec["status"] == "ok", rec.get("traceback")
        assert rec["profile"] == {"key": path.stem, "hash": saved["hash"]}
        companion = cell_dir.parent / cell_name(_cfg(tmp_path, "method=cascade", f"temperature={t}")[0])
        cascade = json.loads((companion / RESULT).read_text())
        assert cascade["profile"] == rec["profile"] and cascade["summary"]["matches_ar"] == (1.0 if t == 0 else None)
        assert 0 <= cascade["summary"]["speculating"] <= 1 and cascade["summary"]["mean_block"] >= 1
    text = page_markdown(page(from_frame(load_records([tmp_path / "exp"]).frame)))
    assert "## eager engine, T = 0 (2 prompts per benchmark)" in text and "## eager engine, T = 1 (" in text
    methods = [line.strip("|").split("|")[0].strip() for line in text.splitlines() if line.startswith("|")]
    for label in ("EAGLE-3 tree", "EVICT", "Cascade"):
        assert label in methods
    assert f"Profile `{path.stem}` (hash {saved['hash']})" in text
    assert "- Every method token-exact against AR at T = 0 on every prompt: yes" in text
    assert "Upper bound at T = 0" in text
    # a method that decides per prompt decides per sequence in a batch: lossless, on the profile it names
    cfg, cell_dir = _cfg(tmp_path / "batched", "method=cascade", "batch_size=2")
    rec = run_cell(cfg, cell_dir)
    assert rec["status"] == "ok", rec.get("traceback")
    assert rec["profile"]["key"] == path.stem and rec["summary"]["matches_ar"] == 1.0
