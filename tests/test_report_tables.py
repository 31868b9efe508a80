"""`make tables` (ecospec.report): table shapes and averages on synthetic records, "—" for missing cells, the
paper's values beside ours, unreadable files skipped with a warning naming them, the index, LaTeX and CSV."""

from __future__ import annotations

import copy
import json
import warnings

import numpy as np
import pandas as pd
import pytest

from ecospec.analysis.model_config import load_model_config
from ecospec.report import build
from ecospec.report.paper import paper_values
from ecospec.report.paper_tables import (
    table01_main,
    table02_hbm,
    table03_latency,
    table06_07_batch,
    table11_12_gamma,
)
from ecospec.report.records import conf_defaults, load_records, model_costs, records_frame
from ecospec.report.synthetic import synthetic_records
from ecospec.report.tables import SPECS, build_tables
from ecospec.report.write import Table, display, to_latex, to_markdown, write_table

pytestmark = pytest.mark.usefixtures("no_release_traces")  # conftest: no tracing of the release

TINY_GAMMA = load_model_config("tiny")["gamma"]  # the tables hold each model at its own gamma
BENCH = ["GSM8K", "HumanEval", "AIME25", "MATH500", "AMC22-24", "MT-Bench", "MMStar", "Avg"]


@pytest.fixture(scope="module")
def recs() -> list[dict]:
    """Two rounds of the synthetic grid (842 cells): every cell has an ok record (failures never hit both)."""
    return synthetic_records(1700, seed=0)


@pytest.fixture(scope="module")
def loaded(recs):
    return records_frame((r, f"mem/{i}/result.json") for i, r in enumerate(recs))


@pytest.fixture(scope="module")
def frame(loaded) -> pd.DataFrame:
    return loaded.frame


@pytest.fixture(scope="module")
def defaults(loaded) -> dict:
    return conf_defaults(loaded.model_configs)


@pytest.fixture(scope="module")
def costs(loaded) -> dict:
    return model_costs(loaded.model_configs)


def _table(frame: pd.DataFrame, name: str) -> Table:
    return Table(name, "Table", "title", "note", frame, combine=name not in ("t2", "t3"), used=frame)


def _ours(table: pd.DataFrame, model: str, method: str, **labels) -> pd.Series:
    rows = table[(table["Model"] == model) & (table["Method"] == method) & (table["Source"] == "ours")]
    for k, v in labels.items():
        rows = rows[rows[k] == v]
    assert len(rows) == 1, rows
    return rows.iloc[0]


def _record(recs, **want) -> dict:
    """A deep copy of the first ok synthetic record whose config matches `want` (model, method, dataset, ...)."""
    for r in recs:
        c = r["config"]
        have = {
            "model": c["model"]["name"],
            "method": c["method"]["name"],
            "dataset": c["dataset"]["name"],
            "temperature": c["temperature"],
            "gamma": c["gamma"],
            "batch_size": c["batch_size"],
        }
        if r["status"] == "ok" and all(have.get(k, c.get(k)) == v for k, v in want.items()):
            return copy.deepcopy(r)
    raise LookupError(want)


def test_frame_has_the_agreed_columns(frame):
    assert list(frame.columns[:6]) == ["experiment", "cell", "cell_id", "path", "status", "finished"]
    assert {"drafter", "drafter_path", "predictor_checkpoint", "E", "expert_load", "hbm_bytes_per_verify"} <= set(
        frame.columns
    )
    assert (frame["status"] == "failed").sum() == 34 and frame.loc[frame["status"] == "failed", "alpha"].isna().all()
    ok = frame[frame["status"] == "ok"]
    assert ok["expert_load"].map(lambda a: a.shape == (a.shape[0], a.shape[1])).all()
    assert set(ok["drafter"].dropna()) == {"eagle3", "mtp"}  # `default` resolved to the model's drafter
    assert set(ok["predictor_checkpoint"].dropna()) == {"final", "acc50", "acc60"}


