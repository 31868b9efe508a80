"""Latency from weight bytes: the roofline model of a step on a GPU profile (`modeled_step`, always *modeled*), and
the fits that calibrate it from measurements: a fixed overhead per pass from SD cells (`fit_overhead`), a per-layer
line from the verify-latency benchmark's records (`fit_latency`)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace

import numpy as np

from ecospec.analysis.hardware import HARDWARE, Hardware
from ecospec.analysis.weight_bytes import ModelCost, StepParts, as_cost, verify_hbm_bytes


def hardware_profile(hardware: str | Hardware) -> Hardware:
    """A GPU profile by name (`analysis.hardware.HARDWARE`), or the profile itself."""
    if isinstance(hardware, Hardware):
        return hardware
    if hardware not in HARDWARE:
        raise ValueError(f"unknown hardware {hardware!r}; profiles: {', '.join(HARDWARE)}")
    return HARDWARE[hardware]


def modeled_step(
    model: str | Mapping | ModelCost,
    alpha: float,
    experts_per_layer: float,
    hardware: str | Hardware,
    overhead_s: float | None = None,
    parts: StepParts | None = None,
) -> dict:
    """Roofline latency of one SD step: T_verify = verify bytes / HBM bandwidth + overhead; each draft pass and the
    predictor's pass (`parts`) cost their bytes / bandwidth + the same fixed overhead; T_step = T_verify + T_draft +
    T_pred, α tokens per step. AR is the verify pass with E = k and α = 1. `overhead_s` defaults to the profile's.
    Modeled, not measured: the dict says so."""
    if alpha <= 0:
        raise ValueError(f"alpha={alpha}: tokens per step must be positive")
    c, hw = as_cost(model), hardware_profile(hardware)
    parts = parts or StepParts()
    over = hw.overhead_s if overhead_s is None else overhead_s
    bw = hw.hbm_bytes_per_s
    hbm = verify_hbm_bytes(c, experts_per_layer)
    t_verify = hbm / bw + over
    t_draft = sum(b / bw + over for b in parts.draft)
    t_pred = parts.predictor / bw + over if parts.predictor else 0.0
    t_step = t_verify + t_draft + t_pred
    t_ar = verify_hbm_bytes(c, c.top_k) / bw + over
    return {
        "modeled": True,
        "hardware": hw.name,
        "hbm_bytes": hbm,
        "t_verify_s": t_verify,
        "t_draft_s": t_draft,
        "t_pred_s": t_pred,
        "t_step_s": t_step,
        "tokens_per_s": alpha / t_step,
        "ar_t_step_s": t_ar,
        "ar_tokens_per_s": 1.0 / t_ar,
        "speedup": alpha * t_ar / t_step,
    }


def fit_overhead(records: Iterable[Mapping], hardware: str | Hardware, model: str | None = None) -> float | None:
    """Least-squares fixed overhead per pass from SD cells: the mean over ok records measured on `hardware` (matched
    by record['env']['hardware']; of conf/model `model` if given) of t_verify − verify bytes / bandwidth.
    None if no record qualifies. Where the verify-latency benchmark measured the model on that GPU, `fit_latency`
    fits slope and intercept instead, and `LatencyFit.profile` replaces both the bandwidth and this overhead."""
    hw = hardware_profile(hardware)
    residuals = []
    for r in records:
        s = r.get("summary") or {}
        t, e = s.get("t_verify_s"), s.get("experts_per_layer")
        cfg = (r.get("config") or {}).get("model") or {}
        if r.get("status") != "ok" or t is None or e is None or (model is not None and cfg.get("name") != model):
            continue
        if not hw.matches((r.get("env") or {}).get("hardware", "")):
            continue
        residuals.append(t - verify_hbm_bytes(cfg, e) / hw.hbm_bytes_per_s)
    return sum(residuals) / len(residuals) if residuals else None


# -- measured per-layer cost (ecospec.bench.verify_latency records) ------------------------------------------------


def fit_line(x, y) -> tuple[float, float, float]:
    """Least-squares y = slope * x + intercept; returns (slope, intercept, R²). Needs two distinct x values."""
    x, y = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    dx, dy = x - x.mean(), y - y.mean()
    sxx = float(dx @ dx)
    if sxx == 0:
        raise ValueError("a line needs at least two distinct x values")
    slope = float(dx @ dy) / sxx
    intercept = float(y.mean() - slope * x.mean())
    ss_res = float(np.sum((y - (slope * x + intercept)) ** 2))
    ss_tot = float(dy @ dy)
    r2 = 1.0 - ss_res / ss_tot if ss_tot > 0 else 1.0
    return slope, intercept, r2


@dataclass(frozen=True)
class LatencyFit:
    """Per-layer verify-pass latency measured by `ecospec.bench.verify_latency` on a few real-shape MoE layers:
    t_layer(E) = slope_s · E + intercept_s (seconds per expert-layer; fixed seconds per layer), least squares over
    its records of one implementation, model and device."""

    model: str
    impl: str
    hardware: str  # the device name the records were measured on
    layers: int  # decoder layers the benchmark timed together
    records: int
    slope_s: float
    intercept_s: float
    r2: float
    expert_bytes: float  # one routed expert as the benchmark stored it
    dense_layer_bytes: float  # the rest of one benchmarked layer

    def t_layer(self, experts_per_layer: float) -> float:
        return self.slope_s * experts_per_layer + self.intercept_s

    @property
    def bytes_per_s(self) -> float:
        """Achieved bandwidth on expert reads: one expert's bytes per fitted second per expert-layer."""
        return self.expert_bytes / self.slope_s

    def profile(self, hardware: str | Hardware, model: str | Mapping | ModelCost) -> Hardware:
        """`hardware` with the fitted numbers, scaled from the measured layers to the model's full depth: bandwidth
        = `bytes_per_s`, overhead = MoE layers × (intercept − a layer's dense bytes / that bandwidth). Then
        `modeled_step(model, α, E, profile)` gives T_verify = MoE layers × t_layer(E) + the model's other bytes
        (dense layers, lm_head) at the fitted bandwidth, and the checkpoint's own storage bytes where the benchmark
        stood in with bf16 (fp8, mxfp4) are read at that bandwidth too."""
        if self.slope_s <= 0:
            raise ValueError(f"{self.describe()}: a slope <= 0 has no bandwidth (too few or too noisy records)")
        hw, c = hardware_profile(hardware), as_cost(model)
        bw = self.bytes_per_s
        overhead = c.moe_layers * (self.intercept_s - self.dense_layer_bytes / bw)
        return replace(hw, hbm_bytes_per_s=bw, overhead_s=overhead, source=f"verify-latency fit {self.describe()}")

    def describe(self) -> str:
        return (
            f"{self.impl}: {self.slope_s * 1e3:.4g} ms per expert-layer + {self.intercept_s * 1e3:.4g} ms per layer "
            f"(R² {self.r2:.3f}; {self.records} records, {self.layers} layer{'s' if self.layers != 1 else ''}, "
            f"{self.hardware})"
        )


