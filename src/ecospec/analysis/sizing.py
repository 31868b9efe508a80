"""How many GPUs and nodes a target needs, and the launcher settings that run it (model.parallel, ranks, cluster).

    python -m ecospec.analysis.sizing --model deepseek --gpu H100 [--tokens 65536] [--usable 0.9] [--kernels yes|no]

Which format runs decides the size: transformers keeps MXFP4 experts quantized only where the `kernels` package,
Triton and its Hub kernel are present (`pip install -e .[gpu]`, the kernel fetched ahead on a networked node), and
block-FP8 weights only where its Triton FP8 path runs; otherwise it dequantizes them to bf16 as it loads (a warning,
then 2-4x the bytes). Each GPU is sized both ways unless `--kernels` names one (`loaded_storage`).

Weights: every parameter at its checkpoint storage format (`analysis.weight_bytes.model_cost`: routed experts, the dense
part and the input embedding; fp8 / mxfp4 block scales included). KV cache: `--tokens` cached tokens (default 8
sequences x 8,192) in bf16, per layer 2 x kv heads x head dim (MLA: kv_lora_rank + qk_rope_head_dim, the latent
DeepSeek caches). A GPU offers `--usable` of its memory (the rest: activations, CUDA context, fragmentation).
GPUs = ceil((weights + KV) / usable), rounded up to a tensor-parallel degree that divides the attention heads
(1, 2, 4, 8 on one node; whole nodes of 8 beyond), nodes = GPUs / 8 rounded up. Estimates, labelled so.
"""

from __future__ import annotations

import argparse
import math
from dataclasses import dataclass
from types import SimpleNamespace

from ecospec import sources
from ecospec.analysis.model_config import load_model_config
from ecospec.analysis.weight_bytes import expert_bytes, model_cost
from ecospec.parallel import layout_problem, plans, shards_experts

GPU_MEMORY = {"H100": 80e9, "H200": 141e9, "B200": 192e9}  # bytes of HBM per GPU (datasheets: 80, 141, 192 GB)
GPUS_PER_NODE = 8


@dataclass(frozen=True)
class Sizing:
    model: str
    gpu: str
    storage: str  # the format it is sized for (format_label)
    weight_bytes: float
    kv_bytes: float
    gpus: int
    nodes: int
    parallel: str
    notes: tuple[str, ...]

    @property
    def per_gpu_bytes(self) -> float:
        return (self.weight_bytes + self.kv_bytes) / self.gpus

    def launch(self) -> str:
        if self.gpus == 1 or self.parallel == "device_map":
            return (
                f"model={self.model} model.parallel=device_map cluster=slurm_gpu "
                f"hydra.launcher.gpus_per_node={self.gpus}"
            )
        per_node = min(self.gpus, GPUS_PER_NODE)
        return (
            f"model={self.model} model.parallel={self.parallel} model.device_map=null ranks={self.gpus} "
            f"cluster=slurm_gpu hydra.launcher.gpus_per_node={per_node}"
        )


QUANTIZED = ("fp8", "mxfp4")  # stored formats transformers keeps only with its kernels (else: bf16)


def loaded_storage(stored: dict, kernels: bool) -> dict:
    """The formats that run: as stored with the kernels, every quantized part dequantized to bf16 without them."""
    return {k: (v if kernels or v not in QUANTIZED else "bf16") for k, v in stored.items()}


def format_label(stored: dict, kernels: bool) -> str:
    """`as stored (mxfp4 experts)` or `dequantized to bf16 (experts, dense were fp8)`: what a sizing answers for."""
    quantized = {k: v for k, v in stored.items() if v in QUANTIZED}
    if not quantized:
        return "as stored (bf16)" if set(stored.values()) <= {"bf16"} else "as stored"
    parts = ", ".join(f"{k} {v}" for k, v in quantized.items())
    return f"as stored ({parts})" if kernels else f"dequantized to bf16 ({parts} as stored)"


def weight_bytes(model: dict, storage: dict | None = None) -> float:
    c = model_cost(model, storage)
    embedding = expert_bytes(c.embedding_params, c.storage["other"])
    return c.num_experts * c.moe_layers * c.expert_bytes + c.dense_bytes + embedding


def kv_bytes_per_token(model: dict) -> float:
    hf = (model.get("facts") or {}).get("hf_config") or {}
    layers = hf["num_hidden_layers"]
    if hf.get("kv_lora_rank"):  # MLA caches the compressed latent and the shared rope key
        return layers * (hf["kv_lora_rank"] + hf.get("qk_rope_head_dim", 64)) * 2
    heads = hf.get("num_key_value_heads") or hf["num_attention_heads"]
    head_dim = hf.get("head_dim") or hf["hidden_size"] // hf["num_attention_heads"]
    return layers * 2 * heads * head_dim * 2


