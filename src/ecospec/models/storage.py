"""What a loaded target actually holds, for `env.storage` of every record: the format its routed experts and its
other weights run in (which is not always the checkpoint's: transformers dequantizes MXFP4 / FP8 to bf16 where its
kernels are missing), the experts and attention implementations (which decide whether the routing capture sees the
router), and the placement (bytes per device)."""

from __future__ import annotations

from collections import Counter

import torch
from torch import nn

_DTYPES = {torch.float64: "fp64", torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16"}
_FP8 = {d for d in (getattr(torch, "float8_e4m3fn", None), getattr(torch, "float8_e5m2", None)) if d is not None}


def _format(params: list[tuple[str, torch.Tensor]]) -> str | None:
    """The storage format of a group of parameters: fp8, mxfp4 (packed uint8: `*_blocks` as stored, the projections
    themselves in transformers' kept-MXFP4 experts), or the float dtype."""
    if not params:
        return None
    if any(p.dtype in _FP8 for _, p in params):
        return "fp8"
    if any(p.dtype == torch.uint8 for _, p in params):  # packed FP4 pairs: `*_blocks` as stored, the proj as kept
        return "mxfp4"
    floats = [p.dtype for _, p in params if p.is_floating_point()]
    dtypes = Counter(_DTYPES.get(d, str(d).removeprefix("torch.")) for d in floats)
    return dtypes.most_common(1)[0][0] if dtypes else None


def quant_method(config) -> str | None:
    """A checkpoint config's quantization (`quantization_config.quant_method`, lower case), if any."""
    q = getattr(config, "quantization_config", None)
    if q is None:
        return None
    method = q.get("quant_method") if isinstance(q, dict) else getattr(q, "quant_method", None)
    method = getattr(method, "value", method)
    return str(method).lower() if method else None


def _stored(model: nn.Module) -> str | None:
    """The checkpoint's quantization: what `load_target` read before loading (transformers drops the config's
    `quantization_config` when it dequantizes), else the loaded config's."""
    return getattr(model, "stored_quantization", None) or quant_method(model.config)


def loaded_storage(model: nn.Module) -> dict:
    """`env.storage` of a loaded HF model: `experts` and `dense` (the format as loaded: bf16, fp32, fp8, mxfp4, or
    `dequantized to bf16` where the checkpoint was quantized and the weights are not), `stored` (the checkpoint's
    quantization or None), `experts_implementation`, `attn_implementation`, `devices` (bytes per device)."""
    experts, dense = [], []
    devices: Counter = Counter()
    for name, p in model.named_parameters():
        (experts if ".experts." in name or name.endswith(".experts") else dense).append((name, p))
        devices[str(p.device)] += p.numel() * p.element_size()
    for name, b in model.named_buffers():
        if name.endswith(("_blocks", "_scales", "scale_inv")):
            (experts if ".experts." in name else dense).append((name, b))
            devices[str(b.device)] += b.numel() * b.element_size()
    stored = _stored(model)
    out = {"experts": _format(experts), "dense": _format(dense)}
    if stored in ("fp8", "mxfp4"):
        for key in ("experts", "dense"):
            if out[key] not in (None, "fp8", "mxfp4") and (key == "experts" or stored == "fp8"):
                out[key] = f"dequantized to {out[key]}"
    cfg = model.config
    return {
        **out,
        "stored": stored,
        "experts_implementation": getattr(cfg, "_experts_implementation", None),
        "attn_implementation": getattr(cfg, "_attn_implementation", None),
        "devices": dict(devices),
    }


def _importable(name: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(name) is not None


# the compute capability transformers needs to keep each format quantized (below it, it dequantizes)
MIN_CAPABILITY = {"fp8": (8, 9), "mxfp4": (7, 5)}


def partial_blocks(config) -> list[str]:
    """The block-FP8 weights whose last block is partial ('name rows x cols'), counted on the meta device (no
    weights read). transformers 5.24 dequantizes with a block height of rows // scale rows, so such a weight fails
    the load or loads wrong values (DeepSeek-V3's kv_a_proj_with_mqa: 512 + 64 = 576 rows, 4.5 blocks of 128)."""
    from ecospec.models.adapters import meta_model

    q = getattr(config, "quantization_config", None) or {}
    q = q if isinstance(q, dict) else q.to_dict()
    rows, cols = q.get("weight_block_size") or (128, 128)
    skip = tuple(q.get("modules_to_not_convert") or ()) + ("lm_head",)
    out = []
    for name, module in meta_model(config).named_modules():
        if isinstance(module, nn.Linear) and not any(k in name for k in skip):
            r, c = module.weight.shape
            if r % rows or c % cols:
                out.append(f"{name} {r}x{c}")
    return out


def format_fork(
    config, device_type: str, name: str = "the target", capability: tuple[int, int] | None = None, dtype: str = "bf16"
) -> str | None:
    """One line, before any weights are read, when the checkpoint's quantized format will not be kept where it
    loads (transformers dequantizes MXFP4 without `kernels` + Triton + a CUDA GPU of compute capability >= 7.5, and
    block-FP8 without Triton on a CUDA GPU of capability >= 8.9): what will happen and the two ways out; for block
    FP8, also the weights transformers cannot dequantize (`partial_blocks`). None when the format is kept or there
    is nothing to keep. `capability`: the GPU's (default: the current CUDA device's); `dtype`: what it loads in."""
    method = quant_method(config)
    if method not in ("mxfp4", "fp8"):
        return None
    missing = [] if device_type == "cuda" else ["a CUDA GPU"]
    if device_type == "cuda":
        capability = capability or torch.cuda.get_device_capability()
        need = MIN_CAPABILITY[method]
        if tuple(capability) < need:
            missing.append(
                f"a GPU of compute capability >= {need[0]}.{need[1]} (this one: {capability[0]}.{capability[1]})"
            )
    missing += [m for m in (("kernels", "triton") if method == "mxfp4" else ("triton",)) if not _importable(m)]
    if not missing:
        return None
    parts = "its routed experts" if method == "mxfp4" else "its weights"
    what = missing[0] if len(missing) == 1 else f"{', '.join(missing[:-1])} and {missing[-1]}"
    line = (
        f"{name}: the checkpoint stores {parts} in {method}, but without {what}, transformers will dequantize them "
        f"to {dtype} as it loads (2-4x the bytes the stored-format sizing assumed; env.storage will say "
        f"'dequantized to {dtype}'); ways out: `pip install -e .[gpu]` (adds `kernels`) with its kernel fetched "
        f"ahead on a networked node, or the GPUs bf16 needs (python -m ecospec.analysis.sizing --model <name> "
        f"--kernels no)"
    )
    if method == "fp8":
        bad = partial_blocks(config)
        if bad:
            line += (
                f"; but transformers cannot dequantize {len(bad)} weights whose last block is partial (e.g. "
                f"{bad[0]}): that load fails or reads wrong values, so only the kept-FP8 path loads this "
                f"checkpoint"
            )
    return line
