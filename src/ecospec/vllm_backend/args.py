"""A cell's config as `vllm serve` arguments: the target, the speculative config of the cell's method, and the server
settings that change what is measured (dtype, tensor parallelism, max model length, eager mode), plus prefix
caching off (the overlap paper's setting) and the seed."""

from __future__ import annotations

import json

# method name -> vLLM's speculative method ("draft" is a separate draft LM; "ngram" needs no model)
SPEC_METHODS = {"eagle3": "eagle3", "mtp": "mtp", "draft": "draft_model", "ngram": "ngram"}
METHODS = ("ar", *SPEC_METHODS)
MODEL_FREE = ("ngram",)  # the drafting methods that load no drafter (vLLM's own; the HF engine has none)
NGRAM = {"prompt_lookup_min": 2, "prompt_lookup_max": 5}  # vLLM's defaults for prompt-lookup drafting


def speculative_config(method: str, gamma: int, draft: str | None) -> dict | None:
    """vLLM's `--speculative-config` for the cell's method: `gamma` - 1 draft tokens per step (γ counts the root, as
    ours does; vLLM's K = γ - 1), the drafter checkpoint where the method has one; None for AR."""
    if method == "ar":
        return None
    spec = {"method": SPEC_METHODS[method], "num_speculative_tokens": gamma - 1}
    if method in ("eagle3", "draft"):
        spec["model"] = draft
    if method == "ngram":
        spec.update(NGRAM)
    return spec


MiB = 1 << 20
DTYPE_BYTES = {"float32": 4, "float": 4, "bfloat16": 2, "float16": 2, "half": 2}


def kv_cache_bytes(config: dict, max_model_len: int, batch_size: int, dtype: str, draft_layers: int = 1) -> int:
    """The KV cache a CPU server needs for one cell: keys and values of every attention layer (the drafter's
    too) for `batch_size` sequences of `max_model_len` tokens, twice that for vLLM's block rounding and the
    spec tokens, at least 64 MiB. Sized from the cell, not from a share of whatever memory the node reports."""
    text = config.get("text_config") or config
    head_dim = text.get("head_dim") or text["hidden_size"] // text["num_attention_heads"]
    kv_heads = text.get("num_key_value_heads") or text["num_attention_heads"]
    layers = text["num_hidden_layers"] + draft_layers
    per_token = 2 * layers * kv_heads * head_dim * DTYPE_BYTES.get(str(dtype), 4)
    return max(64 * MiB, 2 * per_token * max_model_len * max(batch_size, 1))


def server_args(
    s: dict, method: str, gamma: int, draft: str | None, seed: int, cpu: bool, kv_bytes: int | None = None
) -> list[str]:
    """`vllm serve` arguments (after the model) from the backend settings `s` (conf/backend/vllm.yaml); on a CPU the
    KV cache is `backend.cpu_kv_cache_mib` where set, else `kv_bytes` (`kv_cache_bytes` of the cell), else 256 MiB."""
    args = [
        "--served-model-name",
        s["served_name"],
        "--dtype",
        s["dtype"],
        "--tensor-parallel-size",
        str(s["tp"]),
        "--max-model-len",
        str(s["max_model_len"]),
        "--seed",
        str(seed),
        "--no-enable-prefix-caching",
    ]
    if s.get("enforce_eager"):
        args.append("--enforce-eager")
    if cpu:  # a fixed KV cache: a share of the node's memory leaves nothing on a small NUMA node once weights load
        mib = s.get("cpu_kv_cache_mib")
        args += ["--kv-cache-memory-bytes", str(int(mib * MiB) if mib else (kv_bytes or 256 * MiB))]
    elif s.get("gpu_memory_utilization"):
        args += ["--gpu-memory-utilization", str(s["gpu_memory_utilization"])]
    spec = speculative_config(method, gamma, draft)
    if spec is not None:
        args += ["--speculative-config", json.dumps(spec, sort_keys=True)]
    if s.get("routed_experts"):
        args.append("--enable-return-routed-experts")
    return args + [str(a) for a in s.get("extra_args") or []]