def size(name: str, gpu: str, tokens: int = 8 * 8192, usable: float = 0.9, kernels: bool = True) -> Sizing:
    """GPUs for model `name` on `gpu`, its weights in the format that runs (`kernels`: with transformers' quantized
    kernels, i.e. as stored; without: quantized parts dequantized to bf16)."""
    return size_model(load_model_config(name), gpu, tokens, usable, kernels)


def size_model(model: dict, gpu: str, tokens: int = 8 * 8192, usable: float = 0.9, kernels: bool = True) -> Sizing:
    """`size` of a model config (conf/model, its `facts`), as a sweep's plan sizes its cells."""
    if gpu not in GPU_MEMORY:
        raise ValueError(f"unknown GPU {gpu!r}; choose one of {', '.join(GPU_MEMORY)}")
    name = model["name"]
    stored = dict(model_cost(model).storage)
    weights = weight_bytes(model, loaded_storage(stored, kernels))
    kv = kv_bytes_per_token(model) * tokens
    need = math.ceil((weights + kv) / (GPU_MEMORY[gpu] * usable))
    hf = model["facts"]["hf_config"]
    heads = hf["num_attention_heads"]
    gpus = (
        next(g for g in (1, 2, 4, 8) if g >= need)
        if need <= GPUS_PER_NODE
        else GPUS_PER_NODE * math.ceil(need / GPUS_PER_NODE)
    )
    while gpus > 1 and heads % gpus and gpus <= GPUS_PER_NODE:  # TP shards the attention heads
        gpus *= 2
    notes = []
    family = hf["model_type"]
    parallel, why = layout(family, gpus, hf)
    if why:
        notes.append(why)
    if hf.get("kv_lora_rank") and parallel != "device_map":
        notes.append("DeepSeek's MLA attention is replicated by its TP plan; experts and dense MLPs are sharded")
    storage = loaded_storage(stored, kernels)
    while parallel != "device_map" and (
        rank_share(model, parallel, gpus, storage) + kv / gpus > GPU_MEMORY[gpu] * usable
    ):
        gpus += GPUS_PER_NODE if gpus >= GPUS_PER_NODE else gpus  # replicated parts leave a rank less room
        parallel, why = layout(family, gpus, hf)
    if not kernels and "fp8" in stored.values():
        notes += _unloadable(hf)
    label = format_label(stored, kernels)
    return Sizing(name, gpu, label, weights, kv, gpus, math.ceil(gpus / GPUS_PER_NODE), parallel, tuple(notes))


def layout(family: str, gpus: int, hf: dict) -> tuple[str, str | None]:
    """The layout that runs a target over `gpus` GPUs and that validation accepts (`parallel.layout_problem`, the
    one place for each family's rules): one GPU or device_map where no sharded mode works (one process, layers
    spread over one node's GPUs), else tp, else ep, whichever first spreads the experts; and why not the others."""
    if gpus == 1:
        return "device_map", None
    facts = SimpleNamespace(**hf)
    tried = []
    for mode in ("tp", "ep"):
        problem = layout_problem(family, mode, gpus, facts)
        if problem is None and shards_experts(family, mode):
            return mode, None
        tried.append(f"{mode}: {problem or 'its plan does not shard the experts'}")
    why = "; ".join(tried)
    if gpus > GPUS_PER_NODE:
        return "device_map", f"no sharded layout runs here ({why}); device_map spreads one process over one node only"
    return "device_map", f"one process spreads the layers over the GPUs ({why})"


def kernels_present(device_type: str) -> bool:
    """Whether transformers can keep quantized weights (MXFP4, block FP8) as stored here: a CUDA device with the
    `kernels` package and Triton (`pip install -e .[gpu]`); elsewhere they load dequantized to bf16."""
    import importlib.util

    return device_type == "cuda" and all(importlib.util.find_spec(m) for m in ("kernels", "triton"))


def rank_share(model: dict, mode: str, ranks: int, storage: dict) -> float:
    """Weight bytes one rank holds under `mode` over `ranks` (estimate): the routed experts divided over the ranks
    where the family's plan shards them, the rest divided where its plan shards attention, else replicated; the
    whole model under device_map (spread over the GPUs one process sees)."""
    c = model_cost(model, storage)
    experts = c.num_experts * c.moe_layers * c.expert_bytes
    rest = weight_bytes(model, storage) - experts
    if mode == "device_map" or ranks <= 1:
        return experts + rest
    plan = plans(model["facts"]["hf_config"]["model_type"])[mode]
    shards = lambda part: any(part in k for k in plan)  # noqa: E731
    return experts / (ranks if shards("experts") else 1) + rest / (ranks if shards("self_attn") else 1)