def test_table_shapes(frame, defaults):
    t1 = table01_main(frame, defaults)
    # 4 models x T 0/1 x (baseline, EcoSpec) ours rows; paper rows for the 3 paper models
    assert (t1["Source"] == "ours").sum() == 16 and (t1["Source"] == "paper").sum() == 12
    # one ratio row per model and T: EcoSpec against the baseline; these records hold no per-prompt rows
    ratios = t1[t1["Source"] == "ratio"]
    assert len(ratios) == 8 and set(ratios["Pairing"]) == {"no interval (records without per-prompt rows)"}
    assert list(t1.columns) == ["Model", "T", "Method", "Source", "Benchmarks", "Pairing"] + [
        f"{b} {m}" for b in BENCH for m in ("speedup", "alpha", "E")
    ]  # no bound columns: no record has an interval
    assert list(t1["Method"].iloc[:4]) == ["EAGLE-3", "EAGLE-3", "EcoSpec", "EcoSpec"]
    assert set(t1.loc[t1["Model"] == "DeepSeek-V3.1", "Method"]) == {"MTP", "EcoSpec", "EcoSpec vs MTP"}
    t3 = table03_latency(frame, defaults)
    assert (t3["Source"] == "ours").sum() == 12 and (t3["Source"] == "paper").sum() == 9
    t11 = table11_12_gamma(frame, defaults)
    assert (t11["Source"] == "ours").sum() == 4 * 2 * 4  # models x methods x γ (the γ sweep is at T=0)
    assert sorted(set(t11["γ"])) == [3, 4, 5, 6]
    t6 = table06_07_batch(frame, defaults)
    assert [c for c in t6.columns if c.endswith(" speedup")] == [f"B={b} speedup" for b in (1, 2, 4, 8)]
    assert (t6["Source"] == "ours").sum() == 8 and (t6["Source"] == "paper").sum() == 4


def test_every_table_builds(frame, defaults, costs):
    tables, missing = build_tables(frame, defaults, costs)
    assert missing == []
    assert [t.name for t in tables] == [s.name for s in SPECS] + ["table13_models", "modeled", "moespec"]
    modeled = tables[-2]
    assert "*modeled*" in modeled.title and "B200: none" in modeled.note
    assert {"H100 speedup", "H200 t_verify_ms", "B200 t_step_ms"} <= set(modeled.frame.columns)


def test_a_gto_head_at_the_default_path_is_table_5s_only(recs):
    """The tiny model's GTO head has no path (the build's), like its EAGLE-3 head: its records still belong to Table 5
    alone, never to Table 9's (or Table 1's) EcoSpec cells."""
    from ecospec.report.paper_tables import cells09, table05_drafters

    base = next(
        r
        for r in recs
        if r["experiment"] == "table9"
        and r["config"]["model"]["name"] == "tiny"
        and r["status"] == "ok"
        and r["config"]["model"]["predictor"]["checkpoint"] == "final"
    )
    gto = copy.deepcopy(base)
    gto["config"]["method"] = {"name": "gto_ecospec", "drafter": "gto", "selector": "ecospec", "predictor": "learned"}
    gto["config"]["model"]["drafters"]["gto"] = {"path": None, "layout": "eagle"}
    gto["finished"] = "2027-01-01T00:00:00+00:00"  # newest: picked if it were a candidate
    gto["summary"]["alpha"] = 9.0
    frame = records_frame((r, f"mem/{i}/result.json") for i, r in enumerate([*recs, gto])).frame
    assert 9.0 not in set(cells09(frame)["alpha"]) and 9.0 not in set(table01_main(frame)["GSM8K alpha"].dropna())
    t5 = table05_drafters(frame)
    assert (t5.loc[t5["Method"] == "GTO + EcoSpec", "GSM8K alpha"] == 9.0).any()


