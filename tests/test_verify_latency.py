"""The verify-latency benchmark (ecospec.bench.verify_latency): forced routing, its records, and the per-layer fit
that `make tables` draws (report.fig1a) and the modeled table uses (analysis.latency.fit_latency). CPU, seconds."""

from __future__ import annotations

import json
import statistics
from datetime import UTC, datetime

import pytest
import torch

from ecospec.analysis.hardware import HARDWARE
from ecospec.analysis.latency import LatencyFit, fit_latency, modeled_step
from ecospec.analysis.weight_bytes import model_cost, step_parts
from ecospec.bench import KIND, RECORD_SUFFIX, settings_problem
from ecospec.bench.verify_latency import (
    ForcedRouting,
    Pass,
    _classes,
    bench_config,
    build_stack,
    e_values,
    experts_seen,
    forced_indices,
    layer_bytes,
    model_config,
    run,
)

torch.set_num_threads(1)
SMALL = 0.02  # widths x 0.02: a real model's layer in well under a second on a CPU


def test_forced_indices_cover_exactly_e_experts():
    gen = torch.Generator().manual_seed(0)
    for gamma, k, n in ((4, 8, 128), (16, 8, 128), (16, 4, 32), (3, 2, 8)):
        for e in e_values(gamma, k, n, points=5):
            idx = forced_indices(gamma, k, e, n, gen)
            assert idx.shape == (gamma, k)
            assert idx.unique().numel() == e  # exactly E unique experts over the pass
            assert all(row.unique().numel() == k for row in idx)  # each token k distinct experts
            assert 0 <= int(idx.min()) and int(idx.max()) < n
            counts = torch.bincount(idx.flatten(), minlength=n)[idx.unique()]
            assert int(counts.max()) - int(counts.min()) <= 1  # balanced over the E
    with pytest.raises(ValueError, match="E=3"):
        forced_indices(4, 4, 3, 32, gen)  # fewer than top-k
    with pytest.raises(ValueError, match="E=17"):
        forced_indices(4, 4, 17, 32, gen)  # more than γk


def test_e_values_span_top_k_to_the_ceiling():
    assert e_values(4, 8, 128, points=3) == [8, 20, 32]
    assert e_values(16, 8, 128, points=2) == [8, 128]
    assert e_values(16, 2, 8, points=9) == [2, 3, 4, 5, 6, 7, 8]  # capped by N, no duplicates
    assert e_values(4, 8, 128, points=9, experts=[4, 8, 16, 64]) == [8, 16]  # explicit, clipped to the range


@pytest.mark.parametrize("name", ["qwen3", "gptoss", "deepseek", "mixtral"])
def test_bench_layers_keep_n_and_k_and_routing_is_forced(name):
    """Real-class layers at scaled widths keep N and k; every layer's experts module receives exactly E unique
    experts (captured at its input), for each experts implementation."""
    model = model_config(name)
    full = bench_config(model, 1, 1.0)
    config = bench_config(model, 2, SMALL)
    assert config.hidden_size < full.hidden_size and config.num_hidden_layers == 2
    stack = build_stack(config, torch.float32, "cpu")
    facts = model["facts"]["hf_config"]
    n = facts.get("num_experts") or facts.get("num_local_experts") or facts.get("n_routed_experts")
    assert (stack.num_experts, stack.top_k) == (n, facts["num_experts_per_tok"])
    gamma, k = 4, stack.top_k
    one = Pass(stack, gamma, prefix=8)
    gen = torch.Generator().manual_seed(1)
    with ForcedRouting(stack.routers) as forcing:
        for impl in ("eager", "grouped_mm"):
            config._experts_implementation = impl
            for e in (k, min(n, gamma * k)):
                forcing.indices = [forced_indices(gamma, k, e, n, gen) for _ in stack.layers]
                assert experts_seen(stack, one) == [e, e]
    assert experts_seen(stack, one) == [len(r.unique()) for r in _router_top_k(stack, one)]  # unforced again


def _router_top_k(stack, one):
    """The routers' own top-k indices of a pass (no forcing)."""
    got = []
    handles = [r.register_forward_hook(lambda m, a, out: got.append(out[2])) for r in stack.routers]
    one()
    for h in handles:
        h.remove()
    return got


