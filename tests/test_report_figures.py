"""Figures from a synthetic record frame: files written (PNG + PDF), skipped figures, the Figure 1(a) fit."""

from __future__ import annotations

from datetime import UTC, datetime

import numpy as np
import pandas as pd
import pytest

from ecospec.analysis.latency import fit_line
from ecospec.report.figures import FigureInfo, unique_experts_figure, verify_latency_figure, write_figures

MODELS = {"tiny_random": (2, 16, 4), "tiny_random_deepseek": (2, 16, 4)}  # MoE layers, N, k


def record(model="tiny_random", method="eagle3", gamma=4, dataset="gsm8k", E=6.0, status="ok", **over) -> dict:
    layers, n, k = MODELS[model]
    rng = np.random.default_rng(abs(hash((model, method, gamma, dataset))) % 2**32)
    t_verify = 0.01 + 0.002 * E
    row = {
        "experiment": "figs",
        "cell": f"{model}-{method}-{dataset}-g{gamma}",
        "cell_id": f"{model}{method}{dataset}{gamma}",
        "path": f"experiments/figs/{model}-{method}-{dataset}-g{gamma}/result.json",
        "status": status,
        "finished": datetime(2026, 1, 1, tzinfo=UTC),
        "model": model,
        "method": method,
        "dataset": dataset,
        "temperature": 0.0,
        "top_p": 1.0,
        "gamma": gamma,
        "depth": 3,
        "topk": 2,
        "batch_size": 1,
        "max_new_tokens": 32,
        "num_prompts": 4,
        "seed": 0,
        "selector": "ecospec" if method == "ecospec" else "confidence",
        "drafter": None if method == "ar" else "eagle3",
        "drafter_path": None,
        "predictor_checkpoint": None,
        "hardware": "Test CPU (2 threads)",
        "device": "cpu",
        "alpha": 2.0,
        "E": E,
        "experts_by_layer": [E] * layers,
        "t_pred_s": 0.001,
        "t_draft_s": 0.002,
        "t_select_s": 0.0005,
        "t_verify_s": t_verify,
        "t_step_s": t_verify + 0.004,
        "tokens": 128,
        "steps": 64,
        "tokens_per_s": 100.0,
        "ar_tokens_per_s": 60.0,
        "ar_t_step_s": 0.018,
        "speedup": 1.5,
        "matches_ar": 1.0,
        "hbm_bytes_per_verify": 1e6,
        "predictor_accuracy": None,
        "top_k": k,
        "num_experts": n,
        "num_moe_layers": layers,
        "expert_load": rng.integers(0, 50, size=(layers, n)).tolist(),
    }
    row.update(over)
    return row


def small_frame(gammas=(2, 4, 6)) -> pd.DataFrame:
    rows = []
    for model in MODELS:
        rows.append(record(model, "ar", gamma=4, E=4.0))
        for g in gammas:
            rows.append(record(model, "eagle3", gamma=g, E=4.0 + 1.5 * (g - 1)))
            rows.append(record(model, "ecospec", gamma=g, E=4.0 + 0.8 * (g - 1), dataset="humaneval"))
    rows.append(record("tiny_random", "eagle3", gamma=gammas[0], dataset="mtbench", E=7.0, expert_load=None))
    rows.append(record("tiny_random", "ecospec", gamma=gammas[0], status="failed", E=float("nan"), expert_load=None))
    return pd.DataFrame(rows)


def check_files(infos: list[FigureInfo], names: set[str]) -> None:
    assert {i.name for i in infos} == names
    for info in infos:
        assert [p.suffix for p in info.files] == [".png", ".pdf"]
        png, pdf = (p.read_bytes() for p in info.files)
        assert png.startswith(b"\x89PNG\r\n\x1a\n") and pdf.startswith(b"%PDF-")
        assert info.caption and info.n_records > 0 and info.experiments == ["figs"]


