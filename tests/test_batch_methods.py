"""`experiment=batch_methods`: the methods against batch size. The preset sweeps what the issue names, and its
cells (every method at B > 1, AR interleaved batch by batch) become the report page: speedup and TPOT by batch
size, where each method stops paying, the goals, and the figure."""

import json

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from ecospec import conf_dir
from ecospec.experiment.cell import run_cell
from ecospec.experiment.config import cell_name

CONF = conf_dir()
FAST = ["model=tiny_random", "num_prompts=4", "max_new_tokens=8", "threads=1", "progress=false"]


def _cfg(tmp_path, *overrides):
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        cfg = compose("config", overrides=[*FAST, f"out_dir={tmp_path}", *overrides])
    return cfg, tmp_path / "exp" / cell_name(cfg)


def test_the_preset_sweeps_every_method_at_every_batch_size():
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        cfg = compose("config", overrides=["experiment=batch_methods"], return_hydra_config=True)
    from hydra_plugins.ecospec_grid_sweeper import GridSweeper

    jobs = GridSweeper(grids=OmegaConf.to_container(cfg.hydra.sweeper.grids)).jobs([])
    jobs = [_parse(j) for j in jobs]
    cells = {(j["method"], j.get("engine", "vllm"), j["temperature"], int(j["batch_size"])) for j in jobs}
    methods = {"eagle3", "eagle3_chain", "ecospec", "evict", "cascade", "ecospec_adaptive", "adaptive_verify"}
    sizes = (1, 2, 4, 8, 16, 32)
    assert {(m, "eager", t, b) for m in methods for t in ("0", "1") for b in sizes} <= cells
    assert {(m, "compiled", t, b) for m in methods for t in ("0", "1") for b in sizes} <= cells
    assert {("eagle3", "vllm", t, b) for t in ("0", "1") for b in sizes} <= cells  # vLLM-CPU's chain
    assert all(j.get("backend") == "vllm" for j in jobs if "engine" not in j)
    assert len(cells) == len(jobs) == 7 * 2 * 6 * 2 + 2 * 6
    assert cfg.dataset.members == ["gsm8k", "humaneval", "math500", "mtbench"]
    assert cfg.num_prompts >= max(sizes) and cfg.dataset.instances >= cfg.num_prompts


def _parse(job):
    return dict(x.split("=", 1) for x in job)


def test_cells_become_the_page_with_its_goals_and_figure(tmp_path, monkeypatch):
    from ecospec.bench.profile import measure
    from ecospec.report import build
    from ecospec.report.batch_methods import main

    monkeypatch.setenv("ECOSPEC_CACHE", str(tmp_path / "cache"))
    path = measure("tiny_random", "eager", points=2, layers=2, gammas=(2, 4))
    assert json.loads(path.read_text())["profile"]["verify_by_batch"] is None  # tiny_random: no real decodes
    for method in ("eagle3", "evict", "adaptive_verify"):
        for b in (1, 3):
            cfg, cell_dir = _cfg(tmp_path, f"method={method}", f"batch_size={b}", "dataset=humaneval")
            rec = run_cell(cfg, cell_dir)
            assert rec["status"] == "ok", rec.get("traceback")
            assert rec["summary"]["matches_ar"] == 1.0
    out = tmp_path / "report"
    assert main(["--records", str(tmp_path / "exp"), "--out", str(out)]) == 0
    text = (out / "batch_methods.md").read_text()
    assert "## eager engine, T = 0 (4 prompts, 8 tokens each)" in text
    rows = {line.strip("|").split("|")[0].strip(): line for line in text.splitlines() if line.startswith("|")}
    for label in ("EAGLE-3 tree", "EVICT", "Adaptive verify", "AR"):
        assert label in rows
    assert (
        "stops paying" in text
        and "- eager, T = 0: every method token-exact against AR at every batch size: yes" in text
    )
    ar_tpot = rows["AR"].strip("|").split("|")[1:3]  # our TPOT, vLLM's measure: every cell has one
    assert all(float(x) > 0 for x in ar_tpot), rows["AR"]
    figure = out / "figures" / "fig_batch_methods_eager_T0.png"
    assert figure.exists() and "| B = 1 " in text and "| B = 3 " in text
    # `make tables` writes the same page and figure, indexes them, and keeps the batch cells off moe_methods.md
    tables = tmp_path / "tables"
    written = {p.relative_to(tables).as_posix() for p in build([tmp_path / "exp"], tables)}
    assert {"batch_methods.md", "figures/fig_batch_methods_eager_T0.png"} <= written
    assert "moe_methods.md" not in written and "batch_methods.md" in (tables / "README.md").read_text()
    assert (tables / "batch_methods.md").read_text() == text