def test_only_the_forced_experts_contribute():
    """Zeroing every expert outside the forced set leaves a pass's output unchanged; zeroing one inside it does not."""
    config = bench_config(model_config("qwen3"), 2, SMALL)
    stack = build_stack(config, torch.float32, "cpu", seed=3)
    gamma, k, n = 4, stack.top_k, stack.num_experts
    gen = torch.Generator().manual_seed(2)
    chosen = [forced_indices(gamma, k, 12, n, gen) for _ in stack.layers]
    one = Pass(stack, gamma, prefix=8)
    with ForcedRouting(stack.routers) as forcing, torch.no_grad():
        forcing.indices = chosen
        before = one().clone()
        for experts, idx in zip(stack.experts, chosen, strict=True):
            unused = torch.ones(n, dtype=torch.bool)
            unused[idx.unique()] = False
            experts.gate_up_proj[unused] = 0
            experts.down_proj[unused] = 0
        assert torch.equal(one(), before)
        stack.experts[1].down_proj[chosen[1][0, 0]] = 0
        assert not torch.allclose(one(), before)


def test_records_schema(tmp_path):
    recs = run(
        "qwen3",
        layers=1,
        gammas=[2],
        impls=["eager", "grouped_mm"],
        scale=SMALL,
        device="cpu",
        out=tmp_path,
        points=2,
        repeats=20,
        warmup=1,
        echo=None,
    )
    files = sorted(tmp_path.rglob(f"*{RECORD_SUFFIX}"))
    assert len(recs) == len(files) == 6  # per impl: AR (E = k) and γ = 2 at E = 8, 16
    assert {f.parent.name for f in files} == {f"qwen3-L1-s{SMALL:g}-cpu"}
    assert {(r["impl"], r["gamma"], r["E"]) for r in recs} == {
        (i, g, e) for i in ("eager", "grouped_mm") for g, e in ((1, 8), (2, 8), (2, 16))
    }
    on_disk = json.loads((files[0].parent / f"eager-g2-E16{RECORD_SUFFIX}").read_text())
    for key in (
        "kind",
        "model",
        "layers",
        "impl",
        "gamma",
        "E",
        "scale",
        "storage",
        "t_pass_s",
        "bytes",
        "gbps",
        "hardware",
        "expert_bytes",
        "dense_layer_bytes",
        "times_s",
        "top_k",
        "num_experts",
        "env",
    ):
        assert key in on_disk, key
    r = on_disk
    assert (r["kind"], r["model"], r["layers"], r["impl"], r["gamma"], r["E"]) == (KIND, "qwen3", 1, "eager", 2, 16)
    assert (r["scale"], r["storage"], r["top_k"], r["num_experts"], r["device"]) == (SMALL, "bf16", 8, 128, "cpu")
    assert len(r["times_s"]) == 20 and r["t_pass_s"] == statistics.median(r["times_s"]) > 0
    assert r["bytes"] == r["layers"] * (r["E"] * r["expert_bytes"] + r["dense_layer_bytes"])
    assert r["gbps"] == pytest.approx(r["bytes"] / r["t_pass_s"] / 1e9)
    assert r["bw_fraction"] is None and r["hbm_peak_bytes_per_s"] is None  # a CPU has no HBM peak
    assert r["hardware"].endswith("threads)") and r["timer"] == "perf_counter"
    deepseek = run(
        "deepseek",
        layers=1,
        gammas=[2],
        impls=["eager"],
        scale=SMALL,
        device="cpu",
        out=tmp_path,
        points=1,
        repeats=20,
        warmup=0,
        echo=None,
        peak_tbps=1.0,
    )
    assert {x["storage"] for x in deepseek} == {"bf16 (fp8 unavailable)"}  # no fp8 experts kernel: bf16 stands in
    assert all(x["bw_fraction"] == pytest.approx(x["bytes"] / x["t_pass_s"] / 1e12) for x in deepseek)


def test_bench_bytes_match_the_cost_model():
    """At scale 1 a benchmark layer holds exactly the cost model's expert bytes, and MoE layers x its dense bytes
    is the model's dense bytes but for lm_head and the final norm (counted on the meta device)."""
    for name, store in (("qwen3", None), ("gptoss", dict.fromkeys(("experts", "dense", "other"), "bf16"))):
        config = bench_config(model_config(name), 1, 1.0)
        with torch.device("meta"):
            layer = _classes(config)[1](config, 0).to(torch.bfloat16)
        eb, db = layer_bytes(layer)
        c = model_cost(name, storage=store)
        assert eb == c.expert_bytes
        assert c.dense_bytes - c.moe_layers * db == (config.vocab_size + 1) * config.hidden_size * 2


