"""One prepared check of the framework on a device: the first thing to run on a new GPU machine (issue 25).

    python -m ecospec.bench.gpu_check --device cuda --out /tmp/gpu_check      # one H200-class GPU: a few minutes
    python -m ecospec.bench.gpu_check --device cpu --out /tmp/gpu_check       # the same steps on a CPU: seconds
    python src/ecospec/bench/gpu_check.py --print-deps                        # pyproject's dependencies minus torch

Steps (each timed and recorded; one that fails does not stop the others; the exit code is 1 if any failed):

* `sd_vs_ar`: greedy SD (`ecospec.generate` with a perturbed-copy draft model, EcoSpec selector, oracle predictor)
  against AR on one tiny random model of each family (Qwen3-MoE, GPT-OSS, DeepSeek-V3, Mixtral). fp32: token for
  token (asserted). bf16: `matches_ar` (share of prompts equal to AR) and each prompt's first divergence, recorded,
  not asserted: a batched bf16 verify pass need not be bitwise a 1-token step. Beside them, per family and dtype,
  the largest logit difference and the share of argmax flips between one causal forward over a sequence and the
  same sequence fed one token at a time through the KV cache (`block_vs_step`), and how often bf16 AR still equals
  fp32 AR: what a divergence is measured against.
* `run_cell`: one `model=tiny_random` cell through `run.py` (a subprocess, offline, no W&B), its record's status,
  α, speedup, matches_ar and env.storage.
* `routes_grouped_mm`: the routes every MoE layer captures (`engine.routing.RoutingCapture`) under transformers'
  `grouped_mm` experts equal those under `eager`, same weights and tokens: fp32 asserted, bf16 recorded. On a CPU a
  `grouped_mm` that is missing or raises is a recorded skip; on a GPU it is a failure.
* `verify_latency`: `ecospec.bench.verify_latency` (Figure 1(a)) on the qwen3 and gptoss layer shapes: the real
  shapes on a GPU, widths x 0.02 on a CPU; records under `<out>/fig1a` (what `make tables` draws).

Writes `<out>/gpu_check.json` (env, every step's status, time, result or error) and prints a short table; run.py's
cell goes under `<out>/cells`. Needs torch >= 2.11 (checked first) and the project's other dependencies; on a
machine whose torch must stay, docs/cluster.md "Before your first GPU run" gives the install sequence. The module's
top level imports only the standard library, so `--print-deps` runs before any dependency is installed.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
import traceback
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from pathlib import Path

MIN_TORCH = (2, 11)
ROOT = Path(__file__).resolve().parents[3]  # the checkout: pyproject.toml, run.py, conf/
SD = {"selector": "ecospec", "predictor": "oracle", "gamma": 4, "depth": 3, "topk": 2}
VL_MODELS = ("qwen3", "gptoss")
# per device: prompts and new tokens of sd_vs_ar; the verify_latency sweep
SIZES = {
    "cpu": {
        "prompts": 3,
        "prompt_len": 24,
        "new_tokens": 24,
        "cell_prompts": 2,
        "cell_tokens": 16,
        "vl": {"layers": 1, "gammas": [4], "scale": 0.02, "points": 3, "repeats": 20, "warmup": 2, "prefix": 16},
    },
    "cuda": {
        "prompts": 6,
        "prompt_len": 32,
        "new_tokens": 40,
        "cell_prompts": 4,
        "cell_tokens": 32,
        "vl": {"layers": 4, "gammas": [4, 8, 16], "scale": 1.0, "points": 9, "repeats": 20, "warmup": 5, "prefix": 64},
    },
}
OFFLINE_ENV = {
    "HF_HUB_OFFLINE": "1",
    "HF_DATASETS_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "WANDB_MODE": "disabled",
    "WANDB_SILENT": "true",
}


class Skip(Exception):
    """A step that cannot run here (its reason is recorded; not a failure)."""


class StepFailed(Exception):
    """A step that ran and found something wrong: its partial result is kept in the record."""

    def __init__(self, message: str, result: dict | None = None):
        super().__init__(message)
        self.result = result


# -- before anything heavy: dependencies and the torch version ------------------------------------------------------


def dependencies(pyproject: Path | None = None) -> list[str]:
    """The project's runtime dependencies minus torch: from pyproject.toml in the checkout (tomllib, no install
    needed), else from the installed package's metadata."""
    path = pyproject or ROOT / "pyproject.toml"
    if path.exists():
        import tomllib

        deps = tomllib.loads(path.read_text())["project"]["dependencies"]
    else:
        from importlib.metadata import requires

        deps = [r for r in requires("ecospec") or [] if "extra ==" not in r]
    return [d for d in deps if _req_name(d) != "torch"]