def test_a_method_stops_paying_at_the_first_batch_size_below_one():
    """Below 1 means the interval's top below 1; a cell without an interval goes by its estimate."""
    import pandas as pd

    from ecospec.report.batch_methods_page import stops_paying

    within = {"speedup": {"low": 0.9, "high": 1.05}}
    below = {"speedup": {"low": 0.9, "high": 0.99}}
    g = pd.DataFrame({"batch_size": [4, 1, 2], "speedup": [0.8, 1.3, 0.98], "intervals": [None, None, within]})
    assert stops_paying(g) == 4
    assert stops_paying(g.assign(intervals=[None, None, below])) == 2
    assert stops_paying(g.assign(speedup=[1.01, 1.3, 0.98])) is None


def test_tpot_leaves_out_the_prefill_and_the_first_token_as_vllm_does():
    """A sequence alone: its decode time over its tokens after the first; in a batch, every row waits for the
    batch's passes, so each counts the batch's decode time over the longest output; the mean is over sequences."""
    from ecospec.experiment.metrics import tpot

    alone = [
        {"seconds": 1.1, "cpu_seconds": 0.9, "t_prefill_s": 0.1, "t_prefill_cpu_s": 0.05, "n_tokens": 11},
        {"seconds": 2.0, "cpu_seconds": 2.0, "t_prefill_s": 0.0, "t_prefill_cpu_s": 0.0, "n_tokens": 5},
    ]
    assert tpot(alone) == pytest.approx((1.0 / 10 + 2.0 / 4) / 2)
    assert tpot(alone, clock="thread_cpu") == pytest.approx((0.85 / 10 + 2.0 / 4) / 2)
    batches = [
        {"sequences": 3, "longest": 9, "seconds": 1.0, "t_prefill_s": 0.2, "t_prefill_cpu_s": 0.2},
        {"sequences": 1, "longest": 5, "seconds": 0.5, "t_prefill_s": 0.1, "t_prefill_cpu_s": 0.1},
    ]
    assert tpot([], batches) == pytest.approx((3 * 0.8 / 8 + 0.4 / 4) / 4)
    assert tpot([{k: v for k, v in alone[0].items() if k != "t_prefill_cpu_s"}], clock="thread_cpu") is None


def test_one_sequence_keeps_its_prefill_time():
    """generate() is the batch loop on one sequence: its result carries the prefill's times, which the cell's rows
    and TPOT subtract (a result without them counted the prefill as decoding)."""
    import torch

    import ecospec
    from ecospec.models import tiny_model

    target = tiny_model("qwen3_moe-a", seed=0, dtype=torch.float32)
    ids = torch.randint(3, target.config.vocab_size, (1, 40), generator=torch.Generator().manual_seed(1))
    res = ecospec.generate(target, ids, max_new_tokens=4, eos_token_id=[])
    assert res.t_prefill > 0 and res.t_prefill_cpu > 0


def test_the_compiled_engine_is_held_to_vllm_cpu_at_batch_8():
    import pandas as pd

    from ecospec.report.batch_methods_page import _against_vllm
    from ecospec.report.lineup import lineup

    entries = lineup(pd.DataFrame({"method": ["eagle3_chain"], "selector": ["chain"], "drafter": ["eagle3"]}))
    facts = {
        ("compiled", 0.0): {"tpot": {"ar": {8: 3.0}, "eagle3_chain": {8: 5.0}}, "entries": entries},
        ("vllm", 0.0): {"tpot": {"ar": {8: 13.7}, "eagle3_chain": {8: 4.0}}},
    }
    (line,) = _against_vllm(facts)
    assert "AR 3.00 ms against 13.70 ms (yes)" in line and "the chain 5.00 ms against 4.00 ms (no)" in line
    assert _against_vllm({("compiled", 0.0): facts[("compiled", 0.0)]}) == []