def _synthetic(
    slope,
    intercept,
    impl="grouped_mm",
    layers=4,
    hardware="NVIDIA H200",
    scale=1.0,
    model="qwen3",
    expert_bytes=37748736,
    dense_layer_bytes=105_000_000,
    noise=0.0,
):
    """Records with t_pass = layers x (slope x E + intercept) (x 1 ± noise), over γ 4, 8, 16 and AR (E = k = 8)."""
    gen = torch.Generator().manual_seed(0)
    out = []
    for gamma in (1, 4, 8, 16):
        for e in [8] if gamma == 1 else e_values(gamma, 8, 128, points=5):
            t = layers * (slope * e + intercept) * (1 + noise * float(torch.randn(1, generator=gen)))
            nbytes = layers * (e * expert_bytes + dense_layer_bytes)
            out.append(
                {
                    "kind": KIND,
                    "status": "ok",
                    "model": model,
                    "layers": layers,
                    "impl": impl,
                    "gamma": gamma,
                    "E": e,
                    "scale": scale,
                    "storage": "bf16",
                    "t_pass_s": t,
                    "t_layer_s": t / layers,
                    "expert_bytes": expert_bytes,
                    "dense_layer_bytes": dense_layer_bytes,
                    "top_k": 8,
                    "num_experts": 128,
                    "bytes": nbytes,
                    "hbm_peak_bytes_per_s": 4.8e12,
                    "bw_fraction": nbytes / t / 4.8e12,
                    "hardware": hardware,
                    "device": "cuda:0",
                    "finished": datetime(2026, 12, 1, tzinfo=UTC).isoformat(),
                }
            )
    return out


def test_fit_recovers_a_known_linear_cost():
    a, b = 9.5e-6, 31e-6  # 9.5 µs per expert-layer, 31 µs per layer
    fit = fit_latency(_synthetic(a, b))
    assert isinstance(fit, LatencyFit)
    assert (fit.slope_s, fit.intercept_s, fit.r2) == (pytest.approx(a), pytest.approx(b), pytest.approx(1.0))
    noisy = fit_latency(_synthetic(a, b, noise=0.01))
    assert noisy.slope_s == pytest.approx(a, rel=0.05) and noisy.intercept_s == pytest.approx(b, rel=0.2)
    both = _synthetic(a, b) + _synthetic(2 * a, b, impl="eager")
    assert fit_latency(both, impl="eager").slope_s == pytest.approx(2 * a)
    assert fit_latency(both, impl="eager", hardware="H200").records == 16
    assert fit_latency(both, impl="eager", hardware="H100") is None  # measured on another GPU
    with pytest.raises(ValueError, match="implementations or shapes"):
        fit_latency(both)
    assert fit_latency(_synthetic(a, b)[:1]) is None  # one E value: no line


def test_fit_scales_the_measured_layers_to_full_depth():
    """The fitted profile gives T_verify = MoE layers x (slope E + intercept) + the bytes outside the layers (lm_head,
    final norm) at the fitted bandwidth; AR the same at E = k."""
    cost = model_cost("qwen3")
    config = bench_config(model_config("qwen3"), 1, 1.0)
    with torch.device("meta"):
        eb, db = layer_bytes(_classes(config)[1](config, 0).to(torch.bfloat16))
    a, b = 9.5e-6, 31e-6
    fit = fit_latency(_synthetic(a, b, expert_bytes=eb, dense_layer_bytes=db))
    profile = fit.profile("H200", cost)
    assert profile.name == "H200" and profile.hbm_bytes_per_s == pytest.approx(eb / a)
    rest = (config.vocab_size + 1) * config.hidden_size * 2
    for e in (8, 23.7, 64):
        got = modeled_step(cost, 2.0, e, profile)
        assert got["t_verify_s"] == pytest.approx(94 * (a * e + b) + rest / profile.hbm_bytes_per_s)
        assert got["ar_t_step_s"] == pytest.approx(94 * (a * 8 + b) + rest / profile.hbm_bytes_per_s)
    with pytest.raises(ValueError, match="slope"):
        fit_latency(_synthetic(-a, b)).profile("H200", cost)


