"""What `make paper MODEL=...` costs on a cluster: GPU hours and disk per stage, *estimated* (nothing here is
measured) from token counts, the cost model's weight bytes and a roofline, scaled by how far the paper's HF
prototype ran above its bandwidth bound.

    python -m ecospec.experiment.estimate [--models qwen3,gptoss,deepseek] [--gpu H100]

Assumptions (each a constant below, so anyone can redo the arithmetic):
- Samples per dataset are the benchmarks' sizes; mean prompt tokens are the offline copies' characters / 4
  (gsm8k, humaneval, math500, mtbench), assumed for aime25, amc and mmstar (not offline here).
- A decode step with `device_map` reads its weights one GPU at a time (analysis.hardware): roofline time =
  verify_hbm_bytes(E) / one GPU's bandwidth, times HF_OVER_ROOFLINE, the paper's measurement (Qwen3-235B AR
  ~0.49 s/token against a ~14 ms H100 bound). E of a step of B tokens: N (1 - (1 - k/N)^B), independent routing.
- GPUs: a traces task and a Table 1 cell ask for what the model's weights and KV cache need on the GPU
  (`analysis.sizing`, as stored with transformers' `kernels`; the sweep's plan asks the same), charged in full.
- Traces: batches of 16, 256 response tokens per turn; prefill is compute-bound and small beside decoding
  (2 x active params x tokens at 40 % of the asked GPUs' bf16 peak).
- Predictor: 6 x backbone non-embedding params x train tokens x epochs, one GPU, TF32 at 35 % of its dense peak.
- Table 1: min(100, held-out) prompts x 512 tokens per (dataset, temperature); AR, the baseline and EcoSpec;
  SD at alpha 2.5 with E = 3k per verify pass.
"""

from __future__ import annotations

import argparse
import math
import sys

from ecospec.analysis.hardware import HARDWARE
from ecospec.analysis.sizing import size
from ecospec.analysis.weight_bytes import model_cost, verify_hbm_bytes
from ecospec.data import DATASETS
from ecospec.data.split import TEST_FRACTION

SAMPLES = {"gsm8k": 1319, "humaneval": 164, "aime25": 30, "math500": 500, "amc": 83, "mtbench": 80, "mmstar": 1500}
TURNS = {"mtbench": 2}
PROMPT_TOKENS = {"gsm8k": 500, "humaneval": 113, "aime25": 120, "math500": 54, "amc": 100, "mtbench": 101, "mmstar": 70}
RESPONSE_TOKENS, TRACE_BATCH = 256, 16
HF_OVER_ROOFLINE = 35.0
EPOCHS = 100
# non-embedding parameters of the paper's predictor backbones (the predictor feeds embeddings, not ids)
BACKBONE_PARAMS = {"Qwen/Qwen3-0.6B": 0.44e9, "deepseek-ai/DeepSeek-R1-Distill-Qwen-1.5B": 1.31e9}
BACKBONES = {
    "qwen3": "Qwen/Qwen3-0.6B",
    "gptoss": "Qwen/Qwen3-0.6B",
    "deepseek": "deepseek-ai/DeepSeek-R1-Distill-Qwen-1.5B",
}
PEAK_FLOPS = {"H100": (989e12, 495e12), "H200": (989e12, 495e12), "B200": (2250e12, 1100e12)}  # (bf16, tf32) dense
TABLE1_PROMPTS, TABLE1_TOKENS, TEMPERATURES, SD_ALPHA = 100, 512, 2, 2.5


def unique_experts(n: int, k: int, tokens: int) -> float:
    return n * (1 - (1 - k / n) ** tokens)


