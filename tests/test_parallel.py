"""Targets sharded over torch.distributed ranks (model.parallel=tp|ep): 2 CPU ranks on gloo, the way a cluster runs
them (saved checkpoints loaded through `load_target`, one process per rank). Greedy SD under TP (and EP where
transformers runs it) equals single-process AR token for token, routers are replicated (every rank captures the
same routes), a cell runs through run.py with ranks=2, and a failing rank fails the cell instead of hanging it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import torch.multiprocessing as mp

import ecospec
from ecospec.experiment.config import ConfigError, validate_parallel
from ecospec.experiment.job import run_job
from ecospec.experiment.ranks import _free_port
from ecospec.experiment.records import read_record
from ecospec.models.loading import tiny_model
from ecospec.parallel import plan_problem, plans

ROOT = Path(__file__).resolve().parents[1]
FAMILIES = ["qwen3_moe-a", "gpt_oss-a", "deepseek_v3-a", "mixtral-a"]
EP_FAMILIES = [p for p in FAMILIES if plan_problem(p.split("-")[0], "ep") is None]
PROMPT = [5, 17, 99, 42, 7, 63, 12, 88, 150, 3, 21]


def _decode(target, drafter, predictor):
    """Greedy AR and EcoSpec SD on PROMPT, and the routes of every verify pass."""
    from ecospec.engine.routing import RoutingCapture

    ids = torch.tensor([PROMPT])
    ar = ecospec.generate(target, ids, max_new_tokens=10, eos_token_id=[])
    sd = ecospec.generate(
        target,
        ids,
        drafter=drafter,
        selector="ecospec",
        predictor=predictor,
        max_new_tokens=10,
        eos_token_id=[],
        trace=True,
    )
    batch = ecospec.generate_batch(
        target,
        [PROMPT, PROMPT[:6]],
        drafter=drafter,
        selector="ecospec",
        predictor=predictor,
        max_new_tokens=10,
        eos_token_id=[],
    )
    with torch.no_grad(), RoutingCapture(target) as cap:
        target(ids)
        routes = cap.take().tolist()
    return {
        "ar": ar.tokens,
        "sd": sd.tokens,
        "routes": routes,
        "steps": [s.trace.routes for s in sd.steps],
        "batch": [r.tokens for r in batch.results],
    }


def _components(target, preset):
    from ecospec.drafters.draft_model import DraftModelDrafter
    from ecospec.models import perturbed_copy
    from ecospec.predictor import ExpertPredictor

    draft = perturbed_copy(tiny_model(preset, seed=0, dtype=torch.float64), scale=0.1, seed=1)  # replicated
    backbone = {
        "model_type": "qwen3",
        "vocab_size": 8,
        "hidden_size": 32,
        "intermediate_size": 64,
        "num_hidden_layers": 1,
        "num_attention_heads": 2,
        "num_key_value_heads": 1,
        "head_dim": 16,
    }
    torch.manual_seed(3)
    return DraftModelDrafter(draft), ExpertPredictor.from_target(target, backbone, dtype=torch.float64)


def _worker(rank: int, port: int, ckpt: str, out: str) -> None:
    """One rank: every family under tp (and ep where it runs), results to out/<rank>.json."""
    os.environ.update(
        RANK=str(rank), WORLD_SIZE="2", LOCAL_RANK=str(rank), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port)
    )
    torch.set_num_threads(1)
    from ecospec.models import load_target
    from ecospec.parallel import init_group

    init_group(120, "cpu")
    results = {}
    for mode, presets in (("tp", FAMILIES), ("ep", EP_FAMILIES)):
        for preset in presets:
            target = load_target(
                f"{ckpt}/{preset}",
                dtype=torch.float64,
                attn_implementation="eager",
                experts_implementation="eager",
                parallel=mode,
            )
            results[f"{mode}/{preset}"] = _decode(target, *_components(target, preset))
            results[f"{mode}/{preset}"]["share"] = local_share(target)
    Path(out, f"{rank}.json").write_text(json.dumps(results))
    torch.distributed.destroy_process_group()


def local_share(model) -> float:
    """The share of the model's parameters this rank holds (a DTensor's local shard; a plain tensor: all of it)."""
    total = sum(p.numel() for p in model.parameters())
    mine = sum((p.to_local() if hasattr(p, "to_local") else p).numel() for p in model.parameters())
    return mine / total


@pytest.fixture(scope="module")
def sharded(tmp_path_factory):
    """Each family saved, then decoded on 2 ranks; and single-process references from the same checkpoints."""
    ckpt = tmp_path_factory.mktemp("ckpt")
    out = tmp_path_factory.mktemp("out")
    single = {}
    for preset in FAMILIES:
        tiny_model(preset, seed=0, dtype=torch.float64).save_pretrained(ckpt / preset)
        from ecospec.models import load_target

        target = load_target(
            str(ckpt / preset), dtype=torch.float64, attn_implementation="eager", experts_implementation="eager"
        )
        single[preset] = _decode(target, *_components(target, preset))
    mp.start_processes(_worker, args=(_free_port(), str(ckpt), str(out)), nprocs=2, join=True, start_method="spawn")
    ranks = [json.loads((out / f"{r}.json").read_text()) for r in range(2)]
    return single, ranks


@pytest.mark.parametrize("mode, preset", [("tp", p) for p in FAMILIES] + [("ep", p) for p in EP_FAMILIES])
def test_sharded_greedy_sd_equals_single_process_ar(sharded, mode, preset):
    single, ranks = sharded
    for got in ranks:
        r = got[f"{mode}/{preset}"]
        assert r["sd"] == r["ar"] == single[preset]["ar"]  # lossless, and the sharded target is the same model
        assert r["batch"] == single[preset]["batch"] and r["batch"][0] == r["ar"]  # batched SD: per-row caches
        assert r["routes"] == single[preset]["routes"]


@pytest.mark.parametrize("mode, preset", [("tp", p) for p in FAMILIES] + [("ep", p) for p in EP_FAMILIES])
def test_routers_are_replicated_so_every_rank_captures_the_same_routes(sharded, mode, preset):
    _, (r0, r1) = sharded
    assert r0[f"{mode}/{preset}"]["steps"] == r1[f"{mode}/{preset}"]["steps"]
    assert r0[f"{mode}/{preset}"]["steps"]  # verify passes were traced


def test_plans_and_validation_messages():
    assert any("embed_tokens" in key for key in plans("gpt_oss")["tp"])
    assert any("self_attn" in key for key in plans("qwen3_moe")["tp"])
    model = {"name": "tiny_random", "source": "random", "preset": "gpt_oss-a", "parallel": "ep"}
    with pytest.raises(ConfigError, match="model.parallel='ep': model=tiny_random \\(gpt_oss\\): transformers'"):
        validate_parallel({"model": model, "ranks": 2})
    cases = [
        ({"parallel": "pp"}, 2, "model.parallel='pp': allowed: device_map, tp, ep"),
        ({"parallel": "tp"}, 1, "ranks=1: model.parallel=tp shards the target over ranks"),
        ({"parallel": "device_map"}, 2, "ranks=2: model.parallel=device_map runs one process"),
        ({"parallel": "tp", "device_map": "auto"}, 2, "model.device_map='auto': model.parallel=tp"),
    ]
    for extra, ranks, msg in cases:
        with pytest.raises(ConfigError, match=msg.replace("(", "\\(").replace(")", "\\)")):
            validate_parallel({"model": {"source": "random", "preset": "qwen3_moe-a", **extra}, "ranks": ranks})


@pytest.mark.slow  # 26 s: two rank processes through run.py (make test-slow, CI)
def test_run_py_cell_with_two_ranks_equals_the_single_process_cell(tmp_path):
    """The issue's command: python run.py model=tiny_random model.parallel=tp ranks=2 method=ecospec (rank 0 alone
    writes the record; its outputs equal the one-process cell's)."""
    common = [
        "model=tiny_random",
        "method=ecospec",
        "num_prompts=2",
        "max_new_tokens=8",
        "progress=false",
        f"out_dir={tmp_path}",
    ]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "ECOSPEC_CACHE": str(tmp_path / "cache")}
    for extra in (["model.parallel=tp", "ranks=2"], []):
        out = subprocess.run(
            [sys.executable, "run.py", *common, *extra], cwd=ROOT, capture_output=True, text=True, timeout=600, env=env
        )
        assert out.returncode == 0, out.stderr[-3000:]
    records = [read_record(p) for p in sorted((tmp_path / "default").glob("*/result.json"))]
    by_ranks = {r["env"]["ranks"]: r for r in records}
    assert set(by_ranks) == {1, 2} and all(r["status"] == "ok" for r in records)
    assert by_ranks[2]["config"]["model"]["parallel"] == "tp" and by_ranks[2]["summary"]["matches_ar"] == 1.0
    assert [p["tokens"] for p in by_ranks[2]["prompts"]] == [p["tokens"] for p in by_ranks[1]["prompts"]]
    assert not list((tmp_path / "default").glob("*/.rank*.error"))


