"""Family adapters: what the engine and the cost models need to know about an HF MoE causal LM.

The supported families (their HF classes, the router's attribute, their rules) are the records of
`ecospec.families`. A MoE decoder layer is one whose MLP holds ``experts``.

In every family the router's forward returns ``(router_logits, top_k_weights, top_k_indices)`` where the
indices are a LongTensor ``[tokens, k]`` over the flattened ``[batch * seq]`` tokens. Routed experts are
stored fused in ``layer.mlp.experts`` as 3-D parameters whose first dimension is the expert index.
"""

from __future__ import annotations

import copy

import torch

from ecospec.families import by_class
from ecospec.models.param_count import MoeInfo

# HF class name -> (family, name of the router attribute of a MoE block)
CLASS_FAMILIES: dict[str, tuple[str, str]] = {cls: (f.name, f.router) for cls, f in by_class().items()}
MODEL_TYPES = {family: cls for cls, (family, _) in CLASS_FAMILIES.items()}  # config.model_type -> class name
SUPPORTED_CLASSES: tuple[str, ...] = tuple(CLASS_FAMILIES)


class UnsupportedModelError(ValueError):
    """The model is not one of the supported MoE causal-LM classes."""


def unsupported(what: str) -> UnsupportedModelError:
    return UnsupportedModelError(
        f"{what} is not a supported MoE model; supported classes: {', '.join(SUPPORTED_CLASSES)}"
    )


def _family(model) -> tuple[str, str]:
    """(family, router attribute) from the model's class (or one of its bases)."""
    for klass in type(model).__mro__:
        if klass.__name__ in CLASS_FAMILIES:
            return CLASS_FAMILIES[klass.__name__]
    raise unsupported(type(model).__name__)


def _decoder_layers(model) -> torch.nn.ModuleList:
    return model.model.layers


def _moe_blocks(model) -> list[tuple[int, torch.nn.Module]]:
    """(layer index, mlp module) of every decoder layer whose MLP holds routed experts."""
    return [(i, layer.mlp) for i, layer in enumerate(_decoder_layers(model)) if hasattr(layer.mlp, "experts")]


def bypasses_router(mlp: torch.nn.Module) -> bool:
    """Whether a MoE block routes without calling its router module: transformers' kept-MXFP4 GPT-OSS block
    (`Mxfp4GptOssMLP`, with `kernels` + Triton on a GPU) takes the router's logits with F.linear and routes in a
    Triton kernel, so a hook on the router never fires (its expert-parallel variant still calls the router)."""
    return type(mlp).__name__ == "Mxfp4GptOssMLP" and not getattr(mlp.experts, "_is_hooked", False)


def moe_blocks(model) -> list[torch.nn.Module]:
    """The MLP module of each MoE layer, in ``moe_info(model).moe_layers`` order."""
    return [mlp for _, mlp in _moe_blocks(model)]


def routers(model) -> list[torch.nn.Module]:
    """The router module of each MoE layer, in ``moe_info(model).moe_layers`` order."""
    _, attr = _family(model)
    return [getattr(mlp, attr) for _, mlp in _moe_blocks(model)]


def _numel(module: torch.nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())


def moe_info(model) -> MoeInfo:
    """Static MoE facts of a supported model, counted from its instantiated modules (works on meta)."""
    family, _ = _family(model)
    blocks = _moe_blocks(model)
    if not blocks:
        raise unsupported(f"{type(model).__name__} (no routed-expert layers)")
    num_layers = len(_decoder_layers(model))
    # N from the router (replicated under tensor/expert parallelism; an expert-parallel experts module counts only
    # its rank's experts, its parameters are DTensors of the global shape)
    num_experts = int(routers(model)[0].weight.shape[0])
    for _, mlp in blocks:
        for name, p in mlp.experts.named_parameters():
            if p.shape[0] != num_experts:
                raise ValueError(f"expert parameter {name} {tuple(p.shape)} is not stacked over {num_experts} experts")
    per_layer = {_numel(mlp.experts) for _, mlp in blocks}
    if len(per_layer) != 1 or next(iter(per_layer)) % num_experts:
        raise ValueError(f"inconsistent routed-expert parameter counts {per_layer} for N={num_experts}")
    expert_params = next(iter(per_layer)) // num_experts
    shared = blocks[0][1].shared_experts if hasattr(blocks[0][1], "shared_experts") else None
    shared_params = _numel(shared) if shared is not None else 0
    total = _numel(model)  # parameters() de-duplicates tied embeddings / lm_head
    dense = total - expert_params * num_experts * len(blocks)
    top_k = int(routers(model)[0].top_k)
    return MoeInfo(
        family=family,
        num_layers=num_layers,
        moe_layers=tuple(i for i, _ in blocks),
        num_experts=num_experts,
        top_k=top_k,
        expert_params=expert_params,
        shared_expert_params=shared_params,
        dense_params=dense,
    )


_CONFIG_INFO_CACHE: dict[str, MoeInfo] = {}


def config_moe_info(config) -> MoeInfo:
    """``moe_info`` from a config alone: the model is built on the meta device (no memory, no init), so
    this works for the full-size configs (e.g. a 235B model) as well. Results are cached per config."""
    model_type = getattr(config, "model_type", None)
    if model_type not in MODEL_TYPES:
        raise unsupported(f"config of model_type {model_type!r} ({type(config).__name__})")
    key = f"{model_type}:{config.to_json_string(use_diff=False)}"
    if key not in _CONFIG_INFO_CACHE:
        _CONFIG_INFO_CACHE[key] = moe_info(meta_model(config))
    return _CONFIG_INFO_CACHE[key]


def meta_model(config) -> torch.nn.Module:
    """The model of `config` on the meta device (no memory, no init): its module shapes, for any size."""
    from transformers import AutoModelForCausalLM
    from transformers.initialization import no_init_weights

    config = copy.deepcopy(config)
    # The kernels do not matter for shapes; avoid availability checks (e.g. flash-attn on a CPU box).
    config._attn_implementation = "eager"
    config._experts_implementation = "eager"
    with torch.device("meta"), no_init_weights():
        return AutoModelForCausalLM.from_config(config)