def _req_name(requirement: str) -> str:
    return re.split(r"[\s\[<>=!~;@]", requirement.strip(), maxsplit=1)[0].lower().replace("_", "-")


def torch_problem(version: str) -> str | None:
    """Why this torch cannot run the check (older than MIN_TORCH), or None."""
    m = re.match(r"(\d+)\.(\d+)", version)
    if m and (int(m[1]), int(m[2])) >= MIN_TORCH:
        return None
    need = ".".join(map(str, MIN_TORCH))
    return (
        f"torch {version} is older than {need}: the check needs torch >= {need}; keep the machine's own CUDA "
        f"torch if it is >= {need}, else install one (docs/cluster.md, 'Before your first GPU run')"
    )


# -- helpers ----------------------------------------------------------------------------------------------------


def _git(*args: str) -> str | None:
    try:
        out = subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() if out.returncode == 0 else None


def environment(device) -> dict:
    import torch
    import transformers

    from ecospec import __version__

    cuda = torch.cuda.is_available()
    dirty = _git("status", "--porcelain", "--untracked-files=no")
    return {
        "python": sys.version.split()[0],
        "torch": torch.__version__,
        "torch_cuda": torch.version.cuda,
        "cuda_available": cuda,
        "device": str(device),
        "device_name": torch.cuda.get_device_name(device) if device.type == "cuda" else _cpu_name(),
        "device_capability": list(torch.cuda.get_device_capability(device)) if device.type == "cuda" else None,
        "transformers": transformers.__version__,
        "ecospec": __version__,
        "git_commit": _git("rev-parse", "HEAD"),
        "git_dirty": None if dirty is None else bool(dirty),
        "float32_matmul_precision": torch.get_float32_matmul_precision(),
        "torch_threads": torch.get_num_threads(),
    }


def _cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    import platform

    return platform.processor() or platform.machine()


def _prompts(n: int, length: int, vocab: int, seed: int = 0):
    import torch

    gen = torch.Generator().manual_seed(seed)
    return [torch.randint(3, vocab, (1, length + i % 3), generator=gen) for i in range(n)]


def _first_divergence(a: Sequence[int], b: Sequence[int]) -> int | None:
    """First index where the two token lists differ (a length difference counts), None if equal."""
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


# -- step: greedy SD vs AR ---------------------------------------------------------------------------------------


def block_vs_step(target, ids) -> dict:
    """The logits of the second half of `ids` [1, n] (after a prefill of the first half) from one block forward
    against the same tokens fed one at a time through the KV cache (AR steps, the model's own causal mask): the
    block as the engine verifies a chain (`verify`: explicit visibility, additive mask, sliding windows applied by
    it) and as one causal forward (`causal`: the model builds its mask). Per variant: the largest |logit
    difference|, the share of positions whose argmax differs, and whether the logits are bitwise equal."""
    import torch

    from ecospec.engine.forward import attention_layout, forward_block, new_cache

    layout = attention_layout(target.config, target)
    dev = target.device
    ids = ids.to(dev)
    n = ids.shape[1]
    p = n // 2
    q = n - p

    def prefilled():
        cache = new_cache()
        forward_block(target, layout, cache, ids[:, :p], torch.arange(p, device=dev)[None], None, None)
        return cache

    with torch.inference_mode():
        cache = prefilled()
        step = torch.stack(
            [
                forward_block(target, layout, cache, ids[:, i : i + 1], torch.tensor([[i]], device=dev), None, None)
                .logits[0, -1]
                .float()
                for i in range(p, n)
            ]
        )
        qpos = torch.arange(p, n, device=dev)[None]
        kpos = torch.arange(n, device=dev) if layout.windowed else None
        vis = torch.cat(
            [torch.ones(q, p, dtype=torch.bool, device=dev), torch.ones(q, q, dtype=torch.bool, device=dev).tril()], 1
        )
        blocks = {
            "verify": forward_block(target, layout, prefilled(), ids[:, p:], qpos, kpos, vis).logits[0].float(),
            "causal": forward_block(target, layout, prefilled(), ids[:, p:], qpos, None, None).logits[0].float(),
        }
    return {
        name: {
            "positions": q,
            "max_abs_logit_diff": float((block - step).abs().max()),
            "argmax_flips": int((block.argmax(-1) != step.argmax(-1)).sum()),
            "bitwise_equal": bool(torch.equal(block, step)),
        }
        for name, block in blocks.items()
    }