def fit_latency(
    records: Iterable[Mapping],
    impl: str | None = None,
    model: str | None = None,
    hardware: str | Hardware | None = None,
) -> LatencyFit | None:
    """Least-squares t_pass / layers = slope · E + intercept over the ok `verify_latency` records (of `impl`,
    conf/model `model` and the GPU profile `hardware`, each if given; AR points enter at E = k). The records must
    share one shape (layers, expert and dense bytes: one scale and storage) and implementation; None if fewer than
    two distinct E values qualify."""
    from ecospec.bench import KIND

    hw = None if hardware is None else hardware_profile(hardware)
    rows = [
        r
        for r in records
        if r.get("kind") == KIND
        and r.get("status", "ok") == "ok"
        and (impl is None or r.get("impl") == impl)
        and (model is None or r.get("model") == model)
        and (hw is None or hw.matches(r.get("hardware") or ""))
    ]
    if not rows:
        return None
    keys = {(r["impl"], r["model"], r["layers"], r["expert_bytes"], r["dense_layer_bytes"]) for r in rows}
    if len(keys) > 1:
        raise ValueError(f"verify_latency records of {len(keys)} implementations or shapes; fit one at a time")
    x = [float(r["E"]) for r in rows]
    if len(set(x)) < 2:
        return None
    slope, intercept, r2 = fit_line(x, [float(r["t_pass_s"]) / r["layers"] for r in rows])
    first = rows[0]
    return LatencyFit(
        model=first["model"],
        impl=first["impl"],
        hardware=first.get("hardware") or "",
        layers=first["layers"],
        records=len(rows),
        slope_s=slope,
        intercept_s=intercept,
        r2=r2,
        expert_bytes=first["expert_bytes"],
        dense_layer_bytes=first["dense_layer_bytes"],
    )