def _dies_on_rank_1(d, job_dir, device, record):
    """A job body whose rank 1 fails while rank 0 waits in a collective."""
    import torch.distributed as dist

    if dist.get_rank() == 1:
        raise RuntimeError("boom on rank 1")
    dist.all_reduce(torch.ones(1))


@pytest.mark.slow  # 7 s of rank processes (make test-slow, CI)
def test_a_failing_rank_fails_the_cell_and_nobody_hangs(tmp_path):
    from omegaconf import OmegaConf
    from test_experiment import _compose

    cfg = OmegaConf.to_container(
        _compose("model=tiny_random", "model.parallel=tp", "ranks=2", "dist_timeout_s=60", f"out_dir={tmp_path}"),
        resolve=True,
    )
    t0 = time.perf_counter()
    rec = run_job(cfg, tmp_path / "cell", _dies_on_rank_1)
    assert time.perf_counter() - t0 < 60  # the spawner stopped rank 0: no collective timeout was needed
    assert rec["status"] == "failed" and "rank 1: RuntimeError: boom on rank 1" in rec["error"]
    on_disk = json.loads((tmp_path / "cell" / "result.json").read_text())
    assert on_disk["status"] == "failed" and on_disk["env"]["ranks"] == 2


@pytest.mark.slow  # 8 s of rank processes (make test-slow, CI)
def test_traces_job_under_tp_writes_once_and_equals_one_process(tmp_path, monkeypatch):
    """The traces job loads its target through the same `parallel` setting: under tp on 2 ranks rank 0 alone
    writes the shards, and they hold what one process traces."""
    import numpy as np
    from omegaconf import OmegaConf
    from test_experiment import _compose

    from ecospec.experiment.traces_job import run_traces

    made = {}
    for name, extra in (("one", []), ("tp", ["model.parallel=tp", "ranks=2"])):
        monkeypatch.setenv("ECOSPEC_CACHE", str(tmp_path / name / "cache"))
        (tmp_path / name / "cache").mkdir(parents=True)
        cfg = _compose(
            "experiment=traces",
            "model=tiny_random",
            "dataset=humaneval",
            "num_prompts=3",
            "traces.response_tokens=4",
            "progress=false",
            f"out_dir={tmp_path / name}",
            *extra,
        )
        rec = run_traces(OmegaConf.to_container(cfg, resolve=True), tmp_path / name / "job")
        assert rec["status"] == "ok", rec.get("error")
        made[name] = Path(rec["summary"]["trace_dir"])
    for shard in sorted(made["one"].glob("shard-*.npz")):
        a, b = np.load(shard), np.load(made["tp"] / shard.name)
        assert all(np.array_equal(a[k], b[k]) for k in a.files)
    assert len(list(made["tp"].glob("shard-*.npz"))) == len(list(made["one"].glob("shard-*.npz"))) >= 1