def test_write_figures_all(tmp_path):
    infos = write_figures(small_frame(), tmp_path)
    check_files(
        infos,
        {
            "fig1a_verify_latency",
            "fig1b_unique_experts_vs_gamma",
            "fig1c_expert_bytes",
            "fig4_expert_load_tiny_random",
            "fig4_expert_load_tiny_random_deepseek",
        },
    )
    by_name = {i.name: i for i in infos}
    assert by_name["fig1a_verify_latency"].n_records == 15  # every ok record, the failed one left out
    assert by_name["fig4_expert_load_tiny_random"].n_records == 7  # the record without a load left out
    assert "deepseek" in by_name["fig1c_expert_bytes"].caption
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(p.name for i in infos for p in i.files)


def test_no_gamma_variation_skips_1b(tmp_path):
    stale = [tmp_path / "fig1b_unique_experts_vs_gamma.png", tmp_path / "fig4_expert_load_gone.pdf"]
    for path in [*stale, tmp_path / "notes.txt"]:
        path.write_text("from an earlier build")
    frame = small_frame(gammas=(4,))
    frame["expert_load"] = [None if x is None else np.asarray(x) for x in frame["expert_load"]]  # as records.py reads
    infos = write_figures(frame, tmp_path)
    assert not any(p.exists() for p in stale) and (tmp_path / "notes.txt").exists()
    check_files(
        infos,
        {
            "fig1a_verify_latency",
            "fig1c_expert_bytes",
            "fig4_expert_load_tiny_random",
            "fig4_expert_load_tiny_random_deepseek",
        },
    )


def test_empty_frames(tmp_path):
    assert write_figures(pd.DataFrame(), tmp_path) == []
    assert write_figures(small_frame().iloc[0:0], tmp_path) == []
    failed = pd.DataFrame([record(status="failed")])
    assert write_figures(failed, tmp_path) == []
    assert list(tmp_path.iterdir()) == []


def test_verify_latency_fit():
    E = np.array([4.0, 5.5, 7.0, 9.0, 12.0])
    slope, intercept, r2 = fit_line(E, (0.01 + 0.002 * E) * 1e3)
    assert slope == pytest.approx(2.0) and intercept == pytest.approx(10.0) and r2 == pytest.approx(1.0)
    frame = pd.DataFrame([record(gamma=int(e), E=e) for e in E])  # t_verify = 0.01 + 0.002 E exactly
    caption = verify_latency_figure(frame).caption
    assert "2.00 ms/expert" in caption and "R² = 1.000" in caption
    with pytest.raises(ValueError):
        fit_line(np.array([3.0, 3.0]), np.array([1.0, 2.0]))


def ar_points(drawn) -> list[tuple[float, float]]:
    """The AR star of each panel of a drawn Figure 1(b): (γ, E)."""
    return [
        (float(line.get_xdata()[0]), float(line.get_ydata()[0]))
        for ax in drawn.figure.axes
        for line in ax.get_lines()
        if line.get_label() == "AR (γ = 1)"
    ]


def test_1b_draws_ar_from_the_ar_decoded_beside_each_cell():
    """tiny_repro runs no method=ar cell: AR is decoded inside each SD cell, whose record holds its E as
    ar_experts_per_layer. The figure draws that, and its caption claims AR only when it drew it."""
    rows = [
        record("tiny_random", method, gamma=g, dataset=d, E=5.0 + g, ar_experts_per_layer=ar_e)
        for method in ("eagle3", "ecospec")
        for g in (2, 4)
        for d, ar_e in (("gsm8k", 4.0), ("humaneval", 5.0))
    ]
    drawn = unique_experts_figure(pd.DataFrame(rows))
    assert ar_points(drawn) == [(1.0, 4.5)]  # per dataset, then over datasets
    assert "AR as γ = 1" in drawn.caption
    own = unique_experts_figure(pd.DataFrame([*rows, record("tiny_random", "ar", gamma=4, E=3.0)]))
    assert ar_points(own) == [(1.0, 3.0)]  # a grid's own AR records win
    bare = unique_experts_figure(pd.DataFrame(rows).drop(columns="ar_experts_per_layer"))
    assert ar_points(bare) == [] and "AR" not in bare.caption