def test_moespec_table_sets_budgets_beside_the_lossless_methods(frame, defaults, costs, tmp_path):
    """Budgeted cells (MoE-Spec, lossy) are the MoE-Spec table's only: never in Tables 1 or 9; their rows sit beside
    the model's unbudgeted EAGLE-3 and EcoSpec on the same benchmarks, with E <= B and the modeled GPU speedups."""
    from ecospec.report.moespec import table_moespec
    from ecospec.report.paper_tables import cells09
    from ecospec.report.pareto import write_pareto_figures

    assert not set(table01_main(frame, defaults)["Method"]) & {"MoE-Spec", "EcoSpec + MoE-Spec"}
    assert cells09(frame, defaults)["expert_budget"].isna().all()
    t = table_moespec(frame, costs, None, defaults)
    assert list(t.columns[:5]) == ["Model", "T", "Method", "Budget", "Source"]
    assert set(t["Model"]) == {"Qwen3-235B-A22B", "tiny"}
    qwen = t[t["Model"] == "Qwen3-235B-A22B"]
    assert list(qwen["Method"][:2]) == ["EAGLE-3", "EcoSpec"] and set(qwen["Budget"][:2]) == {"—"}
    capped = qwen[qwen["Budget"] != "—"]
    assert set(capped["Budget"]) == {"B=16", "B=32", "B=64"} and len(capped) == 6
    assert (capped["E"] <= capped["Budget"].str[2:].astype(float) + 1e-9).all()
    assert (qwen.loc[qwen["Budget"] == "—", "budget_error_rate"] == 0).all()
    tight = capped[capped["Budget"] == "B=16"]
    assert (tight["budget_error_rate"] > 0).all() and (tight["matches_ar"] < 1).all()
    assert {"modeled H100 speedup", "modeled H200 speedup", "modeled B200 speedup"} <= set(t.columns)
    # the figure: one per model with budgeted greedy rows; a later build without them removes its files
    infos = write_pareto_figures(t, None, tmp_path)
    assert [i.name for i in infos] == ["fig_moespec_pareto_Qwen3-235B-A22B", "fig_moespec_pareto_tiny"]
    assert all(p.exists() and p.stat().st_size > 0 for i in infos for p in i.files)
    assert write_pareto_figures(t[t["Budget"] == "—"], None, tmp_path) == [] and not list(tmp_path.glob("fig_*"))


def test_average_is_the_mean_over_the_benchmarks_present(recs):
    speedups = {"gsm8k": 1.0, "humaneval": 2.0, "mtbench": 1.5}
    chosen = []
    for ds, spd in speedups.items():
        r = _record(recs, model="tiny", method="baseline", dataset=ds, temperature=0.0, gamma=TINY_GAMMA, batch_size=1)
        r["summary"].update(speedup=spd, alpha=spd + 1, experts_per_layer=10 * spd)
        chosen.append(r)
    stale = copy.deepcopy(chosen[0])  # an older rerun of the GSM8K cell: the newest record wins
    stale["finished"] = "2020-01-01T00:00:00+00:00"
    stale["summary"]["speedup"] = 9.0
    loaded = records_frame((r, f"mem/{i}") for i, r in enumerate([stale, *chosen]))
    t1 = table01_main(loaded.frame)
    row = _ours(t1, "tiny", "EAGLE-3")
    assert row["GSM8K speedup"] == 1.0
    assert row["Avg speedup"] == pytest.approx(1.5)  # (1.0 + 2.0 + 1.5) / 3
    assert row["Avg alpha"] == pytest.approx(2.5) and row["Avg E"] == pytest.approx(15.0)
    assert list(t1["Benchmarks"]) == ["GSM8K, HumanEval, MT-Bench"]  # what the Avg averages
    assert list(t1.columns[5:]) == [
        f"{b} {m}" for b in ("GSM8K", "HumanEval", "MT-Bench", "Avg") for m in ("speedup", "alpha", "E")
    ]
    assert (t1["Source"] == "paper").sum() == 0  # the tiny model is not in the paper


def test_missing_cells_show_a_dash(recs):
    r = _record(recs, model="qwen3", method="ecospec", dataset="gsm8k", temperature=0.0, gamma=4, batch_size=1)
    t1 = table01_main(records_frame([(r, "mem/0")]).frame)
    shown = display(_table(t1, "t1"))
    ours, paper = shown.iloc[0], shown.iloc[1]
    assert list(shown["Source"]) == ["ours", "paper"]
    assert list(shown.columns) == ["Model", "T", "Method", "Source", "Benchmarks", "GSM8K", "MT-Bench", "Avg"]
    assert ours["MT-Bench"] == "— / — / —"  # the paper states MT-Bench; we have no record for it
    assert paper["MT-Bench"] == "1.62× / — / —" and paper["GSM8K"] == "— / — / —"
    assert paper["Avg"] == "1.36× / — / 20.5"
    assert paper["Model"] == "" and paper["Method"] == ""  # repeated labels are left blank
    assert "— / — / —" in to_markdown(_table(t1, "t1"))


