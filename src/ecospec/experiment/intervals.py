"""A cell's 95 % intervals (speedup, α, E) by the paired bootstrap over its prompts (`analysis.bootstrap`).

The unit is a prompt, all its turns together; in a batched cell a batch (its sequences share every verify pass).
Each unit carries the method's tokens and seconds, the same prompts' AR tokens and seconds (our loop and, at batch 1,
transformers' `generate`), so every resample divides by the faster AR on the resampled prompts, as the cell does.
`pairing` says how the AR rows were measured: `paired` (interleaved prompt by prompt in the same job), `weakly
paired` (a cached AR of the same prompts, measured at another time), or `none` (no per-prompt AR: no speedup
interval).
"""

from __future__ import annotations

from collections import defaultdict

import numpy as np

from ecospec.analysis.bootstrap import bootstrap, ratio, speedup
from ecospec.experiment.metrics import hf_seconds, row_seconds


def unit_of(row: dict, batched: bool):
    """The resampling unit a prompt row belongs to: its batch in a batched cell, else its prompt."""
    return ("batch", row["batch"]) if batched else ("prompt", row["id"])


def unit_keys(rows: list[dict], batched: bool) -> list[str]:
    """The units' names in the order every *_units array lists them: 'prompt:<id>' or 'batch:<n>'."""
    return [f"{kind}:{key}" for kind, key in sorted({unit_of(r, batched) for r in rows})]


def speedup_units(rows: list[dict], ar_rows: list[dict], clock: str, batched: bool) -> np.ndarray | None:
    """[units, 6] SPEEDUP_COLUMNS per unit from the method's and AR's prompt rows (None: an AR row is missing)."""
    cols: dict = defaultdict(lambda: np.zeros(6))
    for r in rows:
        cols[unit_of(r, batched)][:2] += (r["n_tokens"], row_seconds(r, clock))
    seen = set()
    for r in ar_rows:
        u = unit_of(r, batched)
        if u not in cols:
            continue  # an AR prompt the method did not decode (a cache of more prompts)
        seen.add(u)
        cols[u][2:4] += (r["n_tokens"], row_seconds(r, clock))
        if "hf_seconds" in r:
            cols[u][4:6] += (r["hf_tokens"], hf_seconds(r, clock))
    if seen != set(cols):
        return None
    return np.array([cols[u] for u in sorted(cols)])


def alpha_units(rows: list[dict], batched: bool) -> np.ndarray:
    cols: dict = defaultdict(lambda: np.zeros(2))
    for r in rows:
        cols[unit_of(r, batched)] += (r["accepted"], r["steps"])
    return np.array([cols[u] for u in sorted(cols)])


def experts_units(rows: list[dict], batches: list[dict] | None) -> np.ndarray:
    """[units, 2]: unique experts summed over layers and passes / layers, passes (E = their ratio)."""
    if batches:
        items = [(b["experts_sum"], b["passes"]) for b in sorted(batches, key=lambda b: b["batch"])]
    else:
        per: dict = defaultdict(lambda: [None, 0])
        for r in rows:
            u = per[r["id"]]
            u[0] = r["experts_sum"] if u[0] is None else [a + b for a, b in zip(u[0], r["experts_sum"], strict=True)]
            u[1] += r["steps"]
        items = [tuple(per[k]) for k in sorted(per)]
    layers = max((len(e) for e, _ in items if e), default=0)
    return np.array([(sum(e) / layers if layers and e else 0.0, n) for e, n in items])


def cell_intervals(
    rows: list[dict],
    ar_rows: list[dict] | None,
    batches: list[dict] | None,
    clock: str,
    pairing: str,
    seed: int = 0,
) -> dict:
    """summary["intervals"]: speedup, alpha and E, each an `Interval` as a dict (None where undefined, e.g. one
    prompt), with the AR `pairing`, the clock, and the unit."""
    batched = bool(batches)
    unit = "batch" if batched else "prompt"
    out: dict = {"pairing": pairing, "clock": clock, "unit": unit}
    units = speedup_units(rows, ar_rows, clock, batched) if ar_rows and pairing != "none" else None
    if units is None:
        out["pairing"] = "none"
    iv = bootstrap([units], speedup, seed=seed, unit=unit) if units is not None else None
    out["speedup"] = iv.as_dict() if iv else None
    alpha, experts = alpha_units(rows, batched), experts_units(rows, batches)
    iv = bootstrap([alpha], ratio(0, 1), seed=seed, unit=unit)
    out["alpha"] = iv.as_dict() if iv else None
    iv = bootstrap([experts], ratio(0, 1), seed=seed, unit=unit)
    out["E"] = iv.as_dict() if iv else None
    # the per-unit columns themselves, so that the reports can pair two cells' units (method against method)
    out["units"] = {
        "keys": unit_keys(rows, batched),
        "speedup": None if units is None else units.tolist(),
        "alpha": alpha.tolist(),
        "E": experts.tolist(),
    }
    return out