def local_weight_bytes(target) -> float | None:
    """The bytes of the weight files in a local checkpoint directory (what it loads, as stored), or None when
    `target` is no local directory (a Hub id: sized from the config's facts instead)."""
    from pathlib import Path

    if not target or not Path(str(target)).is_dir():
        return None
    files = [p for p in Path(str(target)).iterdir() if p.suffix in (".safetensors", ".bin", ".pt")]
    return float(sum(p.stat().st_size for p in files))


def memory_problem(model: dict, mode: str, ranks: int, device_type: str, have_bytes: float, where: str) -> str | None:
    """One line when a real target cannot fit in `have_bytes` (`where` names them: this machine's RAM, the visible
    GPUs, one rank's GPU), naming both figures and what to do; None when it fits or cannot be sized. A local
    checkpoint directory is sized by its weight files (the facts describe the Hub checkpoint the config names)."""
    if not sources.real(model):
        return None
    local = local_weight_bytes(model.get("target"))
    if local is not None:
        need, what = local / (ranks if mode != "device_map" else 1), f"the weight files in {model['target']}"
    elif (model.get("facts") or {}).get("hf_config"):
        kernels = kernels_present(device_type)
        stored = dict(model_cost(model).storage)
        need = rank_share(model, mode, ranks, loaded_storage(stored, kernels))
        what = format_label(stored, kernels)
    else:
        return None
    if need <= have_bytes:
        return None
    per = f" per rank ({mode} over {ranks})" if mode != "device_map" and ranks > 1 else ""
    return (
        f"model={model['name']} needs {need / 1e9:,.1f} GB for its weights{per} ({what}) "
        f"and {where} holds {have_bytes / 1e9:,.1f} GB: run it on GPUs (cluster=slurm_gpu; python -m "
        f"ecospec.analysis.sizing --model {model['name']} says how many) or use model=tiny; memory_check=false skips "
        "this check"
    )


def _unloadable(hf: dict) -> list[str]:
    """The note for an FP8 checkpoint transformers cannot dequantize (`models.storage.partial_blocks`)."""
    from transformers import AutoConfig

    from ecospec.models.storage import partial_blocks

    kwargs = dict(hf)
    config = AutoConfig.for_model(kwargs.pop("model_type"), **kwargs)
    bad = partial_blocks(config)
    if not bad:
        return []
    return [
        f"transformers cannot dequantize {len(bad)} FP8 weights whose last 128-block is partial (e.g. {bad[0]}): "
        "without its FP8 path (a GPU of compute capability >= 8.9 with Triton) this checkpoint does not load "
        "(tests/test_checkpoint_formats.py)"
    ]


def report(s: Sizing, tokens: int, usable: float) -> list[str]:
    lines = [
        f"{s.model} on {s.gpu} ({GPU_MEMORY[s.gpu] / 1e9:.0f} GB, {usable:.0%} usable) -- estimates",
        f"  weights {s.storage}: {s.weight_bytes / 1e9:,.1f} GB; KV cache for {tokens:,} tokens: "
        f"{s.kv_bytes / 1e9:,.1f} GB",
        f"  GPUs: {s.gpus} ({s.nodes} node{'s' if s.nodes > 1 else ''} x {min(s.gpus, GPUS_PER_NODE)}), "
        f"{s.per_gpu_bytes / 1e9:,.1f} GB per GPU",
        f"  run: python run.py -m {s.launch()}",
    ]
    return lines + [f"  note: {n}" for n in s.notes]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", required=True, help="a conf/model name with facts (qwen3, gptoss, deepseek, ...)")
    ap.add_argument("--gpu", default=None, help=f"one of {', '.join(GPU_MEMORY)} (default: all)")
    ap.add_argument("--tokens", type=int, default=8 * 8192, help="cached tokens to leave room for")
    ap.add_argument("--usable", type=float, default=0.9)
    ap.add_argument(
        "--kernels",
        choices=("yes", "no"),
        default=None,
        help="size for the quantized kernels present (yes) or absent (no); default: both",
    )
    a = ap.parse_args()
    stored = model_cost(load_model_config(a.model)).storage
    both = [True, False] if any(v in QUANTIZED for v in stored.values()) else [True]
    for gpu in [a.gpu] if a.gpu else list(GPU_MEMORY):
        for kernels in both if a.kernels is None else [a.kernels == "yes"]:
            print("\n".join(report(size(a.model, gpu, a.tokens, a.usable, kernels), a.tokens, a.usable)))


if __name__ == "__main__":
    main()
