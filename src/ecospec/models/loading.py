"""Build tiny random models, load real targets, and make perturbed copies (toy draft models)."""

from __future__ import annotations

import copy
import warnings

import torch
from transformers import AutoConfig, AutoModelForCausalLM, PreTrainedModel

from ecospec.models.adapters import MODEL_TYPES, moe_info, unsupported
from ecospec.models.presets import PRESETS
from ecospec.models.storage import format_fork, quant_method

# a load's dtype (torch or its name) as env.storage names it; "auto" dequantizes to bf16
_DTYPE_NAMES = {torch.float32: "fp32", "float32": "fp32", torch.float16: "fp16", "float16": "fp16"}

# Init std of the tiny models (HF default: 0.02). With every weight at std 0.02 and hidden sizes of
# 32-64, RMS-normalised activations (norm ~ sqrt(H)) hit the lm_head / router weights to give logits
# of std ~0.02 * sqrt(48) ~ 0.14: next-token distributions are nearly uniform, the top-1/top-2 logit
# gap is tiny (greedy decoding then flips on float noise between a 1-token and a T-token forward), and
# softmax routers are close to uniform. At 0.2 (about 1/sqrt(H)) logits and router logits have std
# ~1.4, attention scores are O(1): peaked but not one-hot distributions, clear greedy winners and
# input-dependent routing over many experts, while 2-4 layers keep the residual stream well scaled.
TINY_INIT_STD = 0.2


def _unknown_preset(preset: str) -> ValueError:
    return ValueError(f"unknown preset {preset!r}; available presets: {', '.join(sorted(PRESETS))}")


def tiny_config(preset: str, **overrides):
    """The HF config of a preset (``initializer_range`` defaults to TINY_INIT_STD), plus overrides."""
    if preset not in PRESETS:
        raise _unknown_preset(preset)
    kwargs = dict(PRESETS[preset])
    model_type = kwargs.pop("model_type")
    kwargs["initializer_range"] = TINY_INIT_STD
    kwargs.update(overrides)
    return AutoConfig.for_model(model_type, **kwargs)


def tiny_model(preset: str, seed: int = 0, dtype: torch.dtype = torch.float32, **overrides) -> PreTrainedModel:
    """Random init of the real HF class for ``PRESETS[preset]`` (``overrides`` go into the config), in
    eval mode. The same (preset, seed, overrides) gives the same weights; the global RNG is untouched.

    Weights are drawn in float32 and then cast, so a bf16 model is the rounded fp32 one. Attention and
    experts use the "eager" kernels (plain matmuls) so results do not depend on kernel dispatch.
    ``attn_implementation`` / ``experts_implementation`` in ``overrides`` replace those choices.
    """
    attn = overrides.pop("attn_implementation", "eager")
    experts = overrides.pop("experts_implementation", "eager")
    config = tiny_config(preset, **overrides)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_config(
            config, attn_implementation=attn, experts_implementation=experts, dtype=torch.float32
        )
    moe_info(model)  # every preset must be a supported MoE model
    return model.to(dtype).eval()


def load_target(
    name_or_path: str,
    dtype: str | torch.dtype = "auto",
    device_map: str | dict | None = None,
    attn_implementation: str | None = None,
    parallel: str = "device_map",
    experts_implementation: str | None = None,
) -> PreTrainedModel:
    """Load a supported MoE causal LM (HF hub id or local directory) in eval mode.

    `parallel` (`ecospec.parallel`): ``device_map`` (one process, `device_map` places the layers), or
    ``tp`` / ``ep``: this process is one rank of an initialised torch.distributed group and gets its shard of
    every layer (transformers' tensor / expert-parallel plan). The config is checked first, so an unsupported
    model (or a family without that plan) fails before any weights are read.
    """
    from ecospec.parallel import distributed_config, layout_problem, world

    config = AutoConfig.from_pretrained(name_or_path)
    family = getattr(config, "model_type", None)
    if family not in MODEL_TYPES:
        raise unsupported(f"{name_or_path} (model_type {family!r})")
    kwargs: dict = {"dtype": dtype}
    if parallel != "device_map":
        if world() < 2:
            raise ValueError(f"parallel={parallel!r} needs an initialised process group of >= 2 ranks")
        problem = layout_problem(family, parallel, world(), config)
        if problem:
            raise ValueError(f"parallel={parallel!r}: {problem}")
        kwargs["distributed_config"] = distributed_config(parallel, world())
    elif device_map is not None:
        kwargs["device_map"] = device_map
    if attn_implementation is not None:
        kwargs["attn_implementation"] = attn_implementation
    if experts_implementation is not None:
        kwargs["experts_implementation"] = experts_implementation
    on_gpu = torch.cuda.is_available() and (device_map not in (None, "cpu") or parallel != "device_map")
    device = "cuda" if on_gpu else "cpu"
    fork = format_fork(config, device, str(name_or_path), dtype=_DTYPE_NAMES.get(dtype, "bf16"))
    if fork:
        warnings.warn(fork, stacklevel=2)  # before the weights are read: the one line a cluster user needs here
    model = AutoModelForCausalLM.from_pretrained(name_or_path, **kwargs)
    model.stored_quantization = quant_method(config)  # env.storage: what the checkpoint stored, whatever loaded
    moe_info(model)  # raises UnsupportedModelError for a class we do not know how to hook
    return model.eval()


def perturbed_copy(model: PreTrainedModel, scale: float = 0.05, seed: int = 0) -> PreTrainedModel:
    """Deep copy of ``model`` with every floating parameter ``p`` replaced by
    ``p + scale * std(p) * N(0, 1)``; constant parameters (std 0, e.g. norm weights at init) are kept.

    A cheap stand-in for a draft model: it agrees with the original on most but not all greedy tokens.
    Deterministic for a seed (noise drawn on CPU from a private generator).
    """
    clone = copy.deepcopy(model)
    gen = torch.Generator(device="cpu").manual_seed(seed)
    with torch.no_grad():
        for p in clone.parameters():  # de-duplicated: a tied weight gets one noise draw
            if not p.is_floating_point() or p.numel() < 2 or p.device.type == "meta":
                continue
            std = p.detach().float().std()
            if not torch.isfinite(std) or std == 0:
                continue
            noise = torch.randn(p.shape, generator=gen, dtype=torch.float32)
            p.add_((noise * (scale * std.item())).to(device=p.device, dtype=p.dtype))
    return clone.eval()
