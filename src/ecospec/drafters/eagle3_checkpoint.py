"""EAGLE-3 checkpoint files: load and save heads in the two public layouts (EAGLE and speculators).

`load_eagle3` detects the layout from config.json, builds an `Eagle3Config` from it (converting each
format's aux-layer convention to HF hidden_states indices, see `aux_layers_from_config`), renames tensors
to the EAGLE layout (`midlayer.*`) and checks them against the expected shapes, raising one
`CheckpointError` that lists every problem. `save_eagle3` writes either layout.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

import torch

from ecospec.drafters.eagle3 import Eagle3Config, Eagle3Head, default_aux_hidden_layers

__all__ = [
    "CheckpointError",
    "aux_layers_from_config",
    "load_eagle3",
    "save_eagle3",
]


class CheckpointError(ValueError):
    """An EAGLE-3 checkpoint that cannot be loaded faithfully. Lists every offending key at once."""

    def __init__(
        self,
        message: str,
        missing: Sequence[str] = (),
        unexpected: Sequence[str] = (),
        misshaped: Sequence[str] = (),
    ):
        super().__init__(message)
        self.missing = list(missing)
        self.unexpected = list(unexpected)
        self.misshaped = list(misshaped)


# Keys some exporters add that carry nothing the head needs.
_IGNORABLE_SUFFIXES = ("rotary_emb.inv_freq", "verifier_norm.weight", "verifier_lm_head.weight")
_LAYER_PREFIX = {"eagle": "midlayer.", "speculators": "layers.0."}


# Decoder-layer config keys the head reads from a checkpoint's (nested) layer config.
_LAYER_KEYS = (
    "hidden_size",
    "intermediate_size",
    "num_attention_heads",
    "num_key_value_heads",
    "head_dim",
    "rms_norm_eps",
    "max_position_embeddings",
    "hidden_act",
    "vocab_size",
)


def _expected_shapes(config: Eagle3Config) -> dict[str, tuple[int, ...]]:
    """Expected tensor names (EAGLE layout, `midlayer.*`) -> shapes, without the optional embed_tokens."""
    c = config
    h, d = c.hidden_size, c.head_dim
    shapes: dict[str, tuple[int, ...]] = {
        "fc.weight": (h, c.feature_size),
        "midlayer.self_attn.q_proj.weight": (c.num_attention_heads * d, 2 * h),
        "midlayer.self_attn.k_proj.weight": (c.num_key_value_heads * d, 2 * h),
        "midlayer.self_attn.v_proj.weight": (c.num_key_value_heads * d, 2 * h),
        "midlayer.self_attn.o_proj.weight": (h, c.num_attention_heads * d),
        "midlayer.mlp.gate_proj.weight": (c.intermediate_size, h),
        "midlayer.mlp.up_proj.weight": (c.intermediate_size, h),
        "midlayer.mlp.down_proj.weight": (h, c.intermediate_size),
        "midlayer.hidden_norm.weight": (h,),
        "midlayer.input_layernorm.weight": (h,),
        "midlayer.post_attention_layernorm.weight": (h,),
        "norm.weight": (h,),
        "lm_head.weight": (c.draft_vocab_size, h),
        "d2t": (c.draft_vocab_size,),
        "t2d": (c.vocab_size,),
    }
    if c.norm_before_fc:
        shapes["input_norm.weight"] = (c.feature_size,)
    if c.qk_norm:
        shapes["midlayer.self_attn.q_norm.weight"] = (d,)
        shapes["midlayer.self_attn.k_norm.weight"] = (d,)
    return shapes


def _to_layout(name: str, layout: str) -> str:
    return _LAYER_PREFIX[layout] + name[len("midlayer.") :] if name.startswith("midlayer.") else name


def _from_layout(name: str, layout: str) -> str:
    prefix = _LAYER_PREFIX[layout]
    return "midlayer." + name[len(prefix) :] if name.startswith(prefix) else name


def _read_tensors(path: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    single = path / "model.safetensors"
    if single.exists():
        return load_file(single)
    index = path / "model.safetensors.index.json"
    if index.exists():
        shards = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        out: dict[str, torch.Tensor] = {}
        for shard in shards:
            out.update(load_file(path / shard))
        return out
    binary = path / "pytorch_model.bin"
    if binary.exists():
        return torch.load(binary, map_location="cpu", weights_only=True)
    raise FileNotFoundError(f"{path}: no model.safetensors, model.safetensors.index.json or pytorch_model.bin")


def _detect_layout(cfg: Mapping[str, Any]) -> Literal["eagle", "speculators"]:
    kind = cfg.get("speculators_model_type")
    if kind is None:
        return "eagle"
    if kind != "eagle3":
        raise CheckpointError(f"speculators checkpoint of type {kind!r}, expected 'eagle3'")
    return "speculators"


def _num_layers(target_config: Any) -> int | None:
    if target_config is None:
        return None
    tc = target_config
    if isinstance(tc, Mapping):
        tc = tc.get("text_config") or tc
        n = tc.get("num_hidden_layers")
    else:
        tc = getattr(tc, "text_config", None) or tc
        n = getattr(tc, "num_hidden_layers", None)
    return None if n is None else int(n)


def _target_attr(target_config: Any, name: str) -> Any:
    if target_config is None:
        return None
    tc = target_config
    if isinstance(tc, Mapping):
        tc = tc.get("text_config") or tc
        return tc.get(name)
    tc = getattr(tc, "text_config", None) or tc
    return getattr(tc, name, None)


def aux_layers_from_config(cfg: Mapping[str, Any], num_target_layers: int | None = None) -> tuple[int, ...] | None:
    """HF hidden_states indices of the head's features, from a checkpoint config.json (None = not stated
    and no target layer count to derive the default from). Conventions, by where the ids live:

    * `ecospec_aux_hidden_layers` (written by `save_eagle3`): HF indices, taken as is.
    * top-level `eagle_aux_hidden_state_layer_ids` (speculators; also what vLLM reads): ids are hidden-state
      boundary indices = HF indices. vLLM captures the residual stream *entering* layer id (llama.py
      `if idx in self.aux_hidden_state_layers` before the layer call; newer models `_maybe_add_hidden_state`
      with idx + 1 after layer idx); speculators' `resolve_target_layer_ids` defaults to
      [2, L//2, L-3] and accepts id L (the final state). `null` = default.
    * nested `eagle_config.eagle_aux_hidden_state_layer_ids` (SpecForge, ModelOpt; read by SGLang): ids mean
      "output of decoder layer id" = HF index id + 1. SpecForge's HF backend hooks the *output* of
      layers [1, L//2-1, L-4] by default (= HF 2, L//2, L-3) and its sglang path calls
      `set_eagle3_layers_to_capture` which adds 1; ModelOpt's `_set_default_aux_hidden_state_layers`
      writes [1, L//2-1, L-4] and hooks layer outputs. SGLang (PR #25454) only adds 1 when the first id is
      1 and treats other lists as boundary indices (e.g. nvidia/gpt-oss-120b-Eagle3-v3's [24, 30, 36]);
      we follow that rule.
    * none of these (EAGLE repo heads, yuhuili/EAGLE3-*): the EAGLE default (2, L//2, L-3), which needs
      the target's layer count.
    """
    if cfg.get("ecospec_aux_hidden_layers") is not None:
        return tuple(int(i) for i in cfg["ecospec_aux_hidden_layers"])
    top = cfg.get("eagle_aux_hidden_state_layer_ids")
    if top:
        return tuple(int(i) for i in top)
    nested = (cfg.get("eagle_config") or {}).get("eagle_aux_hidden_state_layer_ids")
    if nested:
        ids = [int(i) for i in nested]
        if ids[0] == 1:
            return tuple(i + 1 for i in ids)
        return tuple(ids)
    return None if num_target_layers is None else default_aux_hidden_layers(num_target_layers)


def _layer_dict(cfg: Mapping[str, Any], layout: str) -> dict[str, Any]:
    """Llama-style layer config as a full dict (class defaults filled in by transformers)."""
    from transformers import AutoConfig
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    raw = dict(cfg["transformer_layer_config"]) if layout == "speculators" else dict(cfg)
    model_type = raw.pop("model_type", None) or "llama"
    if model_type not in CONFIG_MAPPING:
        model_type = "llama"
    keep = {
        k: v
        for k, v in raw.items()
        if k in (*_LAYER_KEYS, "rope_theta", "rope_scaling", "rope_parameters", "attention_bias", "mlp_bias")
    }
    hf = AutoConfig.for_model(model_type, **keep)
    out = {k: getattr(hf, k, None) for k in _LAYER_KEYS}
    out["rope_parameters"] = dict(getattr(hf, "rope_parameters", None) or {})
    out["model_type"] = model_type
    out["attention_bias"] = bool(getattr(hf, "attention_bias", False))
    out["mlp_bias"] = bool(getattr(hf, "mlp_bias", False))
    return out


def _config_from_json(
    cfg: Mapping[str, Any], layout: str, target_config: Any, aux_hidden_layers: Sequence[int] | None
) -> Eagle3Config:
    layer = _layer_dict(cfg, layout)
    problems = []
    for flag in ("norm_output", "fc_norm"):
        if cfg.get(flag):
            problems.append(f"{flag}=true (EAGLE-3.1 variant) is not supported")
    if layer["attention_bias"] or layer["mlp_bias"]:
        problems.append("attention_bias/mlp_bias heads are not supported")
    if problems:
        raise CheckpointError("unsupported EAGLE-3 checkpoint: " + "; ".join(problems))

    heads = int(layer["num_attention_heads"])
    hidden = int(layer["hidden_size"])
    head_dim = layer.get("head_dim") or hidden // heads
    vocab = int(layer["vocab_size"])
    target_vocab = _target_attr(target_config, "vocab_size")
    if target_vocab is not None and int(target_vocab) != vocab:
        raise CheckpointError(f"head vocab_size {vocab} != target vocab_size {target_vocab}")
    target_hidden = cfg.get("target_hidden_size") or hidden
    t_hidden = _target_attr(target_config, "hidden_size")
    if t_hidden is not None and int(t_hidden) != int(target_hidden):
        raise CheckpointError(f"head target_hidden_size {target_hidden} != target hidden_size {t_hidden}")
    if aux_hidden_layers is not None:
        aux = tuple(aux_hidden_layers)
    else:
        aux = aux_layers_from_config(cfg, _num_layers(target_config))
        if aux is None:
            raise CheckpointError(
                "the checkpoint does not name its target feature layers "
                "(no eagle_aux_hidden_state_layer_ids): pass target_config (for the EAGLE default "
                "(2, L//2, L-3)) or aux_hidden_layers"
            )
    n_target = _num_layers(target_config)
    if n_target is not None and max(aux) > n_target:
        raise CheckpointError(f"aux_hidden_layers {aux} exceed the target's hidden_states range [0, {n_target}]")

    rope = dict(layer["rope_parameters"])
    theta = float(rope.pop("rope_theta", 10000.0))
    qk_norm = cfg.get("qk_norm")
    if qk_norm is None:
        qk_norm = layout == "speculators" and layer["model_type"] == "qwen3"
    try:
        return Eagle3Config(
            hidden_size=hidden,
            intermediate_size=int(layer["intermediate_size"]),
            num_attention_heads=heads,
            num_key_value_heads=int(layer.get("num_key_value_heads") or heads),
            head_dim=int(head_dim),
            vocab_size=vocab,
            draft_vocab_size=int(cfg.get("draft_vocab_size") or vocab),
            target_hidden_size=int(target_hidden),
            aux_hidden_layers=aux,
            rms_norm_eps=float(layer.get("rms_norm_eps") or 1e-6),
            rope_theta=theta,
            rope_scaling=rope or None,
            max_position_embeddings=int(layer.get("max_position_embeddings") or 2048),
            hidden_act=str(layer.get("hidden_act") or "silu"),
            norm_before_residual=bool(cfg.get("norm_before_residual", False)),
            norm_before_fc=bool(cfg.get("norm_before_fc", False)),
            qk_norm=bool(qk_norm),
        )
    except ValueError as e:
        raise CheckpointError(f"invalid EAGLE-3 config: {e}") from e


def _check_tensors(tensors: Mapping[str, torch.Tensor], config: Eagle3Config, layout: str) -> dict[str, torch.Tensor]:
    """Rename to the EAGLE layout and validate; raise one CheckpointError naming every problem."""
    expected = _expected_shapes(config)
    optional = {"embed_tokens.weight": (config.vocab_size, config.hidden_size)}
    if config.draft_vocab_size == config.vocab_size:  # identity vocab: mapping tables may be absent
        optional["d2t"] = expected.pop("d2t")
        optional["t2d"] = expected.pop("t2d")
    renamed = {_from_layout(k, layout): v for k, v in tensors.items()}
    missing, unexpected, misshaped = [], [], []
    for name, shape in expected.items():
        if name not in renamed:
            missing.append(f"{_to_layout(name, layout)} (expected shape {list(shape)})")
    for name, t in renamed.items():
        shape = expected.get(name, optional.get(name))
        if shape is None:
            if not name.endswith(_IGNORABLE_SUFFIXES):
                unexpected.append(f"{_to_layout(name, layout)} (shape {list(t.shape)})")
            continue
        if tuple(t.shape) != tuple(shape):
            misshaped.append(f"{_to_layout(name, layout)}: got {list(t.shape)}, expected {list(shape)}")
        elif name == "d2t" and (t.dtype.is_floating_point or t.dtype == torch.bool):
            misshaped.append(f"d2t: dtype {t.dtype}, expected an integer type")
    if not (missing or unexpected or misshaped) and "d2t" in renamed:
        target = torch.arange(config.draft_vocab_size) + renamed["d2t"].long()
        if target.numel() and (int(target.min()) < 0 or int(target.max()) >= config.vocab_size):
            misshaped.append(f"d2t: maps draft ids outside the target vocabulary [0, {config.vocab_size})")
    if missing or unexpected or misshaped:
        lines = [f"EAGLE-3 checkpoint ({layout} layout) does not match its config:"]
        lines += [f"  missing: {m}" for m in missing]
        lines += [f"  unexpected: {u}" for u in unexpected]
        lines += [f"  misshaped: {s}" for s in misshaped]
        raise CheckpointError("\n".join(lines), missing, unexpected, misshaped)
    return {k: v for k, v in renamed.items() if not k.endswith(_IGNORABLE_SUFFIXES)}


def load_eagle3(
    path: str | Path,
    target_config: Any = None,
    *,
    aux_hidden_layers: Sequence[int] | None = None,
    dtype: torch.dtype | None = None,
) -> Eagle3Head:
    """Load an EAGLE-3 head from a directory with config.json + model.safetensors (or pytorch_model.bin).

    Layout (EAGLE `midlayer.*` or speculators `layers.0.*`) is detected from config.json. `target_config`
    (an HF config or dict) supplies the layer count for heads that do not name their feature layers and
    is used to cross-check vocab/hidden sizes. `aux_hidden_layers` (HF hidden_states indices) overrides
    whatever the checkpoint says. Tensors keep their stored dtype unless `dtype` is given.
    """
    path = Path(path)
    cfg_path = path / "config.json"
    if not cfg_path.exists():
        raise FileNotFoundError(f"{cfg_path} not found")
    cfg = json.loads(cfg_path.read_text())
    layout = _detect_layout(cfg)
    config = _config_from_json(cfg, layout, target_config, aux_hidden_layers)
    tensors = _check_tensors(_read_tensors(path), config, layout)
    head = Eagle3Head(config, has_embed_tokens="embed_tokens.weight" in tensors)
    if dtype is None:
        dtype = tensors["fc.weight"].dtype
    head.to(dtype)
    state = head.state_dict()
    for name, t in tensors.items():
        state[name] = t.to(state[name].dtype)
    if "t2d" not in tensors:  # identity vocab without tables
        state["t2d"] = torch.ones_like(state["t2d"])
    head.load_state_dict(state, strict=True)
    return head


def save_eagle3(head: Eagle3Head, path: str | Path, layout: Literal["eagle", "speculators"] = "eagle") -> Path:
    """Write `head` as config.json + model.safetensors in the EAGLE (`midlayer.*`, flat Llama config) or
    speculators (`layers.0.*`, nested transformer_layer_config) layout. The aux layers are written in each
    format's own convention and, unambiguously, as `ecospec_aux_hidden_layers` (HF indices)."""
    from safetensors.torch import save_file

    if layout not in _LAYER_PREFIX:
        raise ValueError(f"layout must be 'eagle' or 'speculators', got {layout!r}")
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    c = head.config
    layer_cfg: dict[str, Any] = {
        "model_type": "qwen3" if (c.qk_norm and layout == "speculators") else "llama",
        "hidden_size": c.hidden_size,
        "intermediate_size": c.intermediate_size,
        "num_attention_heads": c.num_attention_heads,
        "num_key_value_heads": c.num_key_value_heads,
        "head_dim": c.head_dim,
        "num_hidden_layers": 1,
        "rms_norm_eps": c.rms_norm_eps,
        "rope_theta": c.rope_theta,
        "rope_scaling": dict(c.rope_scaling) if c.rope_scaling else None,
        "max_position_embeddings": c.max_position_embeddings,
        "hidden_act": c.hidden_act,
        "vocab_size": c.vocab_size,
        "attention_bias": False,
        "mlp_bias": False,
    }
    common = {
        "draft_vocab_size": c.draft_vocab_size,
        "target_hidden_size": c.target_hidden_size,
        "norm_before_residual": c.norm_before_residual,
        "norm_before_fc": c.norm_before_fc,
        "qk_norm": c.qk_norm,
        "ecospec_aux_hidden_layers": list(c.aux_hidden_layers),
    }
    if layout == "eagle":
        cfg: dict[str, Any] = {"architectures": ["LlamaForCausalLMEagle3"], **layer_cfg, **common}
        if min(c.aux_hidden_layers) >= 1:  # SpecForge/ModelOpt convention: output of layer id = HF index - 1
            cfg["eagle_config"] = {"eagle_aux_hidden_state_layer_ids": [i - 1 for i in c.aux_hidden_layers]}
    else:
        cfg = {
            "architectures": ["Eagle3Speculator"],
            "speculators_model_type": "eagle3",
            "transformer_layer_config": layer_cfg,
            "eagle_aux_hidden_state_layer_ids": list(c.aux_hidden_layers),  # HF indices (vLLM convention)
            "speculators_config": {
                "algorithm": "eagle3",
                "default_proposal_method": "greedy",
                "proposal_methods": [{"proposal_type": "greedy", "speculative_tokens": 3}],
                "verifier": {"name_or_path": None, "architectures": []},
            },
            **common,
        }
    (path / "config.json").write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")
    state = head.state_dict()
    if c.draft_vocab_size == c.vocab_size and not state["d2t"].any():  # the whole vocabulary: no mapping tables,
        state = {k: v for k, v in state.items() if k not in ("d2t", "t2d")}  # which vLLM refuses for such a head
    tensors = {_to_layout(k, layout): v.detach().contiguous().cpu().clone() for k, v in state.items()}
    save_file(tensors, str(path / "model.safetensors"), metadata={"format": "pt"})
    return path