def _write(records, root):
    for r in records:
        name = f"{r['impl']}-g{r['gamma']}-E{r['E']}-s{r['scale']}{RECORD_SUFFIX}"
        path = root / r["hardware"].replace(" ", "_") / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(r))


def test_report_figure_and_fitted_profiles(tmp_path):
    from ecospec.report.fig1a import NAME, latency_profiles, load_bench, write_bench_figure
    from ecospec.report.roofline import modeled_note

    a, b = 9.5e-6, 31e-6
    _write(
        _synthetic(a, b)
        + _synthetic(2 * a, b, impl="eager")
        + _synthetic(a / 2, b, scale=0.5)
        + _synthetic(a / 3, b, hardware="NVIDIA H100 80GB HBM3", model="gptoss"),
        tmp_path / "fig1a",
    )
    (tmp_path / "fig1a" / f"broken{RECORD_SUFFIX}").write_text("{not json")
    with pytest.warns(UserWarning, match="broken"):
        frame = load_bench([tmp_path])
    assert len(frame) == 4 * 16 and set(frame["run"]) == {"NVIDIA_H200", "NVIDIA_H100_80GB_HBM3"}
    infos = write_bench_figure(frame, tmp_path / "figures")
    assert [p.name for p in infos[0].files] == [f"{NAME}.png", f"{NAME}.pdf"] and infos[0].n_records == 64
    assert "grouped_mm 0.00950 ms/expert-layer + 0.0310 ms/layer" in infos[0].caption.replace(":", "")
    assert "of HBM peak" in infos[0].caption
    assert write_bench_figure(frame.iloc[0:0], tmp_path / "figures") == []
    assert not (tmp_path / "figures" / f"{NAME}.png").exists()  # no records: the old files go

    profiles = latency_profiles(frame, {"qwen3": model_cost("qwen3")})
    assert list(profiles) == [("qwen3", "H200")]  # gptoss has no cost entry; the scale-0.5 run never counts
    h200 = profiles[("qwen3", "H200")]
    assert h200.hbm_bytes_per_s == pytest.approx(37748736 / a)  # the faster implementation (grouped_mm)
    assert "grouped_mm" in h200.source and h200.hbm_bytes_per_s != HARDWARE["H200"].hbm_bytes_per_s
    note = modeled_note("", 0, "none", {("qwen3", "H100"): (0.001, 3)}, profiles)
    assert "H200: fitted from records measured on it: Qwen3-235B-A22B" in note and "TB/s effective" in note
    assert "H100: fitted from records measured on it: Qwen3-235B-A22B 1.00 ms (3 records)" in note


def test_settings_and_the_fig1a_job_config():
    from ecospec.experiment.config import ConfigError, job_name, validate_job
    from ecospec.experiment.kinds import job_config

    good = {
        "layers": 2,
        "gammas": [4, 8],
        "impls": ["eager"],
        "scale": 1.0,
        "points": 3,
        "experts": None,
        "repeats": 20,
        "warmup": 2,
        "prefix": 64,
        "peak_tbps": None,
        "seed": 0,
    }
    assert settings_problem(good) is None
    assert "gammas" in settings_problem({**good, "gammas": [1, 4]})
    assert "repeats" in settings_problem({**good, "repeats": 5})
    assert "impls" in settings_problem({**good, "impls": ["fast"]})
    assert "scale" in settings_problem({**good, "scale": 2})
    d = {"job": "fig1a", "model": model_config("qwen3"), "fig1a": good}
    validate_job(d)
    assert job_config(d)["fig1a"] == good and job_name(d).startswith("fig1a-qwen3-")
    with pytest.raises(ConfigError, match="fig1a.gammas"):
        validate_job({**d, "fig1a": {**good, "gammas": []}})