def test_paper_values_beside_ours_tables_2_and_3(frame, defaults):
    t3 = table03_latency(frame, defaults)
    paper = paper_values(3)
    for i in np.flatnonzero(t3["Source"] == "paper"):
        assert t3["Source"].iloc[i - 1] == "ours" and t3["Method"].iloc[i] == t3["Method"].iloc[i - 1]
    eco = t3[(t3["Model"] == "Qwen3-235B-A22B") & (t3["Method"] == "EcoSpec")]
    assert list(eco["Source"]) == ["ours", "paper"]
    assert eco.iloc[1]["t_verify_s"] == 0.730 and eco.iloc[1]["t_pred_s"] == 0.004 and eco.iloc[1]["speedup"] == 1.36
    assert t3.loc[t3["Source"] == "paper", ["E", "t_step_s", "alpha", "speedup"]].notna().all().all()
    assert (t3["Source"] == "paper").sum() == paper["row_label"].nunique()  # every row of the paper's Table 3
    assert eco.iloc[0]["E"] == pytest.approx(
        frame.query(
            "status == 'ok' and model == 'qwen3' and method == 'ecospec' and temperature == 0 and gamma == 4"
            " and batch_size == 1"
            " and predictor_checkpoint == 'final' and drafter_path.str.startswith('RedHat')"
        )
        .sort_values("finished")
        .drop_duplicates("dataset", keep="last")["E"]
        .mean()
    )
    md = to_markdown(_table(t3, "t3"))
    assert "| paper" in md and "0.73" in md
    t2 = table02_hbm(frame, defaults)
    row = t2[(t2["Model"] == "Qwen3-235B-A22B") & (t2["Method"] == "EAGLE-3")]
    assert list(row["Source"]) == ["ours", "paper"] and row.iloc[1]["hbm_gb"] == 99.3
    assert row.iloc[0]["hbm_gb"] == pytest.approx(100, rel=0.1)


def test_latex_booktabs_and_csv_round_trip(frame, defaults, costs, tmp_path):
    tables, _ = build_tables(frame, defaults, costs)
    assert len(tables) == len(SPECS) + 3  # + Table 13, modeled, MoE-Spec
    for t in tables:
        tex = to_latex(t)
        assert "\\toprule" in tex and "\\midrule" in tex and "\\bottomrule" in tex and "—" not in tex
        md, tex_path, csv = write_table(t, tmp_path)
        assert md.read_text().startswith(f"### {t.label}. ")
        back = pd.read_csv(csv)
        pd.testing.assert_frame_equal(back, t.frame.reset_index(drop=True), check_dtype=False)


def _write(root, rec, name=None) -> str:
    cell = root / rec["experiment"] / (name or rec["cell"])
    cell.mkdir(parents=True, exist_ok=True)
    (cell / "result.json").write_text(json.dumps(rec, indent=1))
    return str(cell / "result.json")


