"""The grid runner: config composition and validation, result records, resume/skip, failure isolation, and
cells end to end through run.py (on the random-init tiny model, so no trained models are needed)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from ecospec import conf_dir
from ecospec.experiment.cell import run_cell
from ecospec.experiment.config import ConfigError, cell_name, validate
from ecospec.experiment.records import PROGRESS, RESULT, Progress, load_record, read_record, write_json_atomic
from ecospec.identity import CELL_KEYS, cell_id
from ecospec.report import build as report_build
from ecospec.report.demo import build, reading
from ecospec.tiny.build import recipe_identity

ROOT = Path(__file__).resolve().parents[1]
CONF = conf_dir()
EXPERIMENTS = sorted(p.stem for p in (CONF / "experiment").glob("*.yaml"))
MODELS = sorted(p.stem for p in (CONF / "model").glob("*.yaml"))
METHODS = sorted(p.stem for p in (CONF / "method").glob("*.yaml"))
FAST = ["model=tiny_random", "num_prompts=2", "max_new_tokens=8", "threads=1", "progress=false"]


def _compose(*overrides: str, hydra: bool = False):
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        return compose("config", overrides=list(overrides), return_hydra_config=hydra)


def test_presets_and_groups_are_the_ones_the_issue_names():
    assert EXPERIMENTS == [
        "batch_methods",
        "demo",
        "engines",
        "fig1a",
        "gamma_protocol",
        "gto",
        "moe_methods",
        "moespec",
        "moespec_deepseek",
        "moespec_gptoss",
        "moespec_qwen3",
        "overlap_e2e",
        "overlap_e2e_tiny",
        "predictor",
        "table1",
        "table10",
        "table11_12",
        "table4",
        "table5",
        "table6_7",
        "table8",
        "table9",
        "tiny_repro",
        "traces",
    ]
    assert {"tiny", "tiny_random", "qwen3", "gptoss", "deepseek", "qwen3_30b", "mixtral"} <= set(MODELS)
    assert {"ar", "eagle3", "mtp", "ecospec", "global_cost", "oracle"} <= set(METHODS)


def test_defaults_are_the_paper_setting_on_the_tiny_model():
    cfg = _compose()
    assert (cfg.model.name, cfg.method.name, cfg.dataset.name) == ("tiny", "ecospec", "humaneval")
    assert (cfg.depth, cfg.topk, cfg.batch_size, cfg.temperature) == (3, 2, 1, 0.0)
    assert cfg.gamma == cfg.model.gamma  # the model's own (the paper's protocol chose it)
    assert cfg.logger.name == "none"
    validate(cfg)


@pytest.mark.parametrize("experiment", EXPERIMENTS)
def test_every_experiment_preset_composes(experiment):
    cfg = _compose(f"experiment={experiment}", hydra=True)
    assert cfg.name == experiment
    sweeper = cfg.hydra.sweeper
    grids = [sweeper.params] if "params" in sweeper and sweeper.params else list(sweeper.grids)
    assert all(len(g) for g in grids) and (
        grids or cfg.job in ("predictor", "gto", "fig1a") or "demo" in cfg
    )  # one job per model; the demo: one cell
    swept = {  # every swept value, once: grids of one preset repeat most of theirs
        (key, v)
        for grid in grids
        for key, values in grid.items()
        for v in ([values] if str(values).startswith("[") else str(values).split(","))  # a list is one value
    }
    for key, v in sorted(swept, key=str):
        _compose(f"experiment={experiment}", f"{key}={v}")


@pytest.mark.parametrize("model", MODELS)
@pytest.mark.parametrize("method", METHODS)
def test_every_model_method_pair_composes_and_validates_or_says_why(model, method):
    budget = ["expert_budget=8"] if method in ("moespec", "ecospec_moespec") else []  # the budgeted methods need one
    cfg = _compose(f"model={model}", f"method={method}", *budget)
    try:
        validate(cfg)
    except ConfigError as e:
        msg = str(e)
        assert "\n" not in msg and ("=" in msg)
        # the only refusals: a drafter the model lacks, or a predictor checkpoint that is not set
        assert (
            ("needs a" in msg and "drafter" in msg)
            or "needs a trained expert predictor" in msg
            or "needs a GTO-trained EAGLE-3 head" in msg
            or "runs on backend=vllm only" in msg
        ), msg
    else:
        assert not (model == "deepseek" and method == "eagle3")


@pytest.mark.parametrize("method", METHODS)
def test_backend_vllm_takes_what_vllm_runs_and_refuses_the_rest_in_one_line(method):
    from ecospec.experiment.config import VLLM_METHODS
    from ecospec.identity import cell_config

    budget = ["expert_budget=8"] if method in ("moespec", "ecospec_moespec") else []
    cfg = _compose("model=qwen3_30b", "backend=vllm", f"method={method}", *budget)
    if method not in VLLM_METHODS:
        with pytest.raises(ConfigError, match="vLLM cannot run it") as e:
            validate(cfg)
        assert "\n" not in str(e.value)
        return
    try:
        validate(cfg)
    except ConfigError as e:
        assert "needs a" in str(e) and "drafter" in str(e), e  # qwen3_30b has no MTP module, no draft LM
    else:
        c = cell_config(cfg)
        assert c["backend"] == {
            "name": "vllm",
            "dtype": None,
            "tp": None,
            "max_model_len": 2048,
            "enforce_eager": False,
            "requests": None,
            "requests_per_seq": None,
        }
        assert "-vllm-" in cell_name(cfg)
    for bad, key in (
        ("backend.rounds=0", "backend.rounds"),
        ("trace_steps=4", "trace_steps"),
        ("backend.name=sglang", "backend"),
        ("backend.routed_experts=true device=cpu", "backend.routed_experts"),  # vLLM's CPU runner returns none
    ):
        with pytest.raises(ConfigError, match=key):
            validate(_compose("model=qwen3_30b", "backend=vllm", "method=eagle3", *bad.split()))


@pytest.mark.parametrize(
    "override, key",
    [
        ("gamma=1", "gamma=1"),
        ("depth=0", "depth=0"),
        ("topk=0", "topk=0"),
        ("temperature=-0.5", "temperature=-0.5"),
        ("batch_size=0", "batch_size=0"),
        ("batch_buffer=global", "batch_buffer='global'"),
        ("top_p=0", "top_p=0"),
        ("num_prompts=0", "num_prompts=0"),
        ("gamma=abc", "gamma='abc'"),
        ("dataset.name=squad", "dataset.name='squad'"),
        ("ar_peer=vllm", "ar_peer='vllm'"),
    ],
)
def test_bad_values_get_one_line_naming_key_and_value(override, key):
    cfg = _compose("model=tiny_random", override)
    with pytest.raises(ConfigError) as e:
        validate(cfg)
    assert str(e.value).startswith(key) and "\n" not in str(e.value)


def test_unknown_combinations_are_refused_before_loading():
    with pytest.raises(ConfigError, match="method=mtp needs a mtp drafter, but model=qwen3 has none"):
        validate(_compose("model=qwen3", "method=mtp"))
    with pytest.raises(ConfigError, match="model.predictor.checkpoint='final': method=ecospec needs a trained"):
        validate(_compose("model=gptoss", "method=ecospec"))
    validate(_compose("model=gptoss", "method=ecospec", "model.predictor.checkpoints.final=/some/dir"))
    validate(_compose("model=deepseek", "method=baseline"))  # MTP is DeepSeek's baseline drafter


def test_cell_identity_ignores_execution_knobs():
    a = _compose(*FAST)
    assert cell_id(a) == cell_id(_compose(*FAST, "force=true", "device=cpu", "logger=wandb", "name=other"))
    for change in ("gamma=5", "seed=1", "temperature=1.0", "model.predictor.checkpoint=acc50", "dataset=gsm8k"):
        assert cell_id(_compose(*FAST, change)) != cell_id(a), change
    # the expert buffer of a batch identifies a cell only where it changes something: at batch_size > 1
    assert cell_id(_compose(*FAST, "batch_buffer=batch")) == cell_id(a)
    b4 = _compose(*FAST, "batch_size=4")
    assert cell_id(b4) != cell_id(a) and cell_id(_compose(*FAST, "batch_size=4", "batch_buffer=sequence")) == cell_id(
        b4
    )
    assert cell_id(_compose(*FAST, "batch_size=4", "batch_buffer=batch")) != cell_id(b4)
    assert cell_name(a).startswith("tiny_random-ecospec-humaneval-T0-g4-d3-k2-b1-s0-")
    # a drafter the cell does not use (here a new one added to the model config) does not rename it
    assert cell_id(_compose(*FAST, "+model.drafters.other={path: /x}")) == cell_id(a)
    assert cell_id(_compose(*FAST, "model.drafters.draft_model.path=/x")) != cell_id(a)  # the one it uses does
    assert set(CELL_KEYS) >= {"model", "method", "dataset", "temperature", "gamma", "batch_size", "seed"}
    # the engine: hf keeps every id it had; vllm is another cell, and so is each server setting, not how it is run
    assert cell_id(_compose(*FAST, "backend=hf")) == cell_id(a)
    v = _compose(*FAST, "backend=vllm")
    assert cell_id(v) != cell_id(a)
    for run_setting in ("backend.python=/x/python", "backend.url=http://h:1", "backend.rounds=5", "backend.warmups=0"):
        assert cell_id(_compose(*FAST, "backend=vllm", run_setting)) == cell_id(v), run_setting
    for setting in (
        "backend.tp=2",
        "backend.dtype=bfloat16",
        "backend.enforce_eager=true",
        "backend.max_model_len=4096",
        "backend.routed_experts=true",  # the record holds vLLM's routes too; false keeps the id
    ):
        assert cell_id(_compose(*FAST, "backend=vllm", setting)) != cell_id(v), setting
    assert cell_id(_compose(*FAST, "backend=vllm", "backend.routed_experts=false")) == cell_id(v)


def test_grid_sweeper_runs_the_union_of_tables_once():
    cfg = _compose("experiment=tiny_repro", hydra=True)
    from hydra_plugins.ecospec_grid_sweeper import GridSweeper  # after Hydra's plugin scan, which reloads its base

    sweeper = GridSweeper(grids=OmegaConf.to_container(cfg.hydra.sweeper.grids))
    jobs = sweeper.jobs([])
    keys = [tuple(sorted(j)) for j in jobs]
    assert len(keys) == len(set(keys))
    # Tables 1, 4 and 10 at T=0: EcoSpec with EAGLE-3, global cost and the oracle interleaved, 7 benchmarks; Table 1
    # at T=1: EcoSpec with EAGLE-3, 7; Table 9: 3 checkpoints x 2; Tables 11-12: EcoSpec with EAGLE-3 x 7 x 6 γ;
    # 6-7: 2 x 4 x 2 batch sizes and the batch-buffer EcoSpec 4 x 2; Table 5: GTO + EcoSpec with GTO x 4; MoE-Spec:
    # 6 budgets x 4 and EcoSpec + MoE-Spec 3 x 4; Table 8: 2 x 4 batch sizes on the mix. (Equal cells behind
    # different override lists, e.g. Table 1's cells at the model's γ in Tables 11-12, are listed twice and skipped
    # by their ok record the second time.)
    assert len(jobs) == 7 + 7 + 6 + 42 + 16 + 8 + 4 + 24 + 12 + 8
    # the oracle runs on every benchmark the methods it is set against run on, in their job
    oracle = [j for j in jobs if any(x.startswith("interleave=") and "oracle" in x for x in j)]
    table1 = [j for j in jobs if "temperature=0.0" in j and "method=ecospec" in j and len(j) == 4]
    assert len(oracle) == 7 and oracle == table1
    narrowed = sweeper.jobs(["dataset=humaneval"])  # a command-line override applies to every grid
    assert all("dataset=humaneval" in j for j in narrowed) and len(narrowed) < len(jobs)


@pytest.mark.parametrize("preset", ["moespec", "moespec_qwen3", "moespec_gptoss", "moespec_deepseek"])
def test_moespec_presets_sweep_budgets_that_validate(preset):
    """Every cell of each MoE-Spec preset composes and validates (budgets between the model's top-k and N)."""
    cfg = _compose(f"experiment={preset}", hydra=True)
    from hydra_plugins.ecospec_grid_sweeper import GridSweeper  # after Hydra's plugin scan, which reloads its base

    jobs = GridSweeper(grids=OmegaConf.to_container(cfg.hydra.sweeper.grids)).jobs([])
    assert len({j for job in jobs for j in job if j.startswith("dataset=")}) >= 4
    budgets = set()
    for job in [j for j in jobs if "dataset=gsm8k" in j]:  # every (method, budget); the datasets compose elsewhere
        extra = [] if preset == "moespec" else ["model.predictor.checkpoints.final=/some/dir"]
        c = _compose(f"experiment={preset}", *job, *extra)
        validate(c)
        if c.expert_budget is not None:
            budgets.add(c.expert_budget)
            assert c.method.budgeted and cell_name(c).split("-")[-2].startswith("eb")
    assert len(budgets) >= 5 and any(j for j in jobs if "method=ecospec" in j)
    if preset == "moespec":
        assert budgets == {4, 6, 8, 12, 16, 32}


# ---------------------------------------------------------------------------------------------- records


def test_atomic_write_leaves_old_file_when_interrupted(tmp_path, monkeypatch):
    path = tmp_path / "r.json"
    write_json_atomic(path, {"a": 1})

    def boom(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(json, "dump", boom)
    with pytest.raises(KeyboardInterrupt):
        write_json_atomic(path, {"a": 2})
    assert json.loads(path.read_text()) == {"a": 1}
    assert [p.name for p in tmp_path.iterdir()] == ["r.json"]  # no temp file left behind


def test_progress_survives_a_torn_line_and_a_changed_cell(tmp_path):
    p = Progress(tmp_path, "cell-a")
    p.add("x/0", {"v": 1})
    p.add("x/1", {"v": 2})
    with open(tmp_path / PROGRESS, "a") as f:
        f.write('{"cell_id": "cell-a", "key": "x/2", "ro')  # killed mid-write
    q = Progress(tmp_path, "cell-a")
    assert q.rows == {"x/0": {"v": 1}, "x/1": {"v": 2}}
    q.add("x/2", {"v": 3})
    assert Progress(tmp_path, "cell-a").rows["x/2"] == {"v": 3}
    assert Progress(tmp_path, "cell-b").rows == {}  # another config: start over


def test_corrupt_record_is_named_and_skipped(tmp_path):
    bad = tmp_path / RESULT
    bad.write_text('{"schema": 1, "status": "ok", "summ')
    with pytest.warns(UserWarning, match=str(bad)):
        assert read_record(bad) is None


# ------------------------------------------------------------------------------------------------ cells


@pytest.fixture
def cell(tmp_path):
    def make(*overrides):
        cfg = _compose(*FAST, f"out_dir={tmp_path}", *overrides)
        return cfg, tmp_path / "exp" / cell_name(cfg)

    return make


def test_engine_knob_identity_and_refusals():
    """engine=eager keeps every id it had; compiled is another cell (and another AR baseline); what the compiled
    engine does not run yet is refused in one line before anything loads."""
    from ecospec.identity import ar_key

    a = _compose(*FAST)
    assert cell_id(_compose(*FAST, "engine=eager")) == cell_id(a)
    c = _compose(*FAST, "engine=compiled")
    assert cell_id(c) != cell_id(a) and "-compiled-" in cell_name(c)
    validate(c)
    plain = OmegaConf.to_container(a, resolve=True)
    assert (
        ar_key(plain, "cpu")
        == ar_key({**plain, "engine": "eager"}, "cpu")
        != ar_key({**plain, "engine": "compiled"}, "cpu")
    )
    refused = {
        ("engine=fast",): "allowed: eager, compiled",
        ("engine=compiled", "method=moespec", "expert_budget=8"): "no expert budget",
        ("engine=compiled", "model=mixtral"): "Qwen3-MoE targets only",
        ("engine=compiled", "backend=vllm", "method=ar"): "backend=hf",
        ("engine=compiled", "model.parallel=tp", "ranks=2"): "one process",
    }
    for overrides, why in refused.items():
        with pytest.raises(ConfigError, match=why) as e:
            validate(_compose(*FAST, *overrides))
        assert str(e.value).startswith("engine=") and "\n" not in str(e.value), overrides


@pytest.mark.compiled
def test_compiled_cell_decodes_as_the_eager_one(cell):
    """A cell with engine=compiled (and its interleaved EAGLE-3) gives the eager cell's tokens, α and E per prompt
    (float64: no reduction-order flips), records its engine, warm-up and the parts that ran natively (one prepared
    target: the AR baseline runs on its AR step)."""
    runs = {}
    for engine in ("eager", "compiled"):
        cfg, cell_dir = cell("model.dtype=float64", f"engine={engine}", "interleave=[eagle3]")
        rec = run_cell(cfg, cell_dir)
        assert rec["status"] == "ok", rec.get("traceback")
        other = read_record(
            cell_dir.parent
            / cell_name(_compose(*FAST, "model.dtype=float64", f"engine={engine}", "method=eagle3"))
            / RESULT
        )
        runs[engine] = (rec, other)
    for eager, compiled in zip(runs["eager"], runs["compiled"], strict=True):
        keys = ("tokens", "steps", "accepted", "experts_by_layer")
        assert [{k: r.get(k) for k in keys} for r in compiled["prompts"]] == [
            {k: r.get(k) for k in keys} for r in eager["prompts"]
        ]
        assert compiled["summary"]["matches_ar"] == 1.0
        env = compiled["env"]
        assert env["engine"] == "compiled" and env["compile_s"] >= 0
        assert [slots for _, slots in env["compiled_shapes"]] == [512]  # AR ran on the speculative target's AR step
        assert "engine" not in eager["env"]
        # on the CPU the target and the head run as native calls: nothing for inductor to compile
        assert set(env["native_parts"]) == set(env["compiled_parts"]) >= {"target"}
    assert {"target", "eagle3_head"} <= set(runs["compiled"][1]["env"]["native_parts"])


@pytest.mark.compiled
def test_compiled_batched_cell_decodes_as_the_eager_one(cell):
    """AR, EAGLE-3 and EcoSpec (its draft model and predictor) cells at batch_size=2 with engine=compiled prepare
    their target (and the head and the predictor, a native copy per sequence) for two rows before the clock starts
    and give the eager cells' tokens, prompt by prompt."""
    methods = {"ar": ["target"], "eagle3": ["eagle3_head", "target"], "ecospec": ["predictor", "target"]}
    for method, parts in methods.items():
        recs = {}
        for engine in ("eager", "compiled"):
            cfg, cell_dir = cell("model.dtype=float64", f"engine={engine}", f"method={method}", "batch_size=2")
            recs[engine] = run_cell(cfg, cell_dir)
            assert recs[engine]["status"] == "ok", recs[engine].get("traceback")
        tokens = {engine: [r["tokens"] for r in rec["prompts"]] for engine, rec in recs.items()}
        assert tokens["compiled"] == tokens["eager"] and all(tokens["eager"]), method
        env = recs["compiled"]["env"]
        assert env["engine"] == "compiled" and env["native_parts"] == env["compiled_parts"] == parts, method
        if method == "ar":
            assert env["compiled_shapes"] == [[1, 512]]


def test_cell_record_has_the_issue_keys_and_is_lossless(cell):
    cfg, cell_dir = cell()
    rec = run_cell(cfg, cell_dir)
    assert rec["status"] == "ok", rec.get("traceback")
    on_disk = read_record(cell_dir / RESULT)
    assert on_disk["cell_id"] == cell_id(cfg) and on_disk["schema"] == 1
    s = on_disk["summary"]
    for key in (
        "alpha",
        "experts_per_layer",
        "experts_by_layer",
        "t_pred_s",
        "t_draft_s",
        "t_select_s",
        "t_verify_s",
        "t_step_s",
        "tokens",
        "steps",
        "tokens_per_s",
        "ar_tokens_per_s",
        "speedup",
        "matches_ar",
        "hbm_bytes_per_verify",
    ):
        assert key in s, key
    assert s["matches_ar"] == 1.0  # greedy SD equals AR token for token
    assert s["tokens"] == 2 * 8 and len(on_disk["prompts"]) == 2
    assert all(len(r["tokens"]) == r["n_tokens"] for r in on_disk["prompts"])
    assert s["alpha"] == sum(r["accepted"] for r in on_disk["prompts"]) / s["steps"]
    assert len(s["experts_by_layer"]) == s["num_moe_layers"] and s["top_k"] <= s["experts_per_layer"]
    load = on_disk["expert_load"]
    assert len(load) == s["num_moe_layers"] and len(load[0]) == s["num_experts"]
    assert sum(load[0]) == sum(r["verified"] for r in on_disk["prompts"]) * s["top_k"]
    env = on_disk["env"]
    assert env["device"] == "cpu" and env["torch"] and "slurm_job_id" in env
    st = env["storage"]  # what ran, as loaded
    assert (st["experts"], st["dense"], st["stored"]) == ("fp32", "fp32", None) and set(st["devices"]) == {"cpu"}
    assert st["attn_implementation"] and st["experts_implementation"]
    assert not (cell_dir / PROGRESS).exists()  # the checkpoint goes once the record is written
    assert list((Path(cfg.out_dir) / "ar_cache").glob("*.json"))  # AR measured and cached


def test_a_cell_records_paired_intervals_and_its_clock(cell):
    """summary.intervals: speedup, α and E with their 95 % paired-bootstrap intervals over the cell's prompts, the
    AR interleaved (paired); each prompt row and AR row holds wall and CPU seconds; a cached AR (measured at
    another time) gives a weakly paired interval."""
    cfg, cell_dir = cell("method=eagle3", "num_prompts=3")
    rec = run_cell(cfg, cell_dir)
    s = rec["summary"]
    iv = s["intervals"]
    assert iv["pairing"] == "paired" and iv["unit"] == "prompt" and s["clock"] == iv["clock"] == "thread_cpu"
    for key, value in (("speedup", s["speedup"]), ("alpha", s["alpha"]), ("E", s["experts_per_layer"])):
        assert iv[key]["low"] <= value <= iv[key]["high"] and iv[key]["units"] == 3, key
        assert iv[key]["estimate"] == pytest.approx(value), key
    units = iv["units"]  # per-unit columns the reports pair across cells
    assert units["keys"] == sorted(f"prompt:{r['id']}" for r in rec["prompts"])
    assert len(units["speedup"]) == len(units["alpha"]) == len(units["E"]) == 3
    assert all(r["cpu_seconds"] > 0 and r["seconds"] > 0 for r in rec["prompts"])
    assert {r["id"] for r in rec["ar_prompts"]} == {r["id"] for r in rec["prompts"]}
    assert all(r["hf_cpu_seconds"] > 0 for r in rec["ar_prompts"])
    assert s["seconds"] == pytest.approx(sum(r["cpu_seconds"] for r in rec["prompts"]))
    assert s["wall_seconds"] == pytest.approx(sum(r["seconds"] for r in rec["prompts"]))
    wall, wall_dir = cell("method=eagle3", "num_prompts=3", "clock=wall", "seed=1")
    w = run_cell(wall, wall_dir)["summary"]
    assert w["clock"] == "wall" and w["seconds"] == w["wall_seconds"]

    cached, cached_dir = cell("method=ecospec", "num_prompts=3", "ar_baseline=cached")
    c = run_cell(cached, cached_dir)["summary"]
    assert c["intervals"]["pairing"] == "weakly paired" and c["intervals"]["speedup"]["units"] == 3


def test_rerun_skips_ok_cells_and_force_recomputes(cell):
    cfg, cell_dir = cell("method=ar")
    run_cell(cfg, cell_dir)
    before = (cell_dir / RESULT).stat().st_mtime_ns
    again = run_cell(cfg, cell_dir)
    assert again.get("skipped") and (cell_dir / RESULT).stat().st_mtime_ns == before
    forced = run_cell(_compose(*FAST, f"out_dir={cfg.out_dir}", "method=ar", "force=true"), cell_dir)
    assert forced["status"] == "ok" and not forced.get("skipped")
    assert (cell_dir / RESULT).stat().st_mtime_ns != before


def test_a_kept_tiny_record_from_other_weights_is_set_aside_and_run_again(cell, monkeypatch):
    """The embedded default's cells (and the demo) are kept only for the weights that made them: after a
    re-release (or with ECOSPEC_TINY=cache) the old record is renamed, never overwritten, and the cell runs."""
    monkeypatch.delenv("ECOSPEC_TINY", raising=False)
    cfg, cell_dir = cell("model=tiny", "method=ar", "num_prompts=1", "max_new_tokens=4")
    rec = run_cell(cfg, cell_dir)
    assert rec["status"] == "ok", rec.get("traceback")
    assert rec["env"]["tiny"] == {"source": "release", "identity": recipe_identity("full")}
    old = json.loads((cell_dir / RESULT).read_text())
    old["env"]["tiny"]["identity"] = "0123456789abcdef"
    (cell_dir / RESULT).write_text(json.dumps(old))
    again = run_cell(cfg, cell_dir)
    assert again["status"] == "ok" and not again.get("skipped")
    assert json.loads((cell_dir / "result.release-0123456789abcdef.json").read_text()) == old
    aside = load_record(cell_dir / "result.release-0123456789abcdef.json")  # whole: its sidecar and load file kept
    assert rec["expert_load"] and aside["expert_load"] == rec["expert_load"]
    assert json.loads((cell_dir / RESULT).read_text())["env"]["tiny"] == rec["env"]["tiny"]
    assert run_cell(cfg, cell_dir).get("skipped")


def test_trace_steps_keeps_capped_verify_pass_traces(cell):
    cfg, cell_dir = cell("method=ecospec", "trace_steps=5")
    rec = run_cell(cfg, cell_dir)
    assert rec["status"] == "ok", rec.get("traceback")
    trace = rec["trace"]
    assert len(trace) == 5 and trace[0]["prompt"] == rec["prompts"][0]["id"]
    step = trace[0]
    assert step["path"][0] == 0 and len(step["routes"]) == rec["summary"]["num_moe_layers"]
    assert len(step["routes"][0]) == len(step["tokens"]) == len(step["parents"]) and step["parents"][0] == -1
    assert "trace" not in rec["prompts"][0]
    plain, plain_dir = cell("method=ecospec")
    assert cell_id(plain) != cell_id(cfg) and "trace" not in run_cell(plain, plain_dir)


def test_deepseek_mtp_cell_is_lossless(cell):
    cfg, cell_dir = cell("model=tiny_random_deepseek", "method=mtp")
    rec = run_cell(cfg, cell_dir)
    assert rec["status"] == "ok", rec.get("traceback")
    assert rec["summary"]["matches_ar"] == 1.0 and rec["summary"]["num_moe_layers"] >= 1


def test_ar_baseline_is_reused_from_the_cache(cell):
    ar_cfg, ar_dir = cell("method=ar")
    ar = run_cell(ar_cfg, ar_dir)
    cfg, cell_dir = cell("method=eagle3", "ar_baseline=cached")
    rec = run_cell(cfg, cell_dir)
    assert rec["summary"]["ar_tokens_per_s"] == ar["summary"]["ar_tokens_per_s"]
    assert rec["summary"]["ar_source"] == ar["summary"]["ar_source"]


def test_ar_divides_by_the_faster_of_our_loop_and_hf_generate(cell, monkeypatch):
    """At batch 1 AR is also timed through transformers' generate on the same prompts (same greedy tokens); the
    speedup divides by the faster of the two and says which (summary.ar_source), our loop's step times stay."""
    import ecospec.experiment.contenders as contenders

    cfg, cell_dir = cell("method=eagle3")
    s = run_cell(cfg, cell_dir)["summary"]
    assert s["ar_hf_same"] == 1.0 and s["ar_hf_tokens_per_s"] > 0 and s["ar_t_step_s"] > 0
    assert s["ar_tokens_per_s"] == max(s["ar_ecospec_tokens_per_s"], s["ar_hf_tokens_per_s"])
    assert s["ar_source"] == ("hf_generate" if s["ar_hf_tokens_per_s"] > s["ar_ecospec_tokens_per_s"] else "ecospec")
    assert s["speedup"] == pytest.approx(s["tokens_per_s"] / s["ar_tokens_per_s"])

    real = contenders.hf_generate  # an HF generate that takes no time must become the denominator
    monkeypatch.setattr(contenders, "hf_generate", lambda *a: (real(*a)[0], 1e-6, 1e-6))  # (tokens, wall, CPU)
    fast, fast_dir = cell("method=eagle3", "seed=1")
    f = run_cell(fast, fast_dir)["summary"]
    assert f["ar_source"] == "hf_generate" and f["ar_tokens_per_s"] == f["ar_hf_tokens_per_s"]
    assert f["ar_t_step_s"] > 0 and f["ar_ecospec_tokens_per_s"] < f["ar_tokens_per_s"]

    none, none_dir = cell("method=eagle3", "ar_peer=none", "seed=2")
    n = run_cell(none, none_dir)["summary"]
    assert n["ar_source"] == "ecospec" and n["ar_hf_tokens_per_s"] is None
    assert n["ar_tokens_per_s"] == n["ar_ecospec_tokens_per_s"]
    batched, batched_dir = cell("method=eagle3", "batch_size=2", "seed=3")
    assert run_cell(batched, batched_dir)["summary"]["ar_hf_tokens_per_s"] is None  # B > 1: batched AR, ours


def test_ar_baseline_interleaved_on_cpu_by_default(cell, monkeypatch):
    """On a CPU each prompt is decoded by AR right after the method, in the same job: the speedup is one run's."""
    from ecospec.experiment.contenders import Decoder

    order = []
    real = Decoder.prompt

    def spy(self, i, p, progress):
        order.append((self.name, p.id))
        return real(self, i, p, progress)

    monkeypatch.setattr(Decoder, "prompt", spy)
    cached_cfg, cached_dir = cell("method=ar")
    cached = run_cell(cached_cfg, cached_dir)
    cfg, cell_dir = cell("method=eagle3")
    order.clear()
    rec = run_cell(cfg, cell_dir)
    ids = [r["id"] for r in rec["prompts"]]
    assert order == [(m, i) for i in ids for m in ("eagle3", "ar")]  # not the cached AR record
    assert rec["summary"]["ar_tokens_per_s"] != cached["summary"]["tokens_per_s"]
    assert rec["summary"]["matches_ar"] == 1.0


def test_failed_cell_is_recorded_and_never_overwrites_an_ok_record(cell):
    cfg, cell_dir = cell("method=ar")
    ok = run_cell(cfg, cell_dir)
    failing = _compose(*FAST, f"out_dir={cfg.out_dir}", "method=ar", "force=true", "device=cuda:7")
    assert cell_id(failing) == cell_id(cfg)
    rec = run_cell(failing, cell_dir)
    assert rec["status"] == "failed" and rec["error"]
    assert json.loads((cell_dir / RESULT).read_text())["started"] == ok["started"]
    assert json.loads((cell_dir / "failed.json").read_text())["status"] == "failed"


def test_interrupted_cell_continues_from_its_checkpoint(cell):
    cfg, cell_dir = cell("method=ar")
    first = run_cell(cfg, cell_dir)["prompts"][0]
    # Pretend the job died after prompt 0: only its row is checkpointed (with a marker), no record.
    (cell_dir / RESULT).unlink()
    row = dict(first, seconds=1234.5, experts_sum=[x * first["steps"] for x in first["experts_by_layer"]])
    row["expert_load"] = []
    Progress(cell_dir, cell_id(cfg)).add(f"ar/{first['id']}/0", row)
    rec = run_cell(cfg, cell_dir)
    assert rec["prompts"][0]["seconds"] == 1234.5  # reused, not recomputed
    assert rec["prompts"][1]["seconds"] < 1000


def test_unavailable_dataset_fails_fast_with_its_message(cell, monkeypatch, tmp_path):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.setenv("HF_DATASETS_CACHE", str(tmp_path / "hf" / "datasets"))
    cfg, cell_dir = cell("dataset=aime25")  # no vendored fallback (gsm8k may have one: make data-offline)
    rec = run_cell(cfg, cell_dir)
    assert rec["status"] == "failed" and "make data" in rec["error"]
    assert "summary" not in rec and rec["wall_s"] < 30


# --------------------------------------------------------------------------------------------- run.py


def _run(args, tmp_path, timeout=600, env=None):
    return subprocess.run(
        [sys.executable, str(ROOT / "run.py"), *args, f"out_dir={tmp_path}"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, "OMP_NUM_THREADS": "1", **(env or {})},
    )


def test_run_py_single_cell_prints_one_line(tmp_path):
    out = _run(FAST + ["method=ecospec"], tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    line = out.stdout.strip().splitlines()[-1]
    assert line.startswith("tiny_random-ecospec-humaneval") and "alpha" in line and "speedup" in line
    assert "HBM per verify pass" in line
    (record,) = (tmp_path / "default").glob(f"*/{RESULT}")
    assert json.loads(record.read_text())["status"] == "ok"


def test_run_py_bad_value_is_one_line_and_exit_code(tmp_path):
    out = _run(FAST + ["gamma=1"], tmp_path)
    assert out.returncode != 0
    assert "gamma=1: must be an integer >= 2" in out.stdout + out.stderr


def test_multirun_isolates_failures_and_prints_the_table(tmp_path):
    out = _run(["-m", *FAST, "method=ar", "gamma=1,4", "name=sweep"], tmp_path)
    assert out.returncode != 0  # one cell failed
    records = {
        json.loads(p.read_text())["config"]["gamma"]: json.loads(p.read_text())
        for p in (tmp_path / "sweep").glob(f"*/{RESULT}")
    }
    assert records[1]["status"] == "failed" and records[4]["status"] == "ok"
    table = out.stdout[out.stdout.index("cell ") :]
    assert "2 cells" in table and "1 failed" in table and "failed" in table and "ok" in table


def test_loop_share_counts_outputs_ending_in_a_period_one_or_two_loop():
    from ecospec.analysis.loops import in_loop
    from ecospec.experiment.metrics import summarize

    assert in_loop([9] * 20) and in_loop([3, 4] * 10) and in_loop(list(range(4)) + [7, 8] * 8)
    assert not in_loop([1, 2, 3] * 7) and not in_loop([5] * 15 + [6]) and in_loop([1] * 15) is None
    rows = [
        {
            "steps": 1,
            "n_tokens": 20,
            "accepted": 1,
            "experts_sum": [],
            "seconds": 1.0,
            "loop": loop,
            **{f"{p}_s": 0.0 for p in ("t_pred", "t_draft", "t_select", "t_verify", "t_total", "t_prefill")},
        }
        for loop in (True, False, None, True)
    ]
    assert summarize(rows)["loop_share"] == pytest.approx(2 / 3)  # an early-stopped output does not count


def test_batch_schedule_keeps_dataset_order_and_puts_a_next_turn_in_the_next_batch():
    from types import SimpleNamespace

    from ecospec.experiment.cell import batch_schedule

    prompts = [SimpleNamespace(turns=("a", "b")), SimpleNamespace(turns=("c",)), SimpleNamespace(turns=("d", "e"))]
    assert list(batch_schedule(prompts, 2)) == [[(0, 0), (1, 0)], [(2, 0), (0, 1)], [(2, 1)]]
    assert list(batch_schedule(prompts, 1)) == [[(0, 0)], [(1, 0)], [(2, 0)], [(0, 1)], [(2, 1)]]
    assert list(batch_schedule(prompts, 8)) == [[(0, 0), (1, 0), (2, 0)], [(0, 1), (2, 1)]]


@pytest.mark.parametrize("method, buffer", [("ecospec", "sequence"), ("ecospec", "batch"), ("eagle3", "sequence")])
def test_batched_cell_equals_the_unbatched_cell_and_reports_pass_metrics(cell, method, buffer):
    """batch_size=2 on MT-Bench (two turns, the second after its own first answer; 3 prompts: the last batch is
    smaller): every output equals the batch_size=1 cell's, AR is batched AR at B=2, E is over the batched passes."""
    one, one_dir = cell(f"method={method}", "dataset=mtbench", "num_prompts=3")
    ref = run_cell(one, one_dir)
    cfg, cell_dir = cell(
        f"method={method}", "dataset=mtbench", "num_prompts=3", "batch_size=2", f"batch_buffer={buffer}"
    )
    rec = run_cell(cfg, cell_dir)
    assert rec["status"] == "ok", rec.get("traceback")
    s = rec["summary"]
    assert [(r["id"], r["turn"], r["tokens"]) for r in rec["prompts"]] == [
        (r["id"], r["turn"], r["tokens"]) for r in ref["prompts"]
    ]  # lossless, and in dataset order
    assert s["matches_ar"] == 1.0 and s["batch_size"] == 2
    batches = rec["batches"]
    assert [b["sequences"] for b in batches] == [2, 2, 2]  # p0 p1 | p2 p0' | p1' p2'
    assert s["passes"] == sum(b["passes"] for b in batches) and s["steps"] >= s["passes"]
    assert s["alpha"] == sum(r["accepted"] for r in rec["prompts"]) / s["steps"]  # per sequence
    assert s["experts_per_layer"] >= ref["summary"]["experts_per_layer"]  # the union over a pass's sequences
    assert s["wall_seconds"] == pytest.approx(sum(b["seconds"] for b in batches))  # each batch's wall time once
    assert s["clock"] == "thread_cpu" and s["seconds"] == pytest.approx(sum(b["cpu_seconds"] for b in batches))
    iv = s["intervals"]  # a batched cell resamples batches, never prompts of one batch apart
    assert iv["unit"] == "batch" and iv["units"]["keys"] == ["batch:0", "batch:1", "batch:2"]
    assert iv["E"]["estimate"] == pytest.approx(s["experts_per_layer"]) and iv["speedup"]["units"] == 3
    assert s["rho"] == pytest.approx(s["ar_t_step_s"] / s["t_verify_s"])
    if buffer == "sequence" and method == "ecospec":
        assert s["alpha"] == pytest.approx(ref["summary"]["alpha"])  # the same trees, selections and acceptances


def test_batched_cell_resumes_whole_batches(cell, monkeypatch):
    """A killed batched cell keeps its finished batches (progress.jsonl) and recomputes only the rest."""
    import ecospec
    import ecospec.experiment.contenders as contenders

    cfg, cell_dir = cell("method=eagle3", "num_prompts=4", "batch_size=2", "ar_baseline=cached")
    calls = []
    real = ecospec.generate_batch

    def dies_on_second(*args, **kwargs):
        calls.append(len(args[1]))
        if len(calls) == 2:
            raise RuntimeError("killed")
        return real(*args, **kwargs)

    monkeypatch.setattr(contenders.ecospec, "generate_batch", dies_on_second)
    assert run_cell(cfg, cell_dir)["status"] == "failed"
    keys = [json.loads(line)["key"] for line in (cell_dir / PROGRESS).read_text().splitlines()]
    assert keys[-1] == "eagle3/batch/0" and len(keys) == 3
    monkeypatch.setattr(contenders.ecospec, "generate_batch", real)
    rec = run_cell(cfg, cell_dir)
    assert rec["status"] == "ok", rec.get("traceback")
    assert len(rec["batches"]) == 2 and rec["summary"]["matches_ar"] == 1.0


def test_moespec_cells_measure_the_quality_they_give_up(cell):
    """method=moespec: expert_budget is required and is part of the cell; at B = N the outputs are AR's (error rate
    0), at B = k every verify pass loads at most k experts and the record says how far the outputs moved."""
    with pytest.raises(ConfigError, match="expert_budget=None: method=moespec caps the experts"):
        validate(_compose(*FAST, "method=moespec"))
    with pytest.raises(ConfigError, match="expert_budget=8: only method=moespec"):
        validate(_compose(*FAST, "method=ecospec", "expert_budget=8"))
    with pytest.raises(ConfigError, match="expert_budget=2: must be >= the model's top-k \\(4\\)"):
        validate(_compose(*FAST, "method=moespec", "expert_budget=2"))
    full, full_dir = cell("method=moespec", "expert_budget=16")  # tiny_random: qwen3_moe-b, N = 16, k = 4
    rec = run_cell(full, full_dir)
    assert rec["status"] == "ok", rec.get("traceback")
    s = rec["summary"]
    assert s["matches_ar"] == 1.0 and s["budget_error_rate"] == 0.0 and s["first_divergence"] == 8
    assert "-eb16-" in cell_name(full)
    tight, tight_dir = cell("method=moespec", "expert_budget=4", "budget_policy=substitute")
    rec = run_cell(tight, tight_dir)
    assert rec["status"] == "ok", rec.get("traceback")
    s = rec["summary"]
    assert max(s["experts_by_layer"]) <= 4 and 0.0 <= s["budget_error_rate"] <= 1.0
    assert cell_id(tight) != cell_id(full)
    # the records as `make tables` reads them: the MoE-Spec table has both budgets, labelled by policy
    from ecospec.report.moespec import table_moespec
    from ecospec.report.records import load_records

    t = table_moespec(load_records([full_dir, tight_dir]).frame)
    assert list(zip(t["Method"], t["Budget"], strict=True)) == [("MoE-Spec", "B=16"), ("MoE-Spec (substitute)", "B=4")]
    assert t["E"].iloc[1] <= 4 and t["budget_error_rate"].iloc[0] == 0.0


def test_demo_is_a_cell_with_its_baseline_interleaved_and_prints_its_table(tmp_path):
    """`make demo` on a random model: one EcoSpec cell with the model's own baseline interleaved and AR beside both;
    its table (AR, the model's own drafter, EcoSpec: the records' numbers), a sentence and a figure beside the cell's
    record, printed; the second run keeps the records and prints the table again."""
    cmd = [
        sys.executable,
        "run.py",
        "experiment=demo",
        "model=tiny_random",
        "dataset.members=[humaneval]",
        "dataset.per_member=2",
        "dataset.instances=2",
        "max_new_tokens=8",
        f"out_dir={tmp_path}",
        "progress=false",
    ]
    first = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert first.returncode == 0, first.stderr[-3000:]
    records = [json.loads(p.read_text()) for p in (tmp_path / "demo").rglob(RESULT)]
    records = {r["config"]["method"]["name"]: r for r in records}
    assert set(records) == {"ecospec", "baseline"} and all(r["kind"] == "cell" for r in records.values())
    main = records["ecospec"]
    run = main["summary"]["intervals"]["run"]
    assert main["interleaved"] == {"run": run, "methods": ["ecospec", "baseline"], "kept": []}
    assert records["baseline"]["summary"]["intervals"]["run"] == run  # one run: EcoSpec against it is paired
    assert main["config"]["gamma"] == 4 and main["summary"]["clock"] == "thread_cpu"  # one thread: its CPU time
    (cell_dir,) = [p.parent for p in (tmp_path / "demo").glob(f"*/{RESULT}") if p.parent.name == main["cell"]]
    table = pd.read_csv(cell_dir / "demo.csv").set_index("Method")
    assert list(table.index) == ["AR", "Draft model", "EcoSpec"]
    for name, label in (("baseline", "Draft model"), ("ecospec", "EcoSpec")):
        s, row = records[name]["summary"], table.loc[label]
        assert (row["alpha"], row["E experts"], row["CPU speedup"]) == pytest.approx(
            (s["alpha"], s["experts_per_layer"], s["speedup"])
        )
        assert row["CPU speedup_lo"] <= row["CPU speedup"] <= row["CPU speedup_hi"]
        assert row["same as AR share"] == 100.0  # greedy: lossless
    ar = table.loc["AR"]
    assert ar["alpha"] == 1.0 and ar["E experts"] == main["summary"]["ar_experts_per_layer"]
    assert ar["CPU speedup"] <= 1.0 + 1e-9 and ar["modeled H100 speedup"] == pytest.approx(1.0)
    demo = build(cell_dir, "H100")
    pair = demo.pair  # EcoSpec against the baseline, the same prompts interleaved
    assert pair["low"] <= pair["estimate"] <= pair["high"]
    speedups = table["CPU speedup"]
    assert pair["estimate"] == pytest.approx(speedups["EcoSpec"] / speedups["Draft model"])
    assert all((cell_dir / f"demo.{ext}").is_file() for ext in ("md", "tex", "png"))
    assert "| EcoSpec " in first.stdout and "fewer experts per layer than Draft model" in first.stdout
    assert " % [" in first.stdout and "against it on this CPU (CPU time, 95 % interval)" in first.stdout
    sentence = reading(demo)  # step time said as longer or shorter, as the two step times are
    step = {r.role: r.t_step_s for r in demo.rows}
    assert ("longer" if step["ecospec"] > step["baseline"] else "shorter") in sentence and "step time" not in sentence
    assert "-" not in sentence.replace("−", "")  # signed figures carry a true minus
    second = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert second.returncode == 0 and "(existing record)" in second.stdout and "| EcoSpec " in second.stdout
    # make tables: the demo's page and figure, indexed; its cells in no paper table (they are not the paper's grid)
    written = {p.name for p in report_build([tmp_path], tmp_path / "reports")}
    assert {"demo.md", "demo.tex", "demo.csv", "demo.png"} <= written and "table08_rho.md" not in written
    assert pd.read_csv(tmp_path / "reports" / "demo.csv").equals(pd.read_csv(cell_dir / "demo.csv"))
    assert "[md](demo.md)" in (tmp_path / "reports" / "README.md").read_text()


# ------------------------------------------------------------------------------------- interleaved methods


def test_interleaved_methods_write_their_own_cells_measured_in_one_run(cell, tmp_path):
    """interleave=[eagle3,oracle] beside ecospec: one job decodes each prompt with the three methods and AR in turn;
    each method's record sits where its own cell's would (same id), holds what that cell would hold (α, E, tokens
    as a cell run alone), and shares the run id by which the reports pair them. A rerun keeps them; force reruns."""
    cfg, cell_dir = cell("method=ecospec", "interleave=[eagle3,oracle]", "num_prompts=3")
    rec = run_cell(cfg, cell_dir)
    assert rec["status"] == "ok", rec.get("traceback")
    run = rec["summary"]["intervals"]["run"]
    assert rec["interleaved"] == {"run": run, "methods": ["ecospec", "eagle3", "oracle"], "kept": []}
    alone_root = tmp_path / "alone"
    for name in ("eagle3", "oracle"):
        other, other_dir = cell(f"method={name}", "num_prompts=3")
        got = read_record(other_dir / RESULT)
        assert got["cell_id"] == cell_id(other) and got["config"]["method"]["name"] == name
        s = got["summary"]
        assert s["intervals"]["run"] == run and s["intervals"]["pairing"] == "paired" and s["matches_ar"] == 1.0
        assert got["interleaved"]["in"] == rec["cell"]
        assert got["ar_prompts"] == rec["ar_prompts"]  # one AR for the group
        solo_cfg = _compose(*FAST, f"out_dir={alone_root}", f"method={name}", "num_prompts=3")
        solo = run_cell(solo_cfg, alone_root / "exp" / cell_name(solo_cfg))["summary"]
        for key in ("alpha", "experts_per_layer", "tokens", "steps"):
            assert s[key] == solo[key], (name, key)
        assert "run" not in solo["intervals"]  # a cell run alone belongs to no group
    # the tables pair them: Table 1's ratio row (EcoSpec against EAGLE-3) is paired, its estimate the ratio of the
    # two rows' speedups, with an interval around it; every speedup carries its own interval
    from ecospec.report.paper_tables import table01_main, table10_oracle
    from ecospec.report.records import load_records

    t1 = table01_main(load_records([str(tmp_path / "exp")]).frame)
    eco, eagle, vs = (t1[t1["Method"] == m].iloc[0] for m in ("EcoSpec", "EAGLE-3", "EcoSpec vs EAGLE-3"))
    col = next(c for c in t1.columns if c.endswith(" speedup") and not c.startswith("Avg"))
    assert vs["Source"] == "ratio" and vs["Pairing"] == "paired"
    assert vs[col] == pytest.approx(eco[col] / eagle[col])
    assert vs[f"{col}_lo"] <= vs[col] <= vs[f"{col}_hi"] and eco[f"{col}_lo"] <= eco[col] <= eco[f"{col}_hi"]
    t10 = table10_oracle(load_records([str(tmp_path / "exp")]).frame)
    assert t10.loc[t10["Source"] == "ratio", "Pairing"].tolist() == ["paired"]
    assert run_cell(cfg, cell_dir).get("skipped")
    (cell_dir / RESULT).unlink()  # the main cell again, its companions' records standing: they are kept
    again = run_cell(cfg, cell_dir)
    assert again["interleaved"]["kept"] == ["eagle3", "oracle"] and "run" not in again["summary"]["intervals"]
    forced = run_cell(
        _compose(
            *FAST,
            f"out_dir={cfg.out_dir}",
            "method=ecospec",
            "interleave=[eagle3,oracle]",
            "num_prompts=3",
            "force=true",
        ),
        cell_dir,
    )
    other, other_dir = cell("method=eagle3", "num_prompts=3")
    assert json.loads((other_dir / RESULT).read_text())["summary"]["intervals"]["run"] == forced["interleaved"]["run"]
    assert forced["interleaved"]["run"] != run


@pytest.mark.parametrize(
    "override, message",
    [
        ("interleave=[ar]", "interleave: AR is decoded beside every method already"),
        ("interleave=[ecospec]", "interleave=ecospec: each method once, not the cell's own (ecospec)"),
        ("interleave=[nope]", "interleave: unknown method 'nope'"),
        ("interleave=[eagle3]+batch_size=2", "interleave=eagle3: batch_size 1 only"),
        ("interleave=[mtp]", "method=mtp needs a mtp drafter"),
    ],
)
def test_interleave_refuses_what_it_cannot_do_in_one_line(override, message):
    cfg = _compose("model=tiny_random", "method=ecospec", *override.split("+"))
    with pytest.raises(ConfigError) as e:
        validate(cfg)
    assert str(e.value).startswith(message) and "\n" not in str(e.value)


def test_the_oracles_lookups_come_off_cpu_time_at_their_share_of_wall_time():
    """On a busy core the thread runs for part of the wall time only: the look-ups' wall seconds taken off the CPU
    seconds as they stand gave negative speedups (an oracle cell read -91x); at their share they cannot."""
    from ecospec.experiment.metrics import without_lookups

    assert without_lookups(1.0, 0.5, 0.6) == pytest.approx((0.4, 0.2))
    assert without_lookups(1.0, 1.0, 0.25) == pytest.approx((0.75, 0.75))  # an idle core: the same either way
    assert without_lookups(1.0, None, 0.25) == (0.75, None)


def test_sweep_table_marks_kept_records_as_its_legend_says(tmp_path):
    """A rerun that kept three ok records and ran one: the three read ok* (kept), the one ok; a forced rerun that
    failed beside an ok record reads failed*; the legend names only the marks shown."""
    from ecospec.experiment.callbacks import sweep_table
    from ecospec.experiment.records import FAILED, SCHEMA

    def record(name, finished, status="ok"):
        rec = {"schema": SCHEMA, "status": status, "cell": name, "finished": finished, "summary": {"alpha": 2.0}}
        write_json_atomic(tmp_path / name / RESULT, rec)

    for i in range(3):
        record(f"kept{i}", "2026-12-01T10:00:00+00:00")
    record("ran", "2026-12-04T10:00:05+00:00")
    text, failed = sweep_table(tmp_path, since="2026-12-04T10:00:00+00:00")
    status = {line.split()[0]: line.split()[1] for line in text.splitlines()[1:-1]}
    assert status == {"kept0": "ok*", "kept1": "ok*", "kept2": "ok*", "ran": "ok"} and failed == 0
    assert "ok* = kept" in text.splitlines()[-1] and "failed*" not in text.splitlines()[-1]

    write_json_atomic(tmp_path / "ran" / FAILED, {"schema": SCHEMA, "status": "failed", "cell": "ran"})
    text, failed = sweep_table(tmp_path, since="2026-12-04T10:00:00+00:00")
    assert "ran" in text and " failed* " in text and failed == 1 and "failed* = this run failed" in text
    assert sweep_table(tmp_path)[0].count(" ok* ") == 0  # no start time (a table read later): nothing is marked kept