def _merge_block_vs_step(per_prompt: list[dict]) -> dict:
    """block_vs_step over several prompts: the largest difference, flips summed, bitwise equal on all."""
    return {
        name: {
            "positions": sum(r[name]["positions"] for r in per_prompt),
            "max_abs_logit_diff": max(r[name]["max_abs_logit_diff"] for r in per_prompt),
            "argmax_flips": sum(r[name]["argmax_flips"] for r in per_prompt),
            "bitwise_equal": all(r[name]["bitwise_equal"] for r in per_prompt),
        }
        for name in per_prompt[0]
    }


def step_sd_vs_ar(ctx: dict) -> tuple[dict, str]:
    import torch

    import ecospec
    from ecospec.drafters.draft_model import DraftModelDrafter
    from ecospec.models import perturbed_copy, tiny_model

    device, size = ctx["device"], ctx["sizes"]
    families, failures = {}, []
    for family, preset in _families().items():
        row: dict = {"preset": preset}
        ar32 = None
        for dtype_name, dtype in (("fp32", torch.float32), ("bf16", torch.bfloat16)):
            try:
                target = tiny_model(preset, seed=0, dtype=dtype).to(device)
                drafter = DraftModelDrafter(perturbed_copy(target, scale=0.05, seed=1))
                prompts = _prompts(size["prompts"], size["prompt_len"], target.config.vocab_size)
                same, first, alphas, ar_tokens = [], [], [], []
                for ids in prompts:
                    ar = ecospec.generate(target, ids, max_new_tokens=size["new_tokens"], eos_token_id=[])
                    sd = ecospec.generate(
                        target, ids, drafter=drafter, max_new_tokens=size["new_tokens"], eos_token_id=[], **SD
                    )
                    same.append(sd.tokens == ar.tokens)
                    first.append(_first_divergence(sd.tokens, ar.tokens))
                    alphas.append(sd.alpha)
                    ar_tokens.append(ar.tokens)
                seqs = [torch.cat([i, torch.tensor([t])], dim=1) for i, t in zip(prompts, ar_tokens, strict=True)]
                rec = {
                    "matches_ar": sum(same) / len(same),
                    "first_divergence": first,
                    "alpha": sum(alphas) / len(alphas),
                    "prompts": len(prompts),
                    "new_tokens": size["new_tokens"],
                    "block_vs_step": _merge_block_vs_step([block_vs_step(target, seq) for seq in seqs]),
                }
                del target, drafter
            except Exception as e:  # one family's error is its row; the others still run
                row[dtype_name] = {"error": f"{type(e).__name__}: {e}", "traceback": traceback.format_exc()[-2000:]}
                failures.append(f"{family} {dtype_name}: {type(e).__name__}: {e}")
                continue
            if dtype_name == "fp32":
                ar32 = ar_tokens
                if not all(same):
                    failures.append(
                        f"{family} fp32: SD != AR on {same.count(False)} of {len(same)} prompts "
                        f"(first divergence {first})"
                    )
            elif ar32 is not None:
                rec["ar_matches_fp32_ar"] = sum(a == b for a, b in zip(ar_tokens, ar32, strict=True)) / len(ar32)
                pairs = zip(ar_tokens, ar32, strict=True)
                rec["ar_first_divergence_from_fp32"] = [_first_divergence(a, b) for a, b in pairs]
            row[dtype_name] = rec
            if not any(a > 1 for a in alphas):
                failures.append(f"{family} {dtype_name}: no draft token was ever accepted (alpha 1): SD == AR is empty")
        families[family] = row
    result = {
        "settings": {**SD, "drafter": "perturbed_copy(target, scale=0.05, seed=1)"},
        "families": families,
        "asserted": "fp32 SD == AR token for token; bf16 recorded",
    }
    if failures:
        raise StepFailed("; ".join(failures), result)
    fp32_ok = sum(r["fp32"]["matches_ar"] == 1 for r in families.values())
    bf16 = ", ".join(f"{f} {r['bf16']['matches_ar']:.2f}" for f, r in families.items())
    return result, f"fp32 SD == AR {fp32_ok}/{len(families)} families; bf16 matches_ar: {bf16}"


