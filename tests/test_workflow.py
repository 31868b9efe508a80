"""EcoSpec on real models end to end, walked on this machine the way a cluster runs it: the 80/20 split, the
traces job, the predictor job, the store, a held-out EcoSpec cell and `make paper` (cluster=local), through
run.py and the real-model config path (a saved checkpoint directory loaded with the config's device_map)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from hydra import compose, initialize_config_dir

from ecospec import conf_dir
from ecospec.cache import cache_root
from ecospec.data import encode_turn, load_prompts
from ecospec.data.split import heldout_ids, is_heldout, select_split
from ecospec.experiment.config import ConfigError, job_name, validate, validate_job
from ecospec.experiment.records import read_record
from ecospec.predictor.trace_files import load_traces
from ecospec.predictor.traces import route_batch
from ecospec.store import predictor_root, stored_predictor, traces_dir

ROOT = Path(__file__).resolve().parents[1]
CONF = conf_dir()
QUICK = ["threads=1", "progress=false"]


def _compose(*overrides: str):
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        return compose("config", overrides=list(overrides))


@pytest.fixture
def store(tmp_path, monkeypatch):
    """A fresh $ECOSPEC_CACHE (the store) that still sees the vendored benchmark copies of the real one."""
    data = cache_root() / "data"
    cache = tmp_path / "cache"
    cache.mkdir()
    if data.is_dir():
        (cache / "data").symlink_to(data)
    monkeypatch.setenv("ECOSPEC_CACHE", str(cache))
    return cache


def _run(args: list[str], cwd: Path, timeout: int = 300) -> subprocess.CompletedProcess:
    out = subprocess.run(
        [sys.executable, str(ROOT / "run.py"), *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    assert out.returncode == 0, f"{' '.join(args)}\n{out.stdout[-3000:]}\n{out.stderr[-3000:]}"
    return out


def _records(root: Path) -> list[dict]:
    return [read_record(p) for p in sorted(root.rglob("result.json"))]  # rows merged from the sidecar


def _multi_turn_dataset() -> str:
    """mtbench (two turns) when its vendored copy is here (make install), else humaneval."""
    try:
        load_prompts("mtbench", 1)
    except Exception:  # noqa: BLE001 - no offline copy on this machine
        return "humaneval"
    return "mtbench"


# ----------------------------------------------------------------------------------------------------- split


def test_split_is_a_seeded_function_of_each_sample_id():
    ids = [f"gsm8k/{i}" for i in range(1319)]
    held = heldout_ids(ids)
    assert held == heldout_ids(reversed(ids)) == heldout_ids(ids[:700]) | heldout_ids(ids[700:])  # subsets agree
    assert 0.17 < len(held) / len(ids) < 0.23
    assert heldout_ids(ids) != heldout_ids(ids, seed=1)
    prompts = load_prompts("humaneval")
    mine = load_prompts("humaneval", 5, split="heldout")
    assert [p.id for p in mine] == [p.id for p in prompts if is_heldout(p.id)][:5]  # num_prompts counts within it
    assert select_split([p.id for p in prompts], "all") == list(range(len(prompts)))
    with pytest.raises(ValueError, match="unknown split 'test'"):
        select_split(["a"], "test")


def test_split_is_part_of_the_cell_identity_and_validated():
    a, b = _compose("model=tiny_random"), _compose("model=tiny_random", "split=all")
    assert a.split == "heldout" and job_name(a) != job_name(b)
    with pytest.raises(ConfigError, match="^split='train': allowed: heldout, all$"):
        validate(_compose("model=tiny_random", "split=train"))


# ------------------------------------------------------------------------------------- the real-model path


def _saved_checkpoints(where: Path) -> dict[str, Path]:
    """A tiny Qwen3-MoE target with its tokenizer, a random EAGLE-3 head in the speculators layout and a tiny
    Qwen3 base decoder as the predictor backbone, saved as a cluster would find them on disk."""
    from transformers import AutoModel, Qwen3Config

    from ecospec.drafters.eagle3 import Eagle3Head, init_random_weights
    from ecospec.drafters.eagle3_checkpoint import save_eagle3
    from ecospec.drafters.eagle3_train import default_head_config
    from ecospec.models import tiny_model
    from ecospec.models.byte_tokenizer import VOCAB_SIZE, byte_tokenizer

    target = tiny_model("qwen3_moe-b", vocab_size=VOCAB_SIZE)
    target.save_pretrained(where / "target")
    byte_tokenizer().save_pretrained(where / "target")
    save_eagle3(init_random_weights(Eagle3Head(default_head_config(target)), seed=1), where / "head", "speculators")
    backbone = Qwen3Config(
        vocab_size=16,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=16,
    )
    AutoModel.from_config(backbone).save_pretrained(where / "backbone")
    return {k: where / k for k in ("target", "head", "backbone")}


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    return _saved_checkpoints(tmp_path_factory.mktemp("checkpoints"))


def _real(saved: dict[str, Path]) -> list[str]:
    """model=qwen3 as a cluster runs it (source hf, device_map auto), pointed at the saved directories."""
    return [
        "model=qwen3",
        f"model.target={saved['target']}",
        f"model.drafters.eagle3.path={saved['head']}",
        f"model.predictor.backbone={saved['backbone']}",
        "model.dtype=float32",
        "device=cpu",
    ]


def test_real_model_config_loads_a_saved_checkpoint_with_its_device_map(saved, tmp_path):
    from ecospec.experiment.cell import run_cell
    from ecospec.models import load_target

    model = load_target(str(saved["target"]), dtype="float32", device_map="auto")  # needs accelerate
    assert type(model).__name__ == "Qwen3MoeForCausalLM" and model.device.type == "cpu"
    cfg = _compose(*_real(saved), *QUICK, "method=eagle3", "num_prompts=2", "max_new_tokens=8", f"out_dir={tmp_path}")
    assert cfg.model.device_map == "auto" and cfg.model.source == "hf"
    rec = run_cell(cfg, tmp_path / "cell")
    assert rec["status"] == "ok", rec.get("traceback")
    assert rec["summary"]["matches_ar"] == 1.0 and rec["summary"]["tokens"] > 0
    assert rec["config"]["model"]["device_map"] == "auto"


def test_real_model_config_traces_predictor_and_heldout_ecospec_cell(saved, store, tmp_path):
    """The three jobs on model=qwen3's config (in this process, as run.py runs each): the target from a directory
    with device_map=auto, the predictor's embedding read from the checkpoint's safetensors (the target is not
    loaded) and its backbone from a directory by from_pretrained, the predictor found in the store by the cell."""
    from ecospec.experiment.dispatch import run_any
    from ecospec.predictor.model import ExpertPredictor

    real = [*_real(saved), *QUICK, f"out_dir={tmp_path}"]
    jobs = [
        ["experiment=traces", "dataset=humaneval", "num_prompts=16", "traces.response_tokens=6"],
        [
            "experiment=predictor",
            "training.datasets=[humaneval]",
            "training.epochs=2",
            "training.window=128",
            "training.lr=1e-3",
        ],
        ["method=ecospec", "num_prompts=2", "max_new_tokens=8"],
    ]
    records = []
    for overrides in jobs:
        cfg = _compose(*real, *overrides)
        records.append(run_any(cfg, tmp_path / job_name(cfg)))
        assert records[-1]["status"] == "ok", records[-1].get("traceback")
    traces, predictor, cell = records
    assert traces["summary"]["samples"] == 16 and cell["config"]["split"] == "heldout"
    assert cell["summary"]["matches_ar"] == 1.0
    assert cell["summary"]["predictor_accuracy"] == pytest.approx(predictor["summary"]["final_accuracy"])
    from safetensors.torch import load_file

    model = _compose(*real).model
    emb = load_file(str(saved["target"] / "model.safetensors"))["model.embed_tokens.weight"]
    assert torch.equal(ExpertPredictor.load(stored_predictor(model, "final")).embed.weight, emb)


# --------------------------------------------------------------------------------------- the three commands


@pytest.mark.slow  # 24 s: the three commands end to end (make test-slow, CI)
def test_traces_predictor_and_heldout_ecospec_cell_on_tiny_random(store, tmp_path):
    multi = _multi_turn_dataset()
    common = ["model=tiny_random", *QUICK, f"out_dir={tmp_path}"]
    _run(
        [
            "-m",
            "experiment=traces",
            *common,
            f"dataset=humaneval,{multi}",
            "num_prompts=16",
            "traces.response_tokens=8",
            "traces.batch_size=5",
            "traces.shard_size=4",
        ],
        tmp_path,
    )
    cfg = _compose("model=tiny_random")
    from ecospec.models import tiny_model
    from ecospec.models.byte_tokenizer import VOCAB_SIZE, byte_tokenizer

    target, tok = tiny_model(cfg.model.preset, vocab_size=VOCAB_SIZE), byte_tokenizer()
    for name in ("humaneval", multi):
        tr = load_traces(traces_dir(cfg.model, name))
        prompts = load_prompts(name, 16)
        assert tr.ids == [p.id for p in prompts] and len(set(tr.ids)) == 16  # every sample, both splits, once
        for i in (0, 15):
            tokens, routes = tr.sample(i)
            last = prompts[i].turns[-1]
            assert tok.decode(tokens.tolist()).count(last.strip()[:40]) == 1  # the last turn is in the sample
            assert np.array_equal(routes, route_batch(target, [tokens.tolist()])[0])  # a lone forward's routes
        if name == "humaneval":  # one turn: the prompt as a cell encodes it, then <= 8 response tokens
            ids = encode_turn(tok, prompts[0].turns, [], prompts[0].completion, False)
            tokens, _ = tr.sample(0)
            assert tokens[: len(ids)].tolist() == ids and 0 < len(tokens) - len(ids) <= 8

    from ecospec.experiment.dispatch import run_any  # the predictor job and the cell as run.py runs them, minus startup

    levels = ["training.levels.acc50=0.3", "training.levels.acc60=0.99"]
    train = _compose(
        "experiment=predictor",
        *common,
        f"training.datasets=[humaneval,{multi}]",
        "training.epochs=4",
        "training.window=256",
        "training.lr=1e-3",
        *levels,
    )
    assert run_any(train, tmp_path / "predictor" / job_name(train))["status"] == "ok"
    summary = json.loads((predictor_root(cfg.model) / "summary.json").read_text())
    traced = [p.id for n in ("humaneval", multi) for p in load_prompts(n, 16)]
    assert summary["heldout_samples"] == sum(map(is_heldout, traced)) > 0
    assert summary["train_samples"] == len(traced) - summary["heldout_samples"]
    assert summary["published"] == ["acc50", "final"]  # 0.99 is never reached
    assert len(summary["layer_accuracy"]) == 2 and summary["final_accuracy"] > summary["chance"]
    assert stored_predictor(cfg.model, "acc60") is None
    with pytest.raises(ConfigError, match="levels reached: acc50, final"):  # says why acc60 does not exist
        validate(_compose("model=tiny_random", "method=ecospec", "model.predictor.checkpoint=acc60"))

    eco = _compose(*common, "method=ecospec", "model.predictor.checkpoint=final", "num_prompts=3", "max_new_tokens=8")
    cell = run_any(eco, tmp_path / "default" / job_name(eco))
    assert cell["status"] == "ok" and cell["config"]["split"] == "heldout"
    assert [r["id"] for r in cell["prompts"]] == [p.id for p in load_prompts("humaneval", 3, split="heldout")]
    assert all(is_heldout(r["id"]) for r in cell["prompts"])
    assert cell["summary"]["predictor_accuracy"] == pytest.approx(summary["final_accuracy"])
    (ar,) = [json.loads(p.read_text()) for p in (tmp_path / "ar_cache").glob("*.json")]
    assert ar["key"]["split"] == "heldout"


def test_killed_traces_job_resumes_without_duplicate_samples(store, tmp_path, monkeypatch):
    from ecospec.experiment import traces_job
    from ecospec.experiment.traces_job import run_traces

    cfg = _compose(
        "experiment=traces",
        "model=tiny_random",
        *QUICK,
        "dataset=humaneval",
        "num_prompts=10",
        "traces.response_tokens=4",
        "traces.batch_size=3",
        "traces.shard_size=2",
    )
    real, calls = traces_job.route_batch, []

    def dies_on_the_third_batch(target, seqs):
        calls.append(len(seqs))
        if len(calls) == 3:
            raise KeyboardInterrupt  # not an Exception: escapes like a kill, no record written
        return real(target, seqs)

    monkeypatch.setattr(traces_job, "route_batch", dies_on_the_third_batch)
    with pytest.raises(KeyboardInterrupt):
        run_traces(cfg, tmp_path / "job")
    out = traces_dir(cfg.model, "humaneval")
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["samples"] == 6 and not manifest["complete"]  # 3 whole shards; nothing half-written
    assert not (tmp_path / "job" / "result.json").exists()
    monkeypatch.setattr(traces_job, "route_batch", real)
    rec = run_traces(cfg, tmp_path / "job")
    assert rec["status"] == "ok" and rec["summary"]["resumed_samples"] == 6
    tr = load_traces(out)
    assert tr.ids == [p.id for p in load_prompts("humaneval", 10)]  # each sample once, in order
    same = ["traces.response_tokens=4", "traces.batch_size=3", "traces.shard_size=2"]
    fresh = _compose(
        "experiment=traces", "model=tiny_random", *QUICK, "dataset=humaneval", "num_prompts=10", *same, "force=true"
    )
    assert run_traces(fresh, tmp_path / "job2")["status"] == "ok"
    again = load_traces(out)
    for name in ("tokens", "offsets", "routes"):
        assert np.array_equal(getattr(again, name), getattr(tr, name))
    bad = _compose(
        "experiment=traces",
        "model=tiny_random",
        *QUICK,
        "dataset=humaneval",
        "num_prompts=10",
        "traces.response_tokens=5",
        "traces.batch_size=3",
        "traces.shard_size=2",
    )
    failed = run_traces(bad, tmp_path / "job3")  # other settings never mix into the same traces
    assert failed["status"] == "failed" and "collected with other settings" in failed["error"]


# ------------------------------------------------------------------------------------ the missing predictor


def test_missing_predictor_names_the_command_and_its_cell_is_never_launched(store, tmp_path):
    cfg = _compose("model=tiny_random", "method=ecospec", "model.predictor.checkpoint=final")
    with pytest.raises(ConfigError) as err:
        validate(cfg)
    first = str(err.value).splitlines()[0]
    assert first.startswith("model.predictor.checkpoint='final': method=ecospec needs a trained expert predictor")
    assert "python run.py -m experiment=traces model=tiny_random && python run.py -m experiment=predictor " in first
    validate_job(cfg, awaiting=True)  # submitted after the job that makes it (make paper on Slurm)

    out = subprocess.run(
        [
            sys.executable,
            str(ROOT / "run.py"),
            "-m",
            "model=tiny_random",
            "method=ar,ecospec",
            "model.predictor.checkpoint=final",
            "num_prompts=1",
            "max_new_tokens=4",
            *QUICK,
            f"out_dir={tmp_path}",
            "name=sweep",
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode != 0
    assert "not launched: " in out.stderr + out.stdout and "#0 : model=tiny_random method=ar" in out.stderr + out.stdout
    assert "method=ecospec" not in "".join(line for line in (out.stderr + out.stdout).splitlines() if "] \t#" in line)
    recs = {r["config"]["method"]["name"]: r for r in _records(tmp_path / "sweep")}
    assert recs["ar"]["status"] == "ok" and recs["ecospec"]["status"] == "failed"
    assert "make it with: python run.py -m experiment=traces" in recs["ecospec"]["error"]
    assert "env" not in recs["ecospec"]  # nothing was loaded for it


# ----------------------------------------------------------------------------------------------- make paper


@pytest.mark.slow  # 45 s: every stage of make paper (make test-slow, CI)
def test_make_paper_runs_every_stage_locally(store, tmp_path):
    """`make paper` on tiny_random_deepseek (MTP baseline, the DeepSeek routing) with cluster=local: traces ->
    predictor -> the Table 1 grid on the held-out split -> make tables."""
    args = (
        "--temperatures 0.0 --out-dir {out} --reports {rep} --set threads=1 progress=false "
        "--traces-set num_prompts=30 traces.response_tokens=6 "
        "--predictor-set training.epochs=3 training.window=256 training.lr=1e-3 "
        "--table-set num_prompts=2 max_new_tokens=8 model.predictor.checkpoint=final"
    ).format(out=tmp_path / "exp", rep=tmp_path / "reports")
    out = subprocess.run(
        [
            "make",
            "-s",
            "paper",
            "MODEL=tiny_random_deepseek",
            "CLUSTER=local",
            "DATASETS=humaneval",
            f"PYTHON={sys.executable}",
            f"ARGS={args}",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    assert out.returncode == 0, f"{out.stdout[-4000:]}\n{out.stderr[-4000:]}"
    by_kind: dict[str, list[dict]] = {}
    for r in _records(tmp_path / "exp"):
        by_kind.setdefault(r.get("kind"), []).append(r)
    assert [r["status"] for r in by_kind["traces"]] == ["ok"] and [r["status"] for r in by_kind["predictor"]] == ["ok"]
    cells = {r["config"]["method"]["name"]: r for r in by_kind["cell"]}
    assert set(cells) == {"baseline", "ecospec"} and all(r["status"] == "ok" for r in cells.values())
    assert all(r["config"]["split"] == "heldout" for r in cells.values())
    assert cells["ecospec"]["summary"]["predictor_accuracy"] is not None
    assert cells["baseline"]["summary"]["matches_ar"] == cells["ecospec"]["summary"]["matches_ar"] == 1.0
    index = (tmp_path / "reports" / "README.md").read_text()
    assert "table01" in index


def test_a_real_target_that_cannot_fit_is_refused_before_any_download(tmp_path):
    """`python run.py model=qwen3 method=eagle3` on a laptop: one line naming what the weights need and what this
    machine has, within seconds, and no Hub call (the endpoint points at a closed port: a call would fail with a
    connection error and retries instead)."""
    env = {**os.environ, "HF_ENDPOINT": "http://127.0.0.1:9", "HF_HUB_OFFLINE": "0"}
    t0 = time.perf_counter()
    out = subprocess.run(
        [sys.executable, str(ROOT / "run.py"), "model=qwen3", "method=eagle3", f"out_dir={tmp_path}"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    took = time.perf_counter() - t0
    text = out.stdout + out.stderr
    assert out.returncode != 0 and took < 60, (took, text[-2000:])
    line = next(ln for ln in text.splitlines() if "needs" in ln)
    assert "model=qwen3 needs 470.2 GB for its weights (as stored (bf16)) and this machine's RAM holds" in line
    assert "cluster=slurm_gpu" in line and "memory_check=false" in line
    assert "connect" not in text.lower() and "retry" not in text.lower()
    rec = _records(tmp_path)[0]
    assert rec["status"] == "failed" and "storage" not in rec.get("env", {})  # nothing was loaded


def test_memory_check_per_rank_and_without_facts():
    from ecospec.analysis.model_config import load_model_config
    from ecospec.analysis.sizing import memory_problem
    from ecospec.experiment.job import check_memory

    qwen = load_model_config("qwen3")
    assert memory_problem(qwen, "device_map", 1, "cuda", 8 * 80e9, "8 visible GPUs") is None  # 470 GB on 8 x H100
    tp = memory_problem(qwen, "tp", 4, "cuda", 80e9, "one GPU (cuda:0)")
    assert tp and "per rank (tp over 4)" in tp and "one GPU (cuda:0) holds 80.0 GB" in tp  # 118 GB a rank
    assert memory_problem(qwen, "tp", 4, "cuda", 141e9, "one GPU") is None  # 4 x H200
    gptoss = load_model_config("gptoss")
    cpu = memory_problem(gptoss, "device_map", 1, "cpu", 16e9, "this machine's RAM")
    assert cpu and "dequantized to bf16" in cpu  # no MXFP4 kernels on a CPU
    bare = {"model": {"name": "mine", "source": "hf", "target": "someone/model"}, "memory_check": True}
    with pytest.warns(UserWarning, match="no sizing facts"):
        check_memory(bare, torch.device("cpu"))
    check_memory({**bare, "memory_check": False}, torch.device("cpu"))  # skipped: no warning, no refusal
