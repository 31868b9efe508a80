"""vLLM as the second engine, for real: `vllm serve` and `vllm bench serve` from vLLM's own environment (`make
install-vllm`) on a small random Qwen3-MoE and EAGLE-3 head that the tests write themselves (head_dim 32, as vLLM's
CPU attention needs), `--enforce-eager`. Marker `vllm` (`make test-vllm`): without the environment they fail."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

import ecospec
from ecospec.vllm_backend.args import server_args
from ecospec.vllm_backend.env import version, vllm_cli
from ecospec.vllm_backend.server import Server, greedy_tokens

pytestmark = pytest.mark.vllm
ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    """A random 4-layer Qwen3-MoE (byte tokenizer, fp32) and a random EAGLE-3 head with its attention shape,
    saved as a cluster would find them: an HF folder and a speculators-layout head."""
    from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

    from ecospec.drafters.eagle3 import Eagle3Head, init_random_weights
    from ecospec.drafters.eagle3_checkpoint import save_eagle3
    from ecospec.drafters.eagle3_train import default_head_config
    from ecospec.models.byte_tokenizer import VOCAB_SIZE, byte_tokenizer

    root = tmp_path_factory.mktemp("vllm-ckpt")
    cfg = Qwen3MoeConfig(
        vocab_size=VOCAB_SIZE,
        hidden_size=64,
        intermediate_size=128,
        moe_intermediate_size=64,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=32,
        num_experts=8,
        num_experts_per_tok=2,
        mlp_only_layers=[],
        max_position_embeddings=2048,
        tie_word_embeddings=False,
        pad_token_id=0,
        bos_token_id=1,
        eos_token_id=2,
    )
    torch.manual_seed(0)
    target = Qwen3MoeForCausalLM(cfg).eval()
    target.save_pretrained(root / "target")
    byte_tokenizer().save_pretrained(root / "target")
    head = init_random_weights(Eagle3Head(default_head_config(target)), seed=1)
    save_eagle3(head, root / "head", layout="speculators")
    return root


def _prompts(n: int) -> list[list[int]]:
    from ecospec.data.humaneval import humaneval_prompts
    from ecospec.models.byte_tokenizer import byte_tokenizer

    tok = byte_tokenizer()
    return [[1] + tok.encode(p["prompt"][:200], add_special_tokens=False) for p in humaneval_prompts(n)]


def _settings(**kw) -> dict:
    s = OmegaConf.to_container(OmegaConf.load(ecospec.conf_dir() / "backend" / "vllm.yaml"))
    return {**s, "dtype": "float32", "tp": 1, "served_name": "test", "enforce_eager": True, **kw}


def _server_pids(marker: str) -> list[int]:
    """Processes whose command line names `marker` (a checkpoint folder of these tests)."""
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and int(entry.name) != os.getpid():
            try:
                if marker in (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace"):
                    pids.append(int(entry.name))
            except OSError:
                pass
    return pids


def test_the_environment_runs_vllms_own_commands():
    assert "+cpu" in version()  # `vllm --version`: the console script finds its distribution
    help_text = subprocess.run([str(vllm_cli()), "bench", "serve", "--help=all"], capture_output=True, text=True).stdout
    assert "--max-concurrency" in help_text


def test_vllm_greedy_ar_equals_ecospec_ar_token_for_token(checkpoint, tmp_path):
    from transformers import AutoModelForCausalLM

    from ecospec.models.byte_tokenizer import byte_tokenizer
    from ecospec.vllm_backend.bench import check_tokenization

    target = AutoModelForCausalLM.from_pretrained(checkpoint / "target", dtype=torch.float32).eval()
    prompts = _prompts(8)
    args = server_args(_settings(), "ar", 4, None, 0, cpu=True)
    with Server(vllm_cli(), str(checkpoint / "target"), args, tmp_path / "ar.log", model_name="test") as srv:
        got = [greedy_tokens(srv, ids, 24) for ids in prompts]
        texts = [byte_tokenizer().decode(ids) for ids in prompts]
        check_tokenization(srv, texts, prompts)  # the dataset file's texts come back as the cell's ids
        with pytest.raises(ValueError, match="tokenizes 1 of 2"):
            check_tokenization(srv, texts[:2], [prompts[0], prompts[1][:-1]])
    ours = [ecospec.generate(target, torch.tensor([ids]), max_new_tokens=24, eos_token_id=[]).tokens for ids in prompts]
    assert sum(a == b for a, b in zip(got, ours, strict=True)) >= len(prompts) - 1, (got, ours)
    assert not _server_pids(str(checkpoint / "target"))


def _cell_cfg(checkpoint: Path, tmp_path: Path, *overrides: str) -> dict:
    with initialize_config_dir(config_dir=str(ecospec.conf_dir()), version_base="1.3"):
        cfg = compose(
            "config",
            overrides=[
                "model=tiny_random",
                "backend=vllm",
                f"out_dir={tmp_path}",
                "num_prompts=4",
                "max_new_tokens=16",
                "progress=false",
                "threads=1",
                "backend.enforce_eager=true",
                *overrides,
            ],
        )
    d = OmegaConf.to_container(cfg, resolve=False)
    d.pop("hydra", None)
    d["gamma"] = cfg.gamma  # resolved: the model's own unless overridden
    d["model"].update(name="vllm_test", source="hf", target=str(checkpoint / "target"), default_drafter="eagle3")
    d["model"]["drafters"]["eagle3"] = {"path": str(checkpoint / "head"), "layout": "speculators"}
    return d


def test_vllm_cell_measures_tpot_speedup_and_acceptance_and_stops_its_servers(checkpoint, tmp_path):
    from ecospec.experiment.vllm_cell import run_vllm_cell
    from ecospec.identity import cell_id

    d = _cell_cfg(checkpoint, tmp_path, "method=eagle3", "batch_size=2")
    rec = run_vllm_cell(d, tmp_path / "cell")
    assert rec["status"] == "ok", rec.get("traceback")
    s = rec["summary"]
    assert rec["config"]["backend"]["name"] == "vllm" and version().startswith(rec["env"]["vllm_version"])
    assert s["tpot_s"] > 0 and s["ar_tpot_s"] > 0 and s["speedup"] == pytest.approx(s["ar_tpot_s"] / s["tpot_s"])
    assert s["rounds"] == 2 and s["requests"] == 2 * 4 and s["tokens"] == 2 * 4 * 16  # fixed length, eos ignored
    assert s["alpha"] >= 1 and len(s["acceptance_by_position"]) == 3  # gamma 4: 3 draft tokens per step
    spec = json.loads(rec["server_args"]["eagle3"][rec["server_args"]["eagle3"].index("--speculative-config") + 1])
    assert spec == {"method": "eagle3", "model": str(checkpoint / "head"), "num_speculative_tokens": 3}
    assert "--no-enable-prefix-caching" in rec["server_args"]["ar"]
    assert s["matches_ar"] == 1.0  # greedy: the same texts with and without speculation
    assert not _server_pids(str(checkpoint / "target"))
    from ecospec.experiment.kinds import one_line  # what run.py prints for it (vLLM reports no experts)

    assert "TPOT" in one_line(rec) and f"speedup {s['speedup']:.2f}x" in one_line(rec)
    hf = dict(d, backend={"name": "hf"})
    assert cell_id(hf) != cell_id(d) and "backend" not in rec["cell"].split("-vllm")[0]


def test_a_server_that_cannot_start_fails_the_cell_with_its_error_and_leaves_nothing(checkpoint, tmp_path):
    from ecospec.experiment.vllm_cell import run_vllm_cell

    d = _cell_cfg(checkpoint, tmp_path, "method=ar", "backend.extra_args=[--no-such-flag]")
    rec = run_vllm_cell(d, tmp_path / "bad")
    assert rec["status"] == "failed" and "no-such-flag" in rec["error"]
    assert not _server_pids(str(checkpoint / "target"))


def test_sigterm_to_a_running_cell_stops_its_servers(checkpoint, tmp_path):
    """What Slurm does on preemption: SIGTERM to the job while its servers run; no process may stay behind."""
    cmd = [
        sys.executable,
        "run.py",
        "model=tiny_random",
        "backend=vllm",
        "method=ar",
        f"out_dir={tmp_path}",
        "num_prompts=2",
        "max_new_tokens=8",
        "progress=false",
        "backend.enforce_eager=true",
        "model.source=hf",
        f"model.target={checkpoint / 'target'}",
        "model.name=vllm_sigterm",
    ]
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    marker = str(checkpoint / "target")
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and not _server_pids(marker):
        time.sleep(0.5)
    assert _server_pids(marker), "the server never started"
    time.sleep(5)  # the server is starting or up: either way it must go
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode != 0
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and _server_pids(marker):
        time.sleep(0.5)
    assert not _server_pids(marker), out[-2000:]


def test_per_position_acceptance_has_one_definition_in_both_backends(tmp_path):
    """The same chain (the embedded default's target and EAGLE-3 head, 3 draft tokens, greedy, fp32, batch 1, the
    same prompts) in vLLM (its counters) and in ours (`eagle3_chain`, our steps): one per-position acceptance, equal
    within 0.02 at every position (a trained head: the drafts are accepted often enough for that to mean much)."""
    from ecospec.experiment.cell import run_cell
    from ecospec.experiment.vllm_cell import run_vllm_cell
    from ecospec.tiny.build import paths

    dirs = paths()

    def cfg(*overrides):
        d = _cell_cfg(dirs["target"], tmp_path, "batch_size=1", "gamma=4", *overrides)
        d["max_new_tokens"] = 32
        d["model"].update(target=str(dirs["target"] / "model"), chat_template=False)
        d["model"]["drafters"]["eagle3"] = {"path": str(dirs["drafter"] / "head"), "layout": "speculators"}
        return d

    theirs = run_vllm_cell(cfg("method=eagle3"), tmp_path / "vllm")
    assert theirs["status"] == "ok", theirs.get("traceback")
    ours = run_cell(dict(cfg("method=eagle3_chain"), backend={"name": "hf"}), tmp_path / "ours")
    assert ours["status"] == "ok", ours.get("traceback")
    a, b = theirs["summary"]["acceptance_by_position"], ours["summary"]["acceptance_by_position"]
    assert len(a) == len(b) == 3 and max(abs(x - y) for x, y in zip(a, b, strict=True)) <= 0.02, (a, b)
    assert a[0] > 0.3, f"the head's first draft is accepted at {a[0]:.2f}: the comparison checks little"