# -- step: one run.py cell ---------------------------------------------------------------------------------------


def step_run_cell(ctx: dict) -> tuple[dict, str]:
    run_py = ROOT / "run.py"
    if not run_py.exists():
        raise StepFailed(f"{run_py} not found: install the project from its checkout (pip install --no-deps -e .)")
    out_dir = ctx["out"] / "cells"
    size = ctx["sizes"]
    device = "cuda" if ctx["device"].type == "cuda" else "cpu"
    args = [
        "model=tiny_random",
        "method=ecospec",
        "dataset=humaneval",
        f"num_prompts={size['cell_prompts']}",
        f"max_new_tokens={size['cell_tokens']}",
        f"device={device}",
        "logger=none",
        "progress=false",
        "force=true",
        "name=gpu_check",
        f"out_dir={out_dir}",
    ]
    if device == "cpu":
        args.append("threads=1")
    env = {**os.environ, **OFFLINE_ENV}
    t0 = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, str(run_py), *args],
        cwd=ctx["out"],
        env=env,
        capture_output=True,
        text=True,
        timeout=ctx["cell_timeout"],
    )
    records = sorted((out_dir / "gpu_check").glob("*/result.json"))
    result = {
        "command": " ".join(["python", "run.py", *args]),
        "returncode": proc.returncode,
        "wall_s": time.perf_counter() - t0,
        "stdout_tail": proc.stdout[-1500:],
        "stderr_tail": proc.stderr[-3000:],
    }
    if not records:
        raise StepFailed(f"run.py exited {proc.returncode} and wrote no result.json: {proc.stderr[-500:]}", result)
    rec = json.loads(records[-1].read_text())
    s = rec.get("summary") or {}
    result.update(
        {
            "record": str(records[-1]),
            "status": rec.get("status"),
            "error": rec.get("error"),
            "alpha": s.get("alpha"),
            "speedup": s.get("speedup"),
            "matches_ar": s.get("matches_ar"),
            "experts_per_layer": s.get("experts_per_layer"),
            "tokens_per_s": s.get("tokens_per_s"),
            "ar_source": s.get("ar_source"),
            "storage": (rec.get("env") or {}).get("storage"),
            "hardware": (rec.get("env") or {}).get("hardware"),
            "data_source": rec.get("data_source"),
        }
    )
    if proc.returncode != 0 or rec.get("status") != "ok":
        raise StepFailed(f"cell status {rec.get('status')!r} (exit {proc.returncode}): {rec.get('error')}", result)
    if s.get("matches_ar") != 1.0:
        raise StepFailed(f"greedy cell's matches_ar is {s.get('matches_ar')}, not 1.0", result)
    st = result["storage"] or {}
    return result, (
        f"alpha {s['alpha']:.2f}, speedup {s['speedup']:.2f}x, matches_ar {s['matches_ar']:.2f}, "
        f"storage {st.get('experts')}/{st.get('dense')} ({st.get('experts_implementation')})"
    )


# -- step: routes under grouped_mm equal eager's ------------------------------------------------------------------


