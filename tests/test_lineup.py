"""A paper table's methods are those its experiment runs (conf/experiment, `report.lineup.sweep`): the rows are
their roles, and a ratio row reads each role against the table's first in the tables' order."""

from __future__ import annotations

import shutil

import pytest

from ecospec import conf_dir
from ecospec.report import lineup
from ecospec.report.paper_tables import cells01, cells10, table01_main
from ecospec.report.records import records_frame
from ecospec.report.synthetic import synthetic_records

pytestmark = pytest.mark.usefixtures("no_release_traces")


@pytest.mark.parametrize(
    ("experiment", "roles", "pairs"),
    [
        ("table1", ("baseline", "ecospec"), (("ecospec", "baseline"),)),
        ("table4", ("global_cost", "ecospec"), (("ecospec", "global_cost"),)),
        ("table5", ("baseline", "ecospec"), (("ecospec", "baseline"),)),  # gto is the baseline with GTO's head
        ("table9", ("ecospec",), ()),  # the method its defaults pick
        ("table10", ("ecospec", "oracle"), (("oracle", "ecospec"),)),  # the oracle read against EcoSpec
        ("demo", ("baseline", "ecospec"), (("ecospec", "baseline"),)),  # the cell's method and what it interleaves
    ],
)
def test_a_sweep_gives_its_tables_roles_and_pairs(experiment, roles, pairs):
    got = lineup.sweep(experiment)
    assert (got.roles, got.pairs) == (roles, pairs)


def test_method_pairs_name_the_methods_the_experiment_runs():
    assert lineup.sweep("engines").method_pairs == (("ecospec", "eagle3"),)
    assert lineup.sweep("moespec").methods == ("eagle3", "ecospec", "moespec", "ecospec_moespec")
    assert lineup.budgeted() == {"baseline": "moespec", "ecospec": "ecospec_moespec"}


@pytest.fixture(scope="module")
def frame():
    recs = synthetic_records(842, seed=0)
    return records_frame((r, f"mem/{i}/result.json") for i, r in enumerate(recs)).frame


@pytest.fixture
def conf_copy(tmp_path, monkeypatch):
    """A copy of conf/ that `lineup` reads instead of the package's."""
    copy = tmp_path / "conf"
    shutil.copytree(conf_dir(), copy)
    monkeypatch.setattr(lineup, "conf_dir", lambda: copy)
    _forget()
    yield copy
    _forget()


def _forget() -> None:
    """Drop what lineup read of conf/ (it reads each file once)."""
    lineup.sweep.cache_clear()
    lineup.experiment_conf.cache_clear()


def test_a_table_follows_its_experiments_method_list(frame, conf_copy):
    assert set(cells01(frame)["role"]) == {"baseline", "ecospec"}
    path = conf_copy / "experiment" / "table1.yaml"
    path.write_text(path.read_text().replace("method: baseline,ecospec", "method: baseline,ecospec,global_cost"))
    _forget()
    assert set(cells01(frame)["role"]) == {"baseline", "ecospec", "global_cost"}
    table = table01_main(frame)
    ratios = set(table.loc[table["Source"] == "ratio", "Method"])
    assert {"EcoSpec vs EAGLE-3", "Global Cost vs EAGLE-3"} <= ratios, ratios


def test_the_oracle_table_keeps_the_benchmarks_the_oracle_ran(frame):
    cells = cells10(frame)
    oracle = cells[cells["role"] == "oracle"]
    assert len(oracle) and set(cells["role"]) == {"oracle", "ecospec"}
    keys = ["model", "temperature", "dataset"]
    assert set(map(tuple, cells[keys].values)) == set(map(tuple, oracle[keys].values))


def test_an_experiment_without_a_method_is_one_clear_error(conf_copy):
    (conf_copy / "experiment" / "empty.yaml").write_text("name: empty\n")
    with pytest.raises(ValueError, match="conf/experiment/empty.yaml runs no method"):
        lineup.sweep("empty")
