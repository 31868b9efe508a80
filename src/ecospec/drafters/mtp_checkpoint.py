"""MTP checkpoint files: read the MTP module out of a DeepSeek-V3 checkpoint, write one back.

Layout (DeepSeek-V3 README_WEIGHTS.md): the MTP module is decoder layer `num_hidden_layers`
(`model.layers.61.*` for V3/V3.1), keys under that prefix:

    embed_tokens.weight                       optional here (a copy of the main embedding)
    enorm.weight, hnorm.weight, eh_proj.weight
    input_layernorm.weight, post_attention_layernorm.weight
    self_attn.{q_a_proj, q_a_layernorm, q_b_proj | q_proj, kv_a_proj_with_mqa, kv_a_layernorm, kv_b_proj, o_proj}.weight
    mlp.gate.weight, mlp.gate.e_score_correction_bias
    mlp.experts.{e}.{gate,up,down}_proj.weight          (per expert; transformers fuses them: see below)
    mlp.shared_experts.{gate,up,down}_proj.weight
    shared_head.norm.weight
    shared_head.head.weight                   optional here (a copy of the main lm_head)

transformers' DeepseekV3Experts stores `gate_up_proj` [E, 2I, H] (gate rows first, then up: its forward
chunks the product in that order) and `down_proj` [E, H, I]; the per-expert tensors are stacked into those.

FP8 (the released V3/V3.1 files): a `float8_e4m3fn` weight W [out, in] comes with `W_scale_inv` (float32,
[ceil(out/bo), ceil(in/bi)], block size `quantization_config.weight_block_size`, [128, 128] for V3).
Dequantisation (README_WEIGHTS.md, "(128x128 weight block) * weight_scale_inv"):

    w[i, j] = float(w_fp8[i, j]) * scale_inv[i // bo, j // bi]

computed in float32, then cast to the requested dtype.

Only the shards that hold `model.layers.{N}.*` keys are opened (from `model.safetensors.index.json`), and
from them only those keys are read (`safetensors.safe_open`), so the main model's ~700 GB are never loaded.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path

import torch

from ecospec.drafters.eagle3_checkpoint import CheckpointError
from ecospec.drafters.mtp import MtpHead

__all__ = ["CheckpointError", "dequantize_fp8", "load_mtp", "save_mtp"]

_INDEX = "model.safetensors.index.json"
_SINGLE = "model.safetensors"
_SCALE = "_scale_inv"  # suffix of FP8 block scales: `<name>.weight_scale_inv`
_FP8 = (torch.float8_e4m3fn, torch.float8_e5m2)
_OPTIONAL = ("embed_tokens.weight", "shared_head.head.weight")


def dequantize_fp8(weight: torch.Tensor, scale_inv: torch.Tensor, block: tuple[int, int] = (128, 128)) -> torch.Tensor:
    """Block-scaled FP8 -> float32: w[i, j] = float(weight[i, j]) * scale_inv[i // block[0], j // block[1]]."""
    bo, bi = block
    out, inp = weight.shape
    expected = (-(-out // bo), -(-inp // bi))
    if tuple(scale_inv.shape) != expected:
        raise ValueError(
            f"scale_inv shape {list(scale_inv.shape)} does not tile {list(weight.shape)} in {block} blocks"
        )
    scale = scale_inv.float().repeat_interleave(bo, dim=0).repeat_interleave(bi, dim=1)[:out, :inp]
    return weight.float() * scale


# ----------------------------------------------------------------------------------------------------
# head parameter names <-> checkpoint names (without the `model.layers.{N}.` prefix)
# ----------------------------------------------------------------------------------------------------


def _to_checkpoint(state: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Head state dict -> checkpoint tensors (experts split per expert)."""
    out: dict[str, torch.Tensor] = {}
    for name, t in state.items():
        if name == "decoder.mlp.experts.gate_up_proj":
            gate, up = t.chunk(2, dim=1)
            for e in range(t.shape[0]):
                out[f"mlp.experts.{e}.gate_proj.weight"] = gate[e]
                out[f"mlp.experts.{e}.up_proj.weight"] = up[e]
        elif name == "decoder.mlp.experts.down_proj":
            for e in range(t.shape[0]):
                out[f"mlp.experts.{e}.down_proj.weight"] = t[e]
        else:
            out[name.removeprefix("decoder.")] = t
    return out


def _expected(head: MtpHead) -> dict[str, tuple[int, ...]]:
    """Checkpoint name -> shape of every tensor the head needs (optional copies included when the head has them)."""
    meta = {k: torch.empty(v.shape, device="meta") for k, v in head.state_dict().items()}
    return {k: tuple(v.shape) for k, v in _to_checkpoint(meta).items()}


def _from_checkpoint(tensors: dict[str, torch.Tensor], head: MtpHead) -> dict[str, torch.Tensor]:
    """Checkpoint tensors (validated) -> head state dict, experts stacked. Consumes `tensors` as it goes, so
    the per-expert copies are freed while the stacked ones fill (peak memory ~ one layer, not two)."""
    state: dict[str, torch.Tensor] = {}
    n_experts = head.decoder.mlp.experts.num_experts
    for name in head.state_dict():
        if name in ("decoder.mlp.experts.gate_up_proj", "decoder.mlp.experts.down_proj"):
            parts = ("gate", "up") if name.endswith("gate_up_proj") else ("down",)
            first = tensors[f"mlp.experts.0.{parts[0]}_proj.weight"]
            rows = first.shape[0]
            stacked = first.new_empty(n_experts, rows * len(parts), first.shape[1])
            for e in range(n_experts):
                for i, part in enumerate(parts):
                    stacked[e, i * rows : (i + 1) * rows] = tensors.pop(f"mlp.experts.{e}.{part}_proj.weight")
            state[name] = stacked
        else:
            state[name] = tensors.pop(name.removeprefix("decoder."))
    return state


# ----------------------------------------------------------------------------------------------------
# files
# ----------------------------------------------------------------------------------------------------


def _resolve(path_or_id: str | Path, need_config: bool) -> tuple[Path, dict[str, str] | None]:
    """Local directory (or HF hub snapshot of only the files needed) and its weight map (None = single file)."""
    path = Path(path_or_id)
    if not path.is_dir():
        from huggingface_hub import hf_hub_download

        index = Path(hf_hub_download(str(path_or_id), _INDEX))
        path = index.parent
        if need_config:
            hf_hub_download(str(path_or_id), "config.json")
    if (path / _INDEX).exists():
        return path, json.loads((path / _INDEX).read_text())["weight_map"]
    if (path / _SINGLE).exists():
        return path, None
    raise FileNotFoundError(f"{path}: no {_INDEX} or {_SINGLE}")


def _read_layer(path_or_id: str | Path, prefix: str, need_config: bool) -> tuple[Path, dict[str, torch.Tensor]]:
    """All tensors whose key starts with `prefix`, prefix removed, read from the shards that hold them only."""
    from safetensors import safe_open

    path, weight_map = _resolve(path_or_id, need_config)
    if weight_map is None:
        by_shard = {_SINGLE: None}
    else:
        by_shard = {}
        for key, shard in weight_map.items():
            if key.startswith(prefix):
                by_shard.setdefault(shard, []).append(key)
    if weight_map is not None and not Path(path_or_id).is_dir():
        from huggingface_hub import hf_hub_download

        for shard in by_shard:
            hf_hub_download(str(path_or_id), shard)
    out: dict[str, torch.Tensor] = {}
    for shard, keys in by_shard.items():
        with safe_open(str(path / shard), framework="pt") as f:
            for key in keys if keys is not None else [k for k in f.keys() if k.startswith(prefix)]:
                out[key.removeprefix(prefix)] = f.get_tensor(key)
    return path, out


def _convert(raw: dict[str, torch.Tensor], block: tuple[int, int], dtype: torch.dtype, device) -> tuple[dict, list]:
    """Dequantise FP8 weights and cast every tensor to `dtype` on `device`, one tensor at a time (consuming
    `raw`). The router stays float32 when `dtype` is 16-bit, as transformers keeps it for the target.
    Returns the tensors and the scale problems found, as (kind, text) pairs."""
    out, problems = {}, []
    keep_fp32 = dtype in (torch.bfloat16, torch.float16)
    for name in [k for k in raw if not k.endswith(_SCALE)]:
        t, scale = raw.pop(name), raw.pop(name + _SCALE, None)
        if scale is not None:
            try:
                t = dequantize_fp8(t, scale, block)
            except ValueError as e:
                problems.append(("misshaped", f"{name + _SCALE}: {e}"))
        elif t.dtype in _FP8:
            problems.append(("missing", f"{name + _SCALE} (FP8 weight {name} has no block scale)"))
        out[name] = t.to(device=device, dtype=torch.float32 if keep_fp32 and name.startswith("mlp.gate.") else dtype)
    problems += [("unexpected", f"{k} (a block scale without its weight)") for k in raw]
    return out, problems


def _block_size(config) -> tuple[int, int]:
    q = getattr(config, "quantization_config", None) or {}
    if not isinstance(q, Mapping):
        q = q.to_dict()
    return tuple(q.get("weight_block_size") or (128, 128))


def load_mtp(
    path_or_id: str | Path,
    target_config=None,
    *,
    dtype: torch.dtype | None = None,
    device: str | torch.device | None = None,
    layer: int | None = None,
) -> MtpHead:
    """The MTP module of a DeepSeek-V3 safetensors checkpoint (local directory or HF hub id) as an MtpHead.

    `target_config` (the target's DeepseekV3Config; default: the checkpoint's config.json) gives the shapes
    and `layer` (default num_hidden_layers, the first MTP module). FP8 weights are dequantised. `dtype`
    defaults to the stored dtype of eh_proj (bfloat16 for FP8 files); like transformers does for the target,
    the router (`mlp.gate.weight`, `e_score_correction_bias`) stays float32 when `dtype` is 16-bit.
    `embed_tokens` / `shared_head.head` are loaded when present, else the head shares the target's
    (`MtpHead.tie`, or `MtpDrafter(head, target)`). Missing, unexpected or misshaped keys raise one
    CheckpointError naming all of them.
    """
    if target_config is None:
        from transformers import AutoConfig

        path, _ = _resolve(path_or_id, need_config=True)
        target_config = AutoConfig.from_pretrained(path)
    cfg = getattr(target_config, "text_config", None) or target_config
    n = cfg.num_hidden_layers if layer is None else layer
    prefix = f"model.layers.{n}."
    _, raw = _read_layer(path_or_id, prefix, need_config=False)
    if not raw:
        raise CheckpointError(f"{path_or_id}: no `{prefix}*` tensors (is this a DeepSeek-V3 checkpoint with MTP?)")
    if dtype is None:
        stored = raw.get("eh_proj.weight")
        dtype = torch.bfloat16 if stored is None or stored.dtype in _FP8 else stored.dtype
    tensors, problems = _convert(raw, _block_size(cfg), dtype, device)

    with torch.device("meta"):
        head = MtpHead(
            cfg, has_embed_tokens="embed_tokens.weight" in tensors, has_lm_head="shared_head.head.weight" in tensors
        )
    expected = _expected(head)
    found: dict[str, list[str]] = {"missing": [], "unexpected": [], "misshaped": []}
    for k, shape in expected.items():
        if k not in tensors:
            found["missing"].append(f"{prefix}{k} (expected shape {list(shape)})")
        elif tuple(tensors[k].shape) != shape:
            found["misshaped"].append(f"{prefix}{k}: got {list(tensors[k].shape)}, expected {list(shape)}")
    found["unexpected"] += [f"{prefix}{k} (shape {list(t.shape)})" for k, t in tensors.items() if k not in expected]
    for kind, text in problems:
        found[kind].append(prefix + text)
    if any(found.values()):
        lines = [f"MTP checkpoint {path_or_id} (layer {n}) does not match the target config:"]
        lines += [f"  {kind}: {text}" for kind, texts in found.items() for text in texts]
        raise CheckpointError("\n".join(lines), found["missing"], found["unexpected"], found["misshaped"])
    head.load_state_dict(_from_checkpoint(tensors, head), strict=True, assign=True)
    return head.eval()


def save_mtp(head: MtpHead, directory: str | Path, *, shards: int = 1, layer: int | None = None) -> Path:
    """Write `head` as a DeepSeek-V3-style checkpoint: config.json (the target config the head was built
    from) and the `model.layers.{N}.*` tensors (N = layer, default num_hidden_layers) in `model.safetensors`
    or, with shards > 1, in `model-0000i-of-0000n.safetensors` files plus `model.safetensors.index.json`."""
    from safetensors.torch import save_file

    path = Path(directory)
    path.mkdir(parents=True, exist_ok=True)
    n = head.config.num_hidden_layers if layer is None else layer
    head.config.to_json_file(path / "config.json", use_diff=False)
    tensors = {
        f"model.layers.{n}.{k}": v.detach().contiguous().cpu().clone()
        for k, v in _to_checkpoint(head.state_dict()).items()
    }
    if shards <= 1:
        save_file(tensors, str(path / _SINGLE), metadata={"format": "pt"})
        return path
    names = sorted(tensors)
    weight_map: dict[str, str] = {}
    for i in range(shards):
        part = names[i::shards]
        shard = f"model-{i + 1:05d}-of-{shards:05d}.safetensors"
        save_file({k: tensors[k] for k in part}, str(path / shard), metadata={"format": "pt"})
        weight_map.update(dict.fromkeys(part, shard))
    total = sum(t.numel() * t.element_size() for t in tensors.values())
    (path / _INDEX).write_text(
        json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map}, indent=2) + "\n"
    )
    return path