def step_routes_grouped_mm(ctx: dict) -> tuple[dict, str]:
    import torch

    from ecospec.engine.routing import RoutingCapture
    from ecospec.models import tiny_model

    device = ctx["device"]
    on_cpu = device.type == "cpu"
    gen = torch.Generator().manual_seed(7)
    ids = torch.randint(3, 256, (4, 48), generator=gen).to(device)
    families, failures, skips = {}, [], []
    for family, preset in _families().items():
        row = {"preset": preset}
        for dtype_name, dtype in (("fp32", torch.float32), ("bf16", torch.bfloat16)):
            out = {}
            try:
                for impl in ("eager", "grouped_mm"):
                    model = tiny_model(preset, seed=0, dtype=dtype, experts_implementation=impl).to(device)
                    with torch.inference_mode(), RoutingCapture(model) as cap:
                        logits = model(ids, use_cache=False).logits.float()
                        out[impl] = (cap.take(), logits)
                    del model
            except Exception as e:  # grouped_mm missing or raising on this device
                why = f"{type(e).__name__}: {e}".splitlines()[0][:300]
                row[dtype_name] = {"error": why}
                (skips if on_cpu else failures).append(f"{family} {dtype_name}: grouped_mm: {why}")
                continue
            (r_e, l_e), (r_g, l_g) = out["eager"], out["grouped_mm"]
            r_e, r_g = r_e.sort(-1).values, r_g.sort(-1).values  # a token's expert set, whatever the order
            same = (r_e == r_g).all(-1)  # [layers, tokens]
            diff_layers = [i for i in range(same.shape[0]) if not bool(same[i].all())]
            row[dtype_name] = {
                "routes_equal": bool(same.all()),
                "token_routes_equal": float(same.float().mean()),
                "first_layer_differing": diff_layers[0] if diff_layers else None,
                "moe_layers": int(same.shape[0]),
                "tokens": int(same.shape[1]),
                "max_abs_logit_diff": float((l_e - l_g).abs().max()),
            }
            if dtype_name == "fp32" and not same.all():
                share = 1 - float(same.float().mean())
                failures.append(
                    f"{family} fp32: grouped_mm routes differ from eager's on {share:.1%} of "
                    f"token-layers (from MoE layer {diff_layers[0]})"
                )
        families[family] = row
    result = {"families": families, "asserted": "fp32 routes equal; bf16 recorded", "tokens": list(ids.shape)}
    if failures:
        raise StepFailed("; ".join(failures), result)
    if skips and len(skips) == 2 * len(_families()):
        raise Skip(f"grouped_mm does not run on this CPU: {skips[0]}")
    if skips:
        result["skipped"] = skips
    fp32 = sum(bool(r["fp32"].get("routes_equal")) for r in families.values())
    bf16 = ", ".join(
        f"{f} {r['bf16']['token_routes_equal']:.2f}" for f, r in families.items() if "token_routes_equal" in r["bf16"]
    )
    return result, f"fp32 routes equal {fp32}/{len(families)}; bf16 share of token routes equal: {bf16}"


# -- step: verify latency (Figure 1(a)) ----------------------------------------------------------------------------


def step_verify_latency(ctx: dict) -> tuple[dict, str]:
    import gc

    import torch

    from ecospec.analysis.latency import fit_latency
    from ecospec.bench import IMPLS
    from ecospec.bench.verify_latency import available_impls, run

    vl = dict(ctx["sizes"]["vl"])
    if ctx.get("vl_layers"):
        vl["layers"] = ctx["vl_layers"]
    impls, missing = available_impls(IMPLS)
    out = ctx["out"] / "fig1a"
    device = ctx["device"]
    models, table, failures = {}, [], []
    for name in VL_MODELS:
        lines: list[str] = []
        try:
            recs = run(name, impls=impls, device=device, out=out, echo=lines.append, **vl)
        except Exception as e:
            failures.append(f"{name}: {type(e).__name__}: {e}")
            models[name] = {"error": f"{type(e).__name__}: {e}", "log": lines[-5:]}
            continue
        finally:  # the layers (tens of GB at real shapes) go before the next model's are built
            gc.collect()
            if device.type == "cuda":
                torch.cuda.empty_cache()
        where = lines[-1].split("-> ", 1)[-1] if lines else None
        per_impl = {}
        for impl in impls:
            mine = [r for r in recs if r["impl"] == impl]
            ar = next(r for r in mine if r["gamma"] == 1)
            top = max(r["gamma"] for r in mine)
            widest = max((r for r in mine if r["gamma"] == top), key=lambda r: r["E"])
            fit = fit_latency(mine, impl=impl)
            per_impl[impl] = {
                "ar_ms_per_layer": ar["t_layer_s"] * 1e3,
                "gamma": top,
                "E_max": widest["E"],
                "ms_per_layer_at_E_max": widest["t_layer_s"] * 1e3,
                "bw_fraction_at_E_max": widest["bw_fraction"],
                "fit_ms_per_expert_layer": fit.slope_s * 1e3 if fit else None,
                "fit_ms_per_layer": fit.intercept_s * 1e3 if fit else None,
                "fit_r2": fit.r2 if fit else None,
            }
            table.append((name, impl, per_impl[impl]))
        models[name] = {
            "records": len(recs),
            "dir": where,
            "storage": recs[0]["storage"],
            "top_k": recs[0]["top_k"],
            "num_experts": recs[0]["num_experts"],
            "hardware": recs[0]["hardware"],
            "impls": per_impl,
            "log": lines[-(len(impls) + 1) :],
        }
    result = {"settings": {**vl, "impls": impls}, "impls_missing": missing, "out": str(out), "models": models}
    if failures:
        raise StepFailed("; ".join(failures), result)
    n = sum(m["records"] for m in models.values())
    return result, f"{n} records ({', '.join(VL_MODELS)}; {', '.join(impls)}; scale {vl['scale']:g}) -> {out}"