def test_the_modeled_table_takes_the_fitted_profile():
    from ecospec.report.moespec import table_moespec
    from ecospec.report.records import records_frame
    from ecospec.report.roofline import modeled

    method = {"name": "eagle3", "drafter": "eagle3", "selector": "confidence", "predictor": None}
    cell = {
        "schema": 1,
        "kind": "cell",
        "status": "ok",
        "experiment": "t1",
        "cell": "c",
        "cell_id": "0",
        "finished": "2026-12-01T00:00:00+00:00",
        "env": {"hardware": "NVIDIA H200", "device": "cuda:0"},
        "config": {
            "model": model_config("qwen3"),
            "method": method,
            "dataset": {"name": "gsm8k"},
            "temperature": 0.0,
            "top_p": 1.0,
            "gamma": 4,
            "depth": 3,
            "topk": 2,
            "batch_size": 1,
            "split": "heldout",
            "seed": 0,
        },
        "summary": {"alpha": 2.4, "experts_per_layer": 23.7, "t_verify_s": 0.8},
    }
    frame = records_frame([(cell, "t1/c/result.json")]).frame
    cost = model_cost("qwen3")
    profile = fit_latency(_synthetic(9.5e-6, 31e-6)).profile("H200", cost)
    out = modeled(frame, {"qwen3": cost}, profiles={("qwen3", "H200"): profile})
    parts = step_parts(model_config("qwen3"), "eagle3", 3, predictor=False)  # the whole step: 3 head passes
    fitted = modeled_step(cost, 2.4, 23.7, profile, parts=parts)
    roofline = modeled_step(cost, 2.4, 23.7, "H100", overhead_s=0.0, parts=parts)
    assert out["H200 t_verify_ms"].iloc[0] == pytest.approx(fitted["t_verify_s"] * 1e3)
    assert out["H200 speedup"].iloc[0] == pytest.approx(fitted["speedup"])
    assert out["H100 t_verify_ms"].iloc[0] == pytest.approx(roofline["t_verify_s"] * 1e3)  # no benchmark on it
    # the MoE-Spec table's modeled columns come from the same profiles
    capped = {
        **cell,
        "cell": "d",
        "cell_id": "1",
        "summary": {
            **cell["summary"],
            "alpha": 2.3,
            "experts_per_layer": 15.0,
            "budget_error_rate": 0.01,
            "matches_ar": 0.5,
        },
    }
    capped["config"] = {
        **cell["config"],
        "expert_budget": 16,
        "budget_policy": "truncate",
        "method": {**method, "name": "moespec"},
    }
    both = records_frame([(cell, "t1/c/result.json"), (capped, "t1/d/result.json")]).frame
    table = table_moespec(both, {"qwen3": cost}, profiles={("qwen3", "H200"): profile}).set_index("Budget")
    assert table.loc["B=16", "modeled H200 speedup"] == pytest.approx(
        modeled_step(cost, 2.3, 15.0, profile, parts=parts)["speedup"]
    )
    assert table.loc["B=16", "modeled H100 speedup"] == pytest.approx(
        modeled_step(cost, 2.3, 15.0, "H100", overhead_s=0.0, parts=parts)["speedup"]
    )


def test_compiled_engine_option_refuses_what_it_cannot_time(tmp_path):
    kw = dict(layers=1, gammas=[2], scale=SMALL, device="cpu", out=tmp_path, points=1, repeats=20, echo=None)
    with pytest.raises(ValueError, match="Qwen3-MoE only"):
        run("mixtral", engines=["compiled"], **kw)
    with pytest.raises(ValueError, match="engines="):
        run("qwen3", engines=["fast"], **kw)


@pytest.mark.compiled
def test_compiled_engine_records(tmp_path):
    """`--engine compiled`: the compiled engine's verify step timed at exactly E experts per layer (the routes it
    writes are checked against E before timing), one record per point, impl `compiled`."""
    recs = run(
        "tiny",
        layers=2,
        gammas=[4],
        device="cpu",
        out=tmp_path,
        points=2,
        repeats=20,
        warmup=1,
        echo=None,
        engines=["compiled"],
    )
    assert {(r["impl"], r["gamma"], r["E"]) for r in recs} == {
        ("compiled", 1, 4),
        ("compiled", 4, 4),
        ("compiled", 4, 16),
    }
    for r in recs:
        assert r["engine"] == "compiled" and r["t_pass_s"] > 0 and len(r["times_s"]) == 20
        assert r["bytes"] == r["layers"] * (r["E"] * r["expert_bytes"] + r["dense_layer_bytes"])
    assert len(list(tmp_path.rglob(f"compiled-g4-E16{RECORD_SUFFIX}"))) == 1
