"""A cell's config as `vllm serve` arguments: the target, the speculative config of the cell's method, and the server
settings that change what is measured (dtype, tensor parallelism, max model length, eager mode), plus prefix
caching off (the overlap paper's setting) and the seed."""

from __future__ import annotations

import json

# method name -> vLLM's speculative method ("draft" is a separate draft LM; "ngram" needs no model)
SPEC_METHODS = {"eagle3": "eagle3", "mtp": "mtp", "draft": "draft_model", "ngram": "ngram"}
METHODS = ("ar", *SPEC_METHODS)
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


def server_args(s: dict, method: str, gamma: int, draft: str | None, seed: int, cpu: bool) -> list[str]:
    """`vllm serve` arguments (after the model) from the backend settings `s` (conf/backend/vllm.yaml)."""
    args = ["--served-model-name", s["served_name"], "--dtype", s["dtype"], "--tensor-parallel-size", str(s["tp"]),
            "--max-model-len", str(s["max_model_len"]), "--seed", str(seed), "--no-enable-prefix-caching"]  # fmt: skip
    if s.get("enforce_eager"):
        args.append("--enforce-eager")
    if cpu:  # on the CPU backend this fraction reserves host memory for the KV cache
        args += ["--gpu-memory-utilization", str(s.get("cpu_memory_fraction") or 0.1)]
    elif s.get("gpu_memory_utilization"):
        args += ["--gpu-memory-utilization", str(s["gpu_memory_utilization"])]
    spec = speculative_config(method, gamma, draft)
    if spec is not None:
        args += ["--speculative-config", json.dumps(spec, sort_keys=True)]
    if s.get("routed_experts"):
        args.append("--enable-return-routed-experts")
    return args + [str(a) for a in s.get("extra_args") or []]