STEPS: dict[str, Callable[[dict], tuple[dict, str]]] = {
    "sd_vs_ar": step_sd_vs_ar,
    "run_cell": step_run_cell,
    "routes_grouped_mm": step_routes_grouped_mm,
    "verify_latency": step_verify_latency,
}


# -- the check ------------------------------------------------------------------------------------------------


def run_step(name: str, fn: Callable[[dict], tuple[dict, str]], ctx: dict) -> dict:
    t0 = time.perf_counter()
    rec: dict = {"status": "ok"}
    try:
        rec["result"], rec["summary"] = fn(ctx)
    except Skip as e:
        rec.update(status="skipped", summary=f"skipped: {e}", reason=str(e))
    except StepFailed as e:
        rec.update(status="failed", summary=f"FAILED: {e}", error=str(e), result=e.result)
    except Exception as e:  # any error of a step is its record, never the end of the check
        rec.update(
            status="failed",
            summary=f"FAILED: {type(e).__name__}: {e}",
            error=f"{type(e).__name__}: {e}",
            traceback=traceback.format_exc()[-4000:],
        )
    rec["wall_s"] = time.perf_counter() - t0
    return rec


def _families() -> dict[str, str]:
    """One tiny random model per family, the one its record names (`ecospec.families`: check_preset)."""
    from ecospec.families import families

    return {f.name: f.check_preset for f in families()}


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


