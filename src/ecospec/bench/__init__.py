"""Device benchmarks that need no checkpoint: `verify_latency` times a verify pass through real-shape MoE decoder
layers with random weights, its routing forced to touch exactly E unique experts per layer (the EcoSpec paper's
Figure 1(a)), and writes one record per point that `make tables` draws and fits (`ecospec.report.fig1a`).

This module stays free of torch, transformers and Hydra: the reports read its record name and the job validation
checks its settings without loading anything.
"""

from __future__ import annotations

from collections.abc import Mapping

KIND = "verify_latency"  # record["kind"] of one benchmark point
RECORD_SUFFIX = ".verify_latency.json"  # one point's file: <out>/<run>/<impl>-g<gamma>-E<E>.verify_latency.json
IMPLS = ("eager", "grouped_mm", "batched_mm")  # transformers' experts implementations the benchmark knows
# what identifies a run of experiment=fig1a (its Hydra job id), besides the model
SETTINGS = (
    "layers",
    "gammas",
    "impls",
    "scale",
    "points",
    "experts",
    "repeats",
    "warmup",
    "prefix",
    "peak_tbps",
    "seed",
)


def _int_list(value) -> list | None:
    if isinstance(value, str) or not isinstance(value, list | tuple) or not value:
        return None
    ok = all(isinstance(v, int) and not isinstance(v, bool) for v in value)
    return list(value) if ok else None


def settings_problem(s: Mapping) -> str | None:
    """Why benchmark settings (the `fig1a` block of experiment=fig1a, or the CLI's flags) cannot run, as
    "key=value: what is allowed"; None when they can."""

    def count(key: str, low: int) -> bool:
        v = s.get(key)
        return isinstance(v, int) and not isinstance(v, bool) and v >= low

    for key, low in (("layers", 1), ("points", 1), ("repeats", 20), ("warmup", 0), ("prefix", 0), ("seed", 0)):
        if key in s and not count(key, low):
            return f"{key}={s.get(key)!r}: must be an integer >= {low}"
    gammas = _int_list(s.get("gammas"))
    if gammas is None or min(gammas) < 2:
        return f"gammas={s.get('gammas')!r}: a non-empty list of integers >= 2 (tokens per verify pass, root included)"
    impls = s.get("impls")
    if isinstance(impls, str) or not isinstance(impls, list | tuple) or not impls or set(impls) - set(IMPLS):
        return f"impls={impls!r}: a non-empty list from {', '.join(IMPLS)}"
    scale = s.get("scale")
    if isinstance(scale, bool) or not isinstance(scale, int | float) or not 0 < scale <= 1:
        return f"scale={scale!r}: a number in (0, 1] (1 = the model's real widths)"
    experts = s.get("experts")
    if experts is not None and (_int_list(experts) is None or min(experts) < 1):
        return f"experts={experts!r}: null (sweep `points` values of E) or a list of integers >= 1"
    peak = s.get("peak_tbps")
    if peak is not None and (isinstance(peak, bool) or not isinstance(peak, int | float) or peak <= 0):
        return f"peak_tbps={peak!r}: null (the detected GPU's datasheet peak) or a bandwidth in TB/s > 0"
    return None