def estimate(model: str, gpu: str = "H100") -> dict:
    c = model_cost(model)
    hw = HARDWARE[gpu]
    bf16, tf32 = PEAK_FLOPS[gpu]

    gpus = size(model, gpu).gpus  # what a cell (and a traces task) asks for (experiment.plan), charged in full

    def step_s(tokens: int) -> float:
        e = unique_experts(c.num_experts, c.top_k, tokens)
        return verify_hbm_bytes(c, e) / hw.hbm_bytes_per_s * HF_OVER_ROOFLINE

    tokens = {d: SAMPLES[d] * TURNS.get(d, 1) * (PROMPT_TOKENS[d] + RESPONSE_TOKENS) for d in DATASETS}
    decode_steps = sum(math.ceil(SAMPLES[d] / TRACE_BATCH) * TURNS.get(d, 1) * RESPONSE_TOKENS for d in DATASETS)
    prefill_s = 2 * c.active_params * sum(tokens.values()) / (0.4 * bf16 * gpus)
    traces_h = (decode_steps * step_s(TRACE_BATCH) + prefill_s) / 3600 * gpus
    train_tokens = sum(tokens.values()) * (1 - TEST_FRACTION)
    backbone = BACKBONE_PARAMS[BACKBONES.get(model, "Qwen/Qwen3-0.6B")]
    predictor_h = 6 * backbone * train_tokens * EPOCHS / (0.35 * tf32) / 3600
    prompts = sum(min(TABLE1_PROMPTS, round(SAMPLES[d] * TEST_FRACTION)) * TURNS.get(d, 1) for d in DATASETS)
    generated = prompts * TABLE1_TOKENS * TEMPERATURES
    ar_s = generated * step_s(1)
    verify_s = verify_hbm_bytes(c, 3 * c.top_k) / hw.hbm_bytes_per_s * HF_OVER_ROOFLINE
    sd_s = 2 * generated / SD_ALPHA * verify_s  # the baseline and EcoSpec
    table_h = (ar_s + sd_s) / 3600 * gpus
    weights_gb = (verify_hbm_bytes(c, c.num_experts) + c.embedding_params * 2) / 1e9
    traces_gb = sum(tokens.values()) * (4 + c.moe_layers * c.top_k * (1 if c.num_experts <= 256 else 2)) / 1e9
    predictor_gb = (backbone + c.moe_layers * c.num_experts * 1024) * 4 * (3 + 3) / 1e9  # 3 published + resume (x3)
    return {
        "model": model,
        "gpu": gpu,
        "trace_tokens": sum(tokens.values()),
        "traces_gpu_h": traces_h,
        "predictor_gpu_h": predictor_h,
        "table1_tokens": generated,
        "table1_gpu_h": table_h,
        "weights_gb": weights_gb,
        "traces_gb": traces_gb,
        "predictor_gb": predictor_gb,
    }


def markdown(rows: list[dict]) -> str:
    head = (
        "| model | GPU | traces: tokens, GPU-h | predictor: GPU-h | Table 1: tokens, GPU-h | disk: weights, traces, "
        "predictor |\n|---|---|---|---|---|---|"
    )
    lines = [head]
    for r in rows:
        lines.append(
            f"| {r['model']} | {r['gpu']} | {r['trace_tokens'] / 1e6:.2f}M, {r['traces_gpu_h']:,.0f} | "
            f"{r['predictor_gpu_h']:,.1f} | {r['table1_tokens'] / 1e6:.2f}M, {r['table1_gpu_h']:,.0f} | "
            f"{r['weights_gb']:,.0f} GB, {r['traces_gb']:.1f} GB, {r['predictor_gb']:.0f} GB |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m ecospec.experiment.estimate", description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", default="qwen3,gptoss,deepseek")
    ap.add_argument("--gpu", default="H100", choices=sorted(HARDWARE))
    a = ap.parse_args(argv)
    print(markdown([estimate(m, a.gpu) for m in a.models.split(",")]))
    print("\nEstimates, not measurements (assumptions: python -m ecospec.experiment.estimate --help / its docstring).")
    return 0


if __name__ == "__main__":
    sys.exit(main())