def tables(summary: dict) -> str:
    """The short table main() prints: one line per step, then SD vs AR per family and the verify-latency fits."""
    lines = [f"{'step':<18} {'status':<8} {'wall_s':>7}  summary"]
    for name, s in summary["steps"].items():
        lines.append(f"{name:<18} {s['status']:<8} {s['wall_s']:7.1f}  {s.get('summary', '')}"[:400])
    sd = ((summary["steps"].get("sd_vs_ar") or {}).get("result") or {}).get("families")
    if sd:
        head = (
            f"{'family':<12} {'preset':<14} {'fp32 = AR':>9} {'alpha':>6} {'bf16 = AR':>9} "
            f"{'bf16 first divergence':<22} {'bf16 AR = fp32 AR':>17} {'bf16 verify vs step':>22}"
        )
        lines += ["", head]
        for fam, r in sd.items():
            f32, b16 = r.get("fp32") or {}, r.get("bf16") or {}
            if "matches_ar" not in f32 or "matches_ar" not in b16:
                errors = "; ".join(f"{d}: {x['error']}" for d, x in (("fp32", f32), ("bf16", b16)) if "error" in x)
                lines.append(f"{fam:<12} {r['preset']:<14} {errors}"[:300])
                continue
            v = b16["block_vs_step"]["verify"]
            vs = f"{v['argmax_flips']}/{v['positions']} flips, |Δ| {v['max_abs_logit_diff']:.2g}"
            lines.append(
                f"{fam:<12} {r['preset']:<14} {f32['matches_ar']:9.2f} {f32['alpha']:6.2f} "
                f"{b16['matches_ar']:9.2f} {str(b16['first_divergence']):<22} "
                f"{b16.get('ar_matches_fp32_ar', float('nan')):17.2f} {vs:>22}"
            )
    vl = ((summary["steps"].get("verify_latency") or {}).get("result") or {}).get("models")
    if vl:
        lines += [
            "",
            f"{'model':<8} {'impl':<11} {'AR ms/layer':>11} {'γ':>3} {'E max':>5} {'ms/layer':>9} "
            f"{'fit ms/expert-layer':>19} {'fit ms/layer':>12}",
        ]
        for model, m in vl.items():
            for impl, r in (m.get("impls") or {}).items():
                slope = "-" if r["fit_ms_per_expert_layer"] is None else f"{r['fit_ms_per_expert_layer']:.4f}"
                icpt = "-" if r["fit_ms_per_layer"] is None else f"{r['fit_ms_per_layer']:.4f}"
                lines.append(
                    f"{model:<8} {impl:<11} {r['ar_ms_per_layer']:11.3f} {r['gamma']:3d} {r['E_max']:5d} "
                    f"{r['ms_per_layer_at_E_max']:9.3f} {slope:>19} {icpt:>12}"
                )
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m ecospec.bench.gpu_check", description=__doc__.split("\n")[0])
    p.add_argument("--device", choices=("cuda", "cpu"), help="cuda (the current GPU) | cpu")
    p.add_argument("--out", type=Path, help="directory for gpu_check.json, the cell and the fig1a records")
    p.add_argument("--steps", default=",".join(STEPS), help=f"comma-separated subset of {','.join(STEPS)}")
    p.add_argument("--vl-layers", type=int, default=None, help="verify_latency decoder layers (cuda default 4)")
    p.add_argument("--cell-timeout", type=int, default=300, help="seconds run.py's cell may take (default 300)")
    p.add_argument("--print-deps", action="store_true", help="print pyproject's dependencies minus torch, one a line")
    a = p.parse_args(argv)
    if a.print_deps:
        print("\n".join(dependencies()))
        return 0
    if not a.device or not a.out:
        p.error("--device and --out are required (or --print-deps)")
    steps = [s for s in a.steps.split(",") if s]
    unknown = [s for s in steps if s not in STEPS]
    if unknown:
        p.error(f"unknown steps {unknown}; have {', '.join(STEPS)}")

    try:
        import torch
    except ImportError as e:
        print(f"gpu_check: torch is not importable ({e}): install the machine's CUDA torch first", file=sys.stderr)
        return 2
    problem = torch_problem(torch.__version__)
    if problem:
        print(f"gpu_check: {problem}", file=sys.stderr)
        return 2
    if a.device == "cuda" and not torch.cuda.is_available():
        print(
            f"gpu_check: --device cuda, but torch {torch.__version__} sees no CUDA GPU (torch.version.cuda = "
            f"{torch.version.cuda})",
            file=sys.stderr,
        )
        return 2
    device = torch.device("cuda", torch.cuda.current_device()) if a.device == "cuda" else torch.device("cpu")
    if device.type == "cpu":
        torch.set_num_threads(1)  # tiny models: more threads only add synchronisation
    else:
        torch.set_float32_matmul_precision("highest")  # fp32 means fp32 (no TF32) for the token-for-token check

    out = a.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    summary = {
        "schema": 1,
        "kind": "gpu_check",
        "device": a.device,
        "started": _now(),
        "out": str(out),
        "env": environment(device),
        "steps": {},
    }
    ctx = {
        "device": device,
        "out": out,
        "sizes": SIZES[device.type],
        "vl_layers": a.vl_layers,
        "cell_timeout": a.cell_timeout,
    }
    path = out / "gpu_check.json"
    for name in steps:
        print(f"gpu_check: {name} ...", flush=True)
        summary["steps"][name] = rec = run_step(name, STEPS[name], ctx)
        print(f"gpu_check: {name} {rec['status']} in {rec['wall_s']:.1f} s", flush=True)
        path.write_text(json.dumps(summary, indent=1, default=str))  # what finished so far, if a later step hangs
    summary["failed"] = [n for n, s in summary["steps"].items() if s["status"] == "failed"]
    summary["ok"] = not summary["failed"]
    summary["finished"] = _now()
    summary["wall_s"] = time.perf_counter() - t0
    path.write_text(json.dumps(summary, indent=1, default=str))
    print(tables(summary))
    verdict = "ok" if summary["ok"] else f"FAILED: {', '.join(summary['failed'])}"
    print(f"gpu_check on {summary['env']['device_name']}: {verdict} in {summary['wall_s']:.0f} s -> {path}")
    return 0 if summary["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
