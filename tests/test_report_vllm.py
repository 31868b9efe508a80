"""make tables on vLLM records: their own tables and figure, the curve shape read right, and the HF engine's tables
leaving them out (they carry no E or phase times)."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from ecospec.report import build

pytestmark = pytest.mark.usefixtures("no_release_traces")  # conftest: no tracing of the release


def _record(model: str, b: int, speedup: float, alpha: float = 2.0, backend: str = "vllm") -> dict:
    ar_tpot = 0.010 * (1 + 0.1 * b)
    return {
        "schema": 1,
        "kind": "cell",
        "cell": f"{model}-eagle3-mtbench-{backend}-b{b}",
        "cell_id": f"{model}{b}{backend}",
        "experiment": "overlap_e2e_test",
        "status": "ok",
        "finished": "2026-12-02T00:00:00+00:00",
        "config": {
            "model": {"name": model, "default_drafter": "eagle3", "drafters": {"eagle3": {"path": "head"}}},
            "method": {"name": "eagle3", "drafter": "eagle3", "selector": "confidence"},
            "dataset": {"name": "mtbench"},
            "temperature": 0.0,
            "top_p": 1.0,
            "gamma": 4,
            "depth": 3,
            "topk": 2,
            "batch_size": b,
            "max_new_tokens": 256,
            "num_prompts": 80,
            "split": "all",
            "seed": 0,
            "backend": {"name": backend, "tp": 2},
        },
        "env": {"hardware": "H100", "device": "cuda", "storage": {"quantization": "fp8"}},
        "summary": {
            "tpot_s": ar_tpot / speedup,
            "ar_tpot_s": ar_tpot,
            "speedup": speedup,
            "alpha": alpha,
            "tokens_per_s": 100.0 * b,
            "requests": max(80, 20 * b),
        },
    }


def test_vllm_records_get_their_tables_and_figure_and_stay_out_of_the_hf_tables(tmp_path):
    recs = tmp_path / "experiments"
    curves = {"mixtral": [1.1, 1.4, 1.3, 1.0], "qwen3_30b": [1.6, 1.4, 1.2, 1.0]}
    for model, speedups in curves.items():
        for b, sp in zip((1, 2, 4, 8), speedups, strict=True):
            d = recs / f"{model}-{b}"
            d.mkdir(parents=True)
            (d / "result.json").write_text(json.dumps(_record(model, b, sp)))
    out = tmp_path / "reports"
    build([recs], out)
    e2e = pd.read_csv(out / "vllm_e2e.csv")
    assert len(e2e) == 8 and set(e2e["B"]) == {1, 2, 4, 8}
    assert e2e["TPOT speedup"].round(2).tolist()[:4] in ([1.1, 1.4, 1.3, 1.0], [1.6, 1.4, 1.2, 1.0])
    curve = pd.read_csv(out / "vllm_curve.csv")
    mix, qwen = (curve[curve["Model"].str.contains(m, case=False)].iloc[0] for m in ("mixtral", "qwen3"))
    assert (mix["Peak B"], mix["Shape"], mix["Paper's shape"]) == (2, "concave", "concave")
    assert (qwen["Peak B"], qwen["Shape"]) == (1, "not concave") and qwen["Measured te"] == 1.6 / 2.0
    assert sorted(p.name for p in (out / "figures").glob("fig_vllm_*.png")) == [
        "fig_vllm_tpot_speedup_mixtral.png",
        "fig_vllm_tpot_speedup_qwen3_30b.png",
    ]
    assert not (out / "table01_main.md").exists()  # no HF-engine record: its tables stay unbuilt
    readme = (out / "README.md").read_text()
    assert "vllm_e2e" in readme and "fig_vllm_tpot_speedup_mixtral" in readme


def test_an_hf_record_beside_them_still_fills_table_1_alone(tmp_path):
    recs = tmp_path / "experiments"
    for i, backend in enumerate(("vllm", "hf")):
        d = recs / f"c{i}"
        d.mkdir(parents=True)
        r = _record("qwen3_30b", 1, 1.5, backend=backend)
        if backend == "hf":
            r["summary"].update(
                experts_per_layer=20.0,
                t_verify_s=0.02,
                t_step_s=0.025,
                ar_t_step_s=0.015,
                tokens_per_s=10.0,
                ar_tokens_per_s=7.0,
            )
        (d / "result.json").write_text(json.dumps(r))
    out = tmp_path / "reports"
    build([recs], out)
    assert len(pd.read_csv(out / "vllm_e2e.csv")) == 1
    used = Path(out / "README.md").read_text()
    assert "vllm_e2e" in used