def test_bad_files_are_skipped_with_a_warning_and_the_report_builds(recs, tmp_path):
    root, out = tmp_path / "experiments", tmp_path / "reports"
    tiny = [r for r in recs[:818] if r["config"]["model"]["name"] == "tiny"]
    for r in tiny:
        _write(root, r)
    good = json.dumps(tiny[0], indent=1)
    corrupt = root / "junk" / "a" / "result.json"
    corrupt.parent.mkdir(parents=True)
    corrupt.write_bytes(b"\x00\xff not json")
    truncated = root / "junk" / "b" / "result.json"
    truncated.parent.mkdir(parents=True)
    truncated.write_text(good[: len(good) // 2])
    partial = copy.deepcopy(tiny[0])
    del partial["summary"]
    partial_path = _write(root, partial, "partial")
    out.mkdir()  # a benchmark script's output already there is indexed with its command; a file no list names too
    (out / "calibration.md").write_text("\n### Calibration of the head\n\nmade by benchmarks/studies/calibration.py\n")
    (out / "table99_old.md").write_text("### Table 99\n")
    (out / "table99_old.tex").write_text("")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        written = build([root], out)
    messages = "\n".join(str(w.message) for w in caught)
    for path in (corrupt, truncated, partial_path):
        assert "skipping" in messages and str(path) in messages
    names = {p.name for p in written}
    for s in SPECS[:5]:
        assert {f"{s.name}.md", f"{s.name}.tex", f"{s.name}.csv"} <= names
    assert {"table13_models.md", "modeled.md", "README.md"} <= names
    index = (out / "README.md").read_text()
    for p in written:
        if p.suffix == ".md" and p.name != "README.md":
            assert f"]({p.name})" in index
    assert "Table 1. Main results" in index and "Table 13. Model architectures" in index
    assert "table1 (" in index and f"{len(tiny)} records" in index and str(truncated) in index
    assert "CPU wall clock" in (out / "table01_main.md").read_text()
    assert "[md](calibration.md); `python benchmarks/studies/calibration.py --out DIR`" in index
    assert "- `table99_old`, on no list of `report/outputs.py`: [md](table99_old.md) [tex](table99_old.tex)" in index


def test_since_keeps_the_newer_records(recs, tmp_path):
    for r in recs[:40]:
        _write(tmp_path, r)
    cut = recs[30]["finished"]
    assert len(load_records([tmp_path], since=cut).frame) == 10
    assert len(load_records([tmp_path]).frame) == 40


def test_captions_name_the_clock_the_records_divided_by(frame):
    from ecospec.report.frame import clock

    cpu = frame[(frame["status"] == "ok") & frame["device"].fillna("").str.startswith("cpu")].head(4).copy()
    assert "CPU wall clock" in clock(cpu)  # records from before the clock knob: wall time
    cpu["clock"] = "thread_cpu"
    assert "the decoding thread's CPU time" in clock(cpu) and "wall" not in clock(cpu)
    cpu.iloc[0, cpu.columns.get_loc("clock")] = "wall"
    assert "CPU wall clock and the decoding thread's CPU time" in clock(cpu)


def test_ratio_cells_print_as_changes_marked_within_noise():
    from ecospec.report.compare import change

    assert change(1.04, 0.98, 1.09) == "+4 % [\u22122, +9] ≈"  # the interval holds no change: within noise
    assert change(0.9, 0.85, 0.95) == "\u221210 % [\u221215, \u22125]"
    assert change(1.04) == "+4 %"  # a record without per-prompt rows: the point ratio alone


def test_compiled_cells_get_their_own_table_not_the_papers(recs, tmp_path):
    """A compiled cell is a row of the engines table (report.engines), never a cell of the paper's tables, which
    measure the eager regime; its frame row says its engine."""
    from ecospec.report.engines_page import from_frame, page
    from ecospec.report.write import page_markdown

    pair = [
        _record(recs, model="qwen3", method=m, dataset="gsm8k", temperature=0.0, batch_size=1)
        for m in ("ecospec", "eagle3")
    ]
    for r in pair:
        r["experiment"] = "engines"  # one run, both engines (experiment=engines)
    compiled = copy.deepcopy(pair)
    for r in compiled:
        r["config"]["engine"] = "compiled"
        r["cell_id"] += "-compiled"
        r["summary"]["speedup"] = 0.5  # what no eager cell reads: it must stay out of Table 1
    other = copy.deepcopy(pair[0])  # the same cell in another experiment (make tables reads them all)
    other.update(experiment="tiny_repro", cell_id=other["cell_id"] + "-other")
    other["summary"]["speedup"] = 9.99
    frame = records_frame((r, f"mem/{i}/result.json") for i, r in enumerate(pair + compiled)).frame
    assert list(frame["engine"]) == ["eager", "eager", "compiled", "compiled"]
    text = page_markdown(page(from_frame(frame)))
    rows = [[c.strip() for c in line.strip("|").split("|")] for line in text.splitlines() if line.startswith("|")]
    assert ["compiled", "EcoSpec"] in [r[:2] for r in rows] and ["eager", "EcoSpec vs EAGLE-3"] in [r[:2] for r in rows]
    assert next(r for r in rows if r[:2] == ["compiled", "EcoSpec"])[2].startswith("0.50×")
    mixed = records_frame((r, f"mem/{i}/result.json") for i, r in enumerate([other, *pair, *compiled])).frame
    assert page_markdown(page(from_frame(mixed))) == text  # one run's engines: the other experiment's cell stays out
    for i, r in enumerate(pair + compiled):
        d = tmp_path / "records" / f"cell{i}"
        d.mkdir(parents=True)
        (d / "result.json").write_text(json.dumps(r))
    build([tmp_path / "records"], tmp_path / "out")
    assert "compiled | EAGLE-3" in (tmp_path / "out" / "engines.md").read_text()
    assert "0.50×" not in (tmp_path / "out" / "table01_main.md").read_text()
