"""The prepared device check (ecospec.bench.gpu_check) with --device cpu: every step runs (or says why it cannot),
greedy SD equals AR in fp32 for the four families, the run.py cell's record is ok, the verify-latency records exist;
a failing step is recorded without stopping the others; --print-deps works with no dependency importable."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from ecospec.bench import RECORD_SUFFIX, gpu_check

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def check(tmp_path_factory):
    out = tmp_path_factory.mktemp("gpu_check")
    rc = gpu_check.main(["--device", "cpu", "--out", str(out)])
    return rc, json.loads((out / "gpu_check.json").read_text()), out


@pytest.mark.slow  # the whole check's 26 s setup (make test-slow, CI)
def test_every_step_ok_or_an_explicit_skip(check):
    rc, summary, _ = check
    assert set(summary["steps"]) == set(gpu_check.STEPS)
    for name, step in summary["steps"].items():
        assert step["status"] in ("ok", "skipped"), (name, step.get("error"), step.get("traceback"))
        if step["status"] == "skipped":
            assert step["reason"], name
        assert step["wall_s"] >= 0
    assert rc == 0 and summary["ok"] and summary["failed"] == []
    env = summary["env"]
    assert env["torch"] and env["transformers"] and env["cuda_available"] in (True, False) and env["device_name"]
    assert summary["wall_s"] < 180  # seconds on one core: about 20 s alone, 45 s on a core shared with two others


@pytest.mark.slow  # the whole check's 26 s setup (make test-slow, CI)
def test_fp32_sd_equals_ar_for_the_four_families(check):
    _, summary, _ = check
    families = summary["steps"]["sd_vs_ar"]["result"]["families"]
    assert set(families) == {"qwen3_moe", "gpt_oss", "deepseek_v3", "mixtral"}
    for fam, row in families.items():
        assert row["fp32"]["matches_ar"] == 1.0 and row["fp32"]["first_divergence"] == [None] * row["fp32"]["prompts"]
        assert row["fp32"]["alpha"] > 1.0, fam  # drafts were accepted: the equality is not AR against AR
        bf16 = row["bf16"]
        assert 0.0 <= bf16["matches_ar"] <= 1.0 and len(bf16["first_divergence"]) == bf16["prompts"]
        assert all(d is None or 0 <= d < bf16["new_tokens"] for d in bf16["first_divergence"])
        for variant in ("verify", "causal"):
            assert row["fp32"]["block_vs_step"][variant]["argmax_flips"] == 0, (fam, variant)


@pytest.mark.slow  # the whole check's 26 s setup (make test-slow, CI)
def test_the_run_py_cell_record_is_ok(check):
    _, summary, _ = check
    cell = summary["steps"]["run_cell"]["result"]
    assert cell["status"] == "ok" and cell["returncode"] == 0 and cell["matches_ar"] == 1.0
    assert cell["alpha"] > 1.0 and cell["speedup"] > 0
    assert cell["storage"]["experts"] == "fp32" and "cpu" in cell["storage"]["devices"]
    assert "device=cpu" in cell["command"] and "logger=none" in cell["command"]
    assert json.loads(Path(cell["record"]).read_text())["status"] == "ok"


@pytest.mark.slow  # the whole check's 26 s setup (make test-slow, CI)
def test_grouped_mm_routes_and_verify_latency_records(check):
    _, summary, out = check
    routes = summary["steps"]["routes_grouped_mm"]
    if routes["status"] == "ok":
        for fam, row in routes["result"]["families"].items():
            assert row["fp32"].get("routes_equal") is True or "error" in row["fp32"], fam
    vl = summary["steps"]["verify_latency"]["result"]
    for model in ("qwen3", "gptoss"):
        m = vl["models"][model]
        files = list(Path(m["dir"]).glob(f"*{RECORD_SUFFIX}"))
        assert m["records"] == len(files) > 0 and Path(m["dir"]).is_relative_to(out / "fig1a")
        assert set(m["impls"]) == set(vl["settings"]["impls"]) and "eager" in m["impls"]


def test_a_failing_step_is_recorded_and_the_others_still_run(tmp_path, monkeypatch, capsys):
    def broken(ctx):
        raise RuntimeError("boom")

    def fine(ctx):
        return {"x": 1}, "fine"

    monkeypatch.setitem(gpu_check.STEPS, "sd_vs_ar", broken)
    monkeypatch.setitem(gpu_check.STEPS, "run_cell", fine)
    assert gpu_check.main(["--device", "cpu", "--out", str(tmp_path), "--steps", "sd_vs_ar,run_cell"]) == 1
    summary = json.loads((tmp_path / "gpu_check.json").read_text())
    assert summary["steps"]["sd_vs_ar"]["status"] == "failed" and "boom" in summary["steps"]["sd_vs_ar"]["error"]
    assert summary["steps"]["run_cell"]["status"] == "ok" and summary["steps"]["run_cell"]["result"] == {"x": 1}
    assert summary["failed"] == ["sd_vs_ar"] and not summary["ok"]
    assert "FAILED" in capsys.readouterr().out


def test_torch_version_gate():
    assert gpu_check.torch_problem("2.11.0+cu128") is None and gpu_check.torch_problem("2.13.0+cpu") is None
    assert "older than 2.11" in gpu_check.torch_problem("2.10.1+cu126")
    assert gpu_check.torch_problem("3.0.0") is None


def test_print_deps_needs_no_dependency_and_drops_torch():
    """`python -S` (no site-packages: no torch, transformers or installed ecospec), as on a machine where nothing
    but the CUDA torch is installed yet; both the script path and -m with the source tree on the path."""
    for cmd, env in (
        ([sys.executable, "-S", str(ROOT / "src/ecospec/bench/gpu_check.py"), "--print-deps"], {}),
        ([sys.executable, "-S", "-m", "ecospec.bench.gpu_check", "--print-deps"], {"PYTHONPATH": str(ROOT / "src")}),
    ):
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=60, env={"PATH": "/usr/bin:/bin", **env})
        assert out.returncode == 0, out.stderr
        deps = out.stdout.split()
        assert not any(d.split("=")[0].split(">")[0] == "torch" for d in deps)
        assert any(d.startswith("transformers") for d in deps) and any(d.startswith("hydra-core") for d in deps)
    assert gpu_check.dependencies() == deps
