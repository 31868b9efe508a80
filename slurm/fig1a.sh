#!/bin/bash
# Figure 1(a) for one model on one GPU, with no checkpoint: verify-pass latency against the unique experts E, timed
# on a few real-shape decoder layers with random weights (python -m ecospec.bench.verify_latency), then the figure
# and the fitted per-layer cost (make tables). Needs only torch >= 2.11 and transformers on the node (no Hydra, no
# network, no install: PYTHONPATH=src). Edit the #SBATCH lines for your site, then from the repository root:
#   sbatch slurm/fig1a.sh                      # qwen3
#   MODEL=deepseek LAYERS=2 sbatch slurm/fig1a.sh
# The same through run.py's Hydra/submitit path (one array task per model):
#   python run.py -m experiment=fig1a model=qwen3,gptoss cluster=slurm_gpu hydra.launcher.gpus_per_node=1
#   python run.py experiment=fig1a model=deepseek fig1a.layers=2 cluster=slurm_gpu hydra.launcher.gpus_per_node=1
# (DeepSeek at fig1a.yaml's 4 layers is ~90 GB: 2 layers fit an 80 GB H100)
#SBATCH --job-name=fig1a
#SBATCH --gpus=1
#SBATCH --cpus-per-task=8
#SBATCH --mem=64G
#SBATCH --time=01:00:00
#SBATCH --output=fig1a-%j.out
set -euo pipefail

MODEL=${MODEL:-qwen3}            # qwen3 | gptoss | deepseek | qwen3_30b | mixtral (conf/model)
LAYERS=${LAYERS:-4}              # DeepSeek-V3.1: ~22.5 GB per layer in bf16 (2 on an 80 GB H100)
GAMMAS=${GAMMAS:-4,8,16}
IMPLS=${IMPLS:-eager,grouped_mm,batched_mm}
OUT=${OUT:-experiments/fig1a}

cd "${SLURM_SUBMIT_DIR:-.}"
export PYTHONPATH=src${PYTHONPATH:+:$PYTHONPATH}
python -m ecospec.bench.verify_latency --model "$MODEL" --layers "$LAYERS" --gammas "$GAMMAS" --impls "$IMPLS" \
    --device cuda --out "$OUT" ${PEAK_TBPS:+--peak-tbps "$PEAK_TBPS"}
# the figure (reports/figures/fig1a_verify_latency_bench.png) needs the report's dependencies (pandas, matplotlib):
# run it here if the node has them, or later on any machine that sees $OUT
if python -c "import pandas, matplotlib, omegaconf" 2>/dev/null; then
    python -m ecospec.report --records "$OUT" --out "reports/fig1a-$MODEL"
fi