def test_what_each_plan_shards(sharded):
    """Per-rank share of the parameters on 2 ranks (tiny presets): TP halves Qwen3-MoE and Mixtral (attention and
    experts), DeepSeek-V3 mostly (MLA attention stays whole), GPT-OSS hardly (its plan shards the embedding only)."""
    _, (r0, _) = sharded
    shares = {key: r0[key]["share"] for key in r0}
    print("per-rank parameter share on 2 ranks:", {k: round(v, 3) for k, v in shares.items()})
    assert shares["tp/qwen3_moe-a"] < 0.6 and shares["tp/mixtral-a"] < 0.6
    assert shares["tp/gpt_oss-a"] > 0.8  # shards little: ep is the way to spread GPT-OSS, and it fails (BROKEN)
    for preset in EP_FAMILIES:
        assert shares[f"ep/{preset}"] < 0.75


def test_sizing_from_the_cost_model_facts():
    from ecospec.analysis.sizing import size

    ds = size("deepseek", "H100")
    assert (ds.gpus, ds.nodes, ds.parallel) == (16, 2, "tp") and 650e9 < ds.weight_bytes < 700e9
    assert "ranks=16" in ds.launch() and "gpus_per_node=8" in ds.launch()
    assert size("deepseek", "H200").gpus == 8
    q = size("qwen3", "H100")  # 8 GPUs, but its 4 KV heads cannot be split 8 ways
    assert q.gpus == 8 and q.parallel == "device_map" and "model.parallel=device_map" in q.launch()
    assert (size("qwen3", "H200").gpus, size("qwen3", "H200").parallel) == (4, "tp")
    assert size("gptoss", "H100").gpus == 1
    # without transformers' MXFP4 kernels the experts load dequantized to bf16: ~230 GB, 4 GPUs, and it says so
    bf16 = size("gptoss", "H100", kernels=False)
    assert bf16.gpus == 4 and 220e9 < bf16.weight_bytes < 240e9 and bf16.storage.startswith("dequantized to bf16")
    assert size("gptoss", "H100").storage == "as stored (experts mxfp4)"
    ds_bf16 = size("deepseek", "H100", kernels=False)
    assert ds_bf16.weight_bytes > 1.9 * ds.weight_bytes  # fp8 -> bf16, scales dropped
    # ... but transformers cannot dequantize its 576-row kv_a_proj_with_mqa (4.5 blocks of 128): said, not hidden
    assert any("kv_a_proj_with_mqa 576x7168" in n and "does not load" in n for n in ds_bf16.notes)
    assert not any("does not load" in n for n in ds.notes)
    assert size("qwen3", "H100", kernels=False) == q  # bf16 as stored: nothing to dequantize
